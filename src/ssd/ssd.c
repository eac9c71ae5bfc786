/* linseq_ssd_forward and linseq_ssd_decode: validation through the op's description (below),
 * then the kernels of ssd_simd.c over work items (sequence, head). Each item's arithmetic is
 * the same whichever thread runs it, so results are bitwise identical for every thread
 * count. */
#include <math.h>
#include <stdlib.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "optable/check.h"
#include "optable/op_shapes.h"
#include "ssd/ssd.h"

/* ---- the op's description (optable.h): sizes, tensors, calls ---------------------------- */

typedef linseq_ssd_problem P;

static const P *ssd(const void *p) { return p; }
static int64_t state_rows(const P *p) { return p->cu_seqlens ? p->n_seqs : p->B; }
static int64_t groups(const P *p) { return p->G ? p->G : 1; }

static int shape_hp(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    return ls_dims(d, 4, p->B, p->T, p->H, p->P);
}
static int shape_dt(const void *v, int64_t *d)
{
    return ls_dims(d, 3, ssd(v)->B, ssd(v)->T, ssd(v)->H);
}
static int shape_heads(const void *v, int64_t *d) { return ls_dims(d, 1, ssd(v)->H); }
static int shape_bc(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    return ls_dims(d, 4, p->B, p->T, groups(p), p->N);
}
static int shape_d_skip(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    return p->D_per_channel ? ls_dims(d, 2, p->H, p->P) : ls_dims(d, 1, p->H);
}
static int shape_dt_bias(const void *v, int64_t *d)
{
    return ssd(v)->dt_softplus ? shape_heads(v, d) : 0;
}
static int shape_state(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    return p->state_n_first ? ls_dims(d, 4, state_rows(p), p->H, p->N, p->P)
                            : ls_dims(d, 4, state_rows(p), p->H, p->P, p->N);
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ssd_forward(p, exec, out[0], out[1]);
}

static linseq_status decode(const void *v, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out)
{
    return linseq_ssd_decode(v, exec, pool, n_rows, rows, out[0]);
}

/* README "Benchmarks": per token and head, the state update and read-out (2 P N each) of the
 * recurrence; the chunked form does more (the scores) to run in matrix products. */
static double flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = ssd(v);
    return 4.0 * (double)p->B * (double)p->T * (double)p->H * (double)p->P * (double)p->N;
}

static void bench_options(void *v) { ((P *)v)->G = 1; }

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},  {"T", offsetof(P, T), true, 512},
    {"H", offsetof(P, H), true, 48}, {"P", offsetof(P, P), true, 64},
    {"N", offsetof(P, N), true, 128}, {"G", offsetof(P, G), false, 0},
};

static const ls_option_desc options[] = {
    {"dt_softplus", "dt_softplus", LS_CTYPE_BOOL, offsetof(P, dt_softplus), NULL, 0},
    {"D_per_channel", "D_per_channel", LS_CTYPE_BOOL, offsetof(P, D_per_channel), NULL, 0},
    {"state_n_first", "state_n_first", LS_CTYPE_BOOL, offsetof(P, state_n_first), NULL, 0},
    {"dt_min", "dt_min", LS_CTYPE_F32, offsetof(P, dt_min), NULL, 0},
    {"dt_max", "dt_max", LS_CTYPE_F32, offsetof(P, dt_max), NULL, 0},
};

/* A: mamba's -exp(A_log) with A_log = log(U(1, 16)); dt: its usual range. */
static const ls_tensor_desc tensors[] = {
    LS_INPUT("x", x, .required = true, .dims = "[B,T,H,P]", .shape = shape_hp,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("dt", dt, .required = true, .dims = "[B,T,H]", .shape = shape_dt,
             .dist = LS_DIST_LOG_UNIFORM, .a = 1e-3, .b = 1e-1, .token = true),
    LS_INPUT("A", A, .required = true, .dims = "[H]", .shape = shape_heads,
             .dist = LS_DIST_UNIFORM, .a = -16, .b = -1, LS_VALUES_IN(-INFINITY, 0)),
    LS_INPUT("B", B_proj, .required = true, .dims = "[B,T,G,N]", .shape = shape_bc,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("C", C_proj, .required = true, .dims = "[B,T,G,N]", .shape = shape_bc,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("D", D_skip, .dims = "[H] ([H,P] D_per_channel)", .shape = shape_d_skip,
             .case_flag = "has_D", .dist = LS_DIST_UNIFORM, .a = 1, .b = 1, .bench = true),
    LS_INPUT("z", z, .dims = "[B,T,H,P]", .shape = shape_hp, .case_flag = "has_z",
             .dist = LS_DIST_NORMAL, .a = 1, .bench = true, .token = true),
    LS_INPUT("h0", h0, .dims = "[N_seq,H,P,N] ([N_seq,H,N,P] state_n_first)",
             .shape = shape_state, .case_flag = "has_h0", .dist = LS_DIST_NORMAL, .a = 0.5),
    LS_INPUT("dt_bias", dt_bias, .dims = "[H]", .shape = shape_dt_bias,
             .case_flag = "has_dt_bias", .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1),
    LS_OUTPUT("y", 0, .required = true, .dims = "[B,T,H,P]", .shape = shape_hp, .token = true),
    LS_OUTPUT("hT", 1, .dims = "[N_seq,H,P,N] ([N_seq,H,N,P] state_n_first)",
              .shape = shape_state, .alias_of = "h0"),
};

const ls_op ls_op_ssd = {
    LS_OP_STRUCTS_FORWARD_ONLY(linseq_ssd_problem),
    LS_OP_OPTIONS(options),
    LS_OP_VARLEN(linseq_ssd_problem),
    .name = "ssd",
    .forward = forward,
    .flops = flops,
    .bench_options = bench_options,
    .decode = decode,
    .decode_state = "h0",
    .decode_state_out = "hT",
    .has_modes = true,
};

/* ---- the entry points ------------------------------------------------------------------ */

/* The problem (its description's checks), its own rules and its input tensors appended to
 * `a`: run first by both entry points, so decode accepts exactly the problems the forward
 * accepts. */
static linseq_status check_problem(ls_args *a, const linseq_ssd_problem *p,
                                   const linseq_exec *exec)
{
    linseq_status st = ls_op_check_problem(a->fn, &ls_op_ssd, p, exec, false);
    if (st) return st;
    if (groups(p) > p->H || p->H % groups(p) != 0)
        return ls_fail(a->fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "G = %lld must divide H = %lld (each group's B and C serve H / G heads)",
                       (long long)p->G, (long long)p->H);
    if (p->dt_bias && !p->dt_softplus)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_bias is given without dt_softplus; expected NULL (the bias is added "
                       "in the kernel only before its softplus)");
    if (!(isfinite(p->dt_min) && p->dt_max >= p->dt_min && !isnan(p->dt_max) &&
          (p->dt_max > p->dt_min || (p->dt_min == 0 && p->dt_max == 0))))
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "dt_min = %g, dt_max = %g: expected dt_min < dt_max (dt_max may be "
                       "+inf), or both 0 for no clamp",
                       (double)p->dt_min, (double)p->dt_max);
    return ls_op_add_tensors(a, &ls_op_ssd, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
}

/* After the table is validated: the CPU only, cu_seqlens' offsets, every A <= 0. */
static linseq_status check_values(const char *fn, const linseq_ssd_problem *p,
                                  const linseq_exec *exec)
{
    if (ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED, "exec->device is CUDA; %s runs on the CPU only",
                       fn);
    linseq_status st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    return ls_op_check_values(fn, &ls_op_ssd, p, exec);
}

static linseq_status run(const char *fn, ssd_plan *pl, const linseq_ssd_problem *p,
                         const linseq_exec *exec, ls_isa isa, bool decode)
{
    *pl = (ssd_plan){.T = p->T, .H = p->H, .P = p->P, .N = p->N, .G = groups(p),
                     .cu = p->cu_seqlens, .x = p->x, .dt = p->dt, .A = p->A, .Bp = p->B_proj,
                     .Cp = p->C_proj, .D = p->D_skip, .z = p->z, .dt_bias = p->dt_bias,
                     .y = pl->y, .s0 = pl->s0, .sT = pl->sT, .rows = pl->rows,
                     .dt_softplus = p->dt_softplus, .D_per_channel = p->D_per_channel,
                     .n_first = p->state_n_first,
                     .chunked = !decode && (!exec || exec->mode != LINSEQ_MODE_RECURRENT),
                     .chunk = exec && exec->chunk_size ? exec->chunk_size : SSD_DEFAULT_CHUNK,
                     .dt_min = p->dt_min, .dt_max = p->dt_max};
    const int64_t n_items = state_rows(p) * p->H;
    const int n_threads = ls_resolve_threads(exec, n_items, flops(p, exec));
    pl->scratch_floats = ssd_scratch_floats(p->P, p->N, pl->chunked, pl->chunk);
    linseq_status st = ls_alloc_blocks(fn, (size_t)pl->scratch_floats * sizeof(float), n_threads,
                                       (void **)&pl->scratch);
    if (st) return st;
    ls_item_fn item = LS_ISA_PICK(isa, ls_ssd_item);
    /* decode's items cost the same, and a thread keeps its pool rows in its cache */
    if (decode)
        ls_parallel_for_static(n_items, n_threads, item, pl);
    else
        ls_parallel_for(n_items, n_threads, item, pl);
    free(pl->scratch);
    return LINSEQ_OK;
}

linseq_status ls_ssd_forward_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *y,
                                 float *hT, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_forward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    float *const out[] = {y, hT};
    if ((st = ls_op_add_tensors(&a, &ls_op_ssd, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) || (st = check_values(a.fn, p, exec))) return st;
    ssd_plan pl = {.y = y, .s0 = p->h0, .sT = hT};
    return run(a.fn, &pl, p, exec, isa, false);
}

linseq_status ls_ssd_decode_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y,
                                ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_ssd_decode"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    float *const out[] = {y, NULL}; /* the state is the pool's */
    if ((st = ls_op_add_decode(&a, &ls_op_ssd, p, state, n_state_rows, state_rows, out,
                               ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ls_args_validate(&a)) || (st = check_values(a.fn, p, exec))) return st;
    if ((st = ls_op_check_decode_rows(a.fn, &ls_op_ssd, p, n_state_rows, state_rows))) return st;
    ssd_plan pl = {.y = y, .s0 = state, .sT = state, .rows = state_rows};
    return run(a.fn, &pl, p, exec, isa, true);
}

linseq_status linseq_ssd_forward(const linseq_ssd_problem *p, const linseq_exec *exec, float *y,
                                 float *hT)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_forward", &isa);
    return st ? st : ls_ssd_forward_isa(p, exec, y, hT, isa);
}

linseq_status linseq_ssd_decode(const linseq_ssd_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_ssd_decode", &isa);
    return st ? st : ls_ssd_decode_isa(p, exec, state, n_state_rows, state_rows, y, isa);
}
