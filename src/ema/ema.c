/* linseq_ema_forward and linseq_ema_decode: validation through the op's description
 * (below), then the kernel of ema_simd.c over work items (request, block of
 * EMA_SPAN channels). Each item's arithmetic is the same whichever thread runs it, so results
 * are bitwise identical for every thread count. */
#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "ema/ema.h"
#include "optable/check.h"
#include "optable/op_shapes.h"

/* ---- the op's description (optable.h): sizes, tensors, calls ---------------------------- */

typedef linseq_ema_problem P;

static const P *ema(const void *p) { return p; }

static int shape_token(const void *v, int64_t *d)
{
    return ls_dims(d, 3, ema(v)->B, ema(v)->T, ema(v)->D);
}
static int shape_channels(const void *v, int64_t *d) { return ls_dims(d, 1, ema(v)->D); }
static int shape_state(const void *v, int64_t *d) { return ls_dims(d, 2, ema(v)->B, ema(v)->D); }

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ema_forward(p, exec, out[0], out[1]);
}

static linseq_status decode(const void *v, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out)
{
    return linseq_ema_decode(v, exec, pool, n_rows, rows, out[0]);
}

/* README "Benchmarks": a multiply, a multiply-add and 1 - a per output. */
static double flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = ema(v);
    return 3.0 * (double)p->B * (double)p->T * (double)p->D;
}

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 8},
    {"T", offsetof(P, T), true, 2048},
    {"D", offsetof(P, D), true, 4096},
};

/* a: decays of moving averages that remember 2 to 100 tokens. */
static const ls_tensor_desc tensors[] = {
    LS_INPUT("x", x, .required = true, .dims = "[B,T,D]", .shape = shape_token,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("a", a, .required = true, .dims = "[D]", .shape = shape_channels,
             .dist = LS_DIST_UNIFORM, .a = 0.5, .b = 0.99, LS_VALUES_IN(0, 1)),
    LS_INPUT("h0", h0, .dims = "[B,D]", .shape = shape_state, .case_flag = "has_h0",
             .dist = LS_DIST_NORMAL, .a = 1),
    LS_OUTPUT("y", 0, .required = true, .dims = "[B,T,D]", .shape = shape_token, .token = true),
    LS_OUTPUT("hT", 1, .dims = "[B,D]", .shape = shape_state, .alias_of = "h0"),
};

const ls_op ls_op_ema = {
    LS_OP_STRUCTS_FORWARD_ONLY(linseq_ema_problem),
    .name = "ema",
    .forward = forward,
    .flops = flops,
    .decode = decode,
    .decode_state = "h0",
    .decode_state_out = "hT",
};

/* ---- the entry points ------------------------------------------------------------------ */

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
