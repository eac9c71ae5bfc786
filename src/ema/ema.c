/* linseq_ema_forward and linseq_ema_decode: validation through the op's description
 * (ema_op.c), then the kernel of ema_simd.c over work items (request, block of
 * EMA_SPAN channels). Each item's arithmetic is the same whichever thread runs it, so results
 * are bitwise identical for every thread count. */
#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "ema/ema.h"
#include "optable/check.h"

/* The problem (its description's checks) and its input tensors appended to `a`: run first by
 * both entry points, so decode accepts exactly the problems the forward accepts. */
static linseq_status check_problem(ls_args *a, const linseq_ema_problem *p, const linseq_exec *exec)
{
    linseq_status st = ls_op_check_problem(a->fn, &ls_op_ema, p, exec, false);
    return st ? st : ls_op_add_tensors(a, &ls_op_ema, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
}

/* After the table is validated (so a is readable): the CPU only, every decay in [0, 1] (the
 * description's LS_VALUES_IN). */
static linseq_status check_values(const char *fn, const linseq_ema_problem *p,
                                  const linseq_exec *exec)
{
    if (ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "exec->device is CUDA; %s runs on the CPU only",
                       fn);
    return ls_op_check_values(fn, &ls_op_ema, p, exec);
}

static void run(ema_plan *pl, const linseq_ema_problem *p, const linseq_exec *exec, ls_isa isa,
                bool decode)
{
    pl->T = p->T, pl->D = p->D, pl->x = p->x, pl->a = p->a;
    pl->n_blocks = (p->D + EMA_SPAN - 1) / EMA_SPAN;
    const int64_t n_items = p->B * pl->n_blocks;
    const int n_threads =
        ls_resolve_threads(exec, n_items, 3.0 * (double)p->B * (double)p->T * (double)p->D);
    ls_item_fn fn = LS_ISA_PICK(isa, ls_ema_item);
    /* decode's items cost the same, and a thread keeps its pool rows in its cache */
    if (decode)
        ls_parallel_for_static(n_items, n_threads, fn, pl);
    else
        ls_parallel_for(n_items, n_threads, fn, pl);
}

linseq_status ls_ema_forward_isa(const linseq_ema_problem *p, const linseq_exec *exec, float *y,
                                 float *hT, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ema_forward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    float *const out[] = {y, hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ema, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) || (st = check_values(a.fn, p, exec))) return st;
    ema_plan pl = {.y = y, .s0 = p->h0, .sT = hT};
    run(&pl, p, exec, isa, false);
    return LINSEQ_OK;
}

linseq_status ls_ema_decode_isa(const linseq_ema_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y,
                                ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ema_decode"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    float *const out[] = {y, NULL}; /* the state is the pool's */
    if ((st = ls_op_add_decode(&a, &ls_op_ema, p, state, n_state_rows, state_rows, out,
                               ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) || (st = check_values(a.fn, p, exec))) return st;
    if ((st = ls_op_check_decode_rows(a.fn, &ls_op_ema, p, n_state_rows, state_rows))) return st;
    ema_plan pl = {.y = y, .s0 = state, .sT = state, .rows = state_rows};
    run(&pl, p, exec, isa, true);
    return LINSEQ_OK;
}

linseq_status linseq_ema_forward(const linseq_ema_problem *p, const linseq_exec *exec, float *y,
                                 float *hT)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ema_forward", &isa);
    return st ? st : ls_ema_forward_isa(p, exec, y, hT, isa);
}

linseq_status linseq_ema_decode(const linseq_ema_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ema_decode", &isa);
    return st ? st : ls_ema_decode_isa(p, exec, state, n_state_rows, state_rows, y, isa);
}
