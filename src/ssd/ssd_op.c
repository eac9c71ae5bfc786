/* The SSD op (linseq_ssd_problem) and its segment summary in the op table: see optable.h. The
 * two share the problem and grads structs, the sizes, options and shapes, and most tensor
 * rows, kept once here (SSD_INPUTS, SSD_GRADS); the summary has no h0 (it starts from zeros),
 * so its h0 and dh0 rows are empty, and its outputs are P and R. The entry points are ssd.c's
 * and ssd_segment.c's. */
#include <float.h>
#include <string.h>

#include "optable/op_shapes.h"
#include "ssd/ssd.h"

typedef linseq_ssd_problem P;
typedef linseq_ssd_grads G;

static const P *ssd(const void *p) { return p; }

/* ---- shapes ------------------------------------------------------------------------------ */

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
    return ls_dims(d, 4, p->B, p->T, ls_ssd_groups(p), p->N);
}
static int shape_d_skip(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    return p->D_per_channel ? ls_dims(d, 2, p->H, p->P) : ls_dims(d, 1, p->H);
}
/* Gradients of optional inputs exist only with them (dh0 also without h0: at zeros). */
static int shape_d_skip_grad(const void *v, int64_t *d)
{
    return ssd(v)->D_skip ? shape_d_skip(v, d) : 0;
}
static int shape_z_grad(const void *v, int64_t *d) { return ssd(v)->z ? shape_hp(v, d) : 0; }
static int shape_dt_bias(const void *v, int64_t *d)
{
    return ssd(v)->dt_softplus ? shape_heads(v, d) : 0;
}
static int shape_state(const void *v, int64_t *d)
{
    const P *p = ssd(v);
    const int64_t rows = ls_ssd_state_rows(p);
    return p->state_n_first ? ls_dims(d, 4, rows, p->H, p->N, p->P)
                            : ls_dims(d, 4, rows, p->H, p->P, p->N);
}
/* The summary's P: one scalar per sequence and head. */
static int shape_transition(const void *v, int64_t *d)
{
    return ls_dims(d, 2, ls_ssd_state_rows(ssd(v)), ssd(v)->H);
}

/* ---- sizes, options, FLOPs --------------------------------------------------------------- */

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},   {"T", offsetof(P, T), true, 512},
    {"H", offsetof(P, H), true, 48},  {"P", offsetof(P, P), true, 64},
    {"N", offsetof(P, N), true, 128}, {"G", offsetof(P, G), false, 0},
};

static const ls_option_desc options[] = {
    {"dt_softplus", "dt_softplus", LS_CTYPE_BOOL, offsetof(P, dt_softplus), NULL, 0},
    {"D_per_channel", "D_per_channel", LS_CTYPE_BOOL, offsetof(P, D_per_channel), NULL, 0},
    {"state_n_first", "state_n_first", LS_CTYPE_BOOL, offsetof(P, state_n_first), NULL, 0},
    {"dt_min", "dt_min", LS_CTYPE_F32, offsetof(P, dt_min), NULL, 0},
    {"dt_max", "dt_max", LS_CTYPE_F32, offsetof(P, dt_max), NULL, 0},
};

/* README "Benchmarks": per token and head, the state update and read-out (2 P N each) of the
 * recurrence; the chunked form does more (the scores) to run in matrix products. The summary
 * counts the same: R comes from the forward's state updates. */
double ls_ssd_flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = ssd(v);
    return 4.0 * (double)p->B * (double)p->T * (double)p->H * (double)p->P * (double)p->N;
}

static void bench_options(void *v) { ((P *)v)->G = 1; }

/* ---- the rows both descriptions hold ------------------------------------------------------ */

#define STATE_DIMS "[N_seq,H,P,N] ([N_seq,H,N,P] state_n_first)"
#define NO_STATE_DIMS "none (must be NULL)"

/* Every input in table order, with the op's own h0 row; bench_: whether a benchmark passes D
 * and z. A: mamba's -exp(A_log) with A_log = log(U(1, 16)); dt: its usual range. */
#define SSD_INPUTS(bench_, h0_row)                                                                 \
    LS_INPUT("x", x, .required = true, .dims = "[B,T,H,P]", .shape = shape_hp,                     \
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),                                       \
        LS_INPUT("dt", dt, .required = true, .dims = "[B,T,H]", .shape = shape_dt,                 \
                 .dist = LS_DIST_LOG_UNIFORM, .a = 1e-3, .b = 1e-1, .token = true),                \
        LS_INPUT("A", A, .required = true, .dims = "[H]", .shape = shape_heads,                    \
                 .dist = LS_DIST_UNIFORM, .a = -16, .b = -1, LS_VALUES_IN(-FLT_MAX, 0)),           \
        LS_INPUT("B", B_proj, .required = true, .dims = "[B,T,G,N]", .shape = shape_bc,            \
                 .dist = LS_DIST_NORMAL, .a = 1, .token = true),                                   \
        LS_INPUT("C", C_proj, .required = true, .dims = "[B,T,G,N]", .shape = shape_bc,            \
                 .dist = LS_DIST_NORMAL, .a = 1, .token = true),                                   \
        LS_INPUT("D", D_skip, .dims = "[H] ([H,P] D_per_channel)", .shape = shape_d_skip,          \
                 .case_flag = "has_D", .dist = LS_DIST_UNIFORM, .a = 1, .b = 1, .bench = bench_),  \
        LS_INPUT("z", z, .dims = "[B,T,H,P]", .shape = shape_hp, .case_flag = "has_z",             \
                 .dist = LS_DIST_NORMAL, .a = 1, .bench = bench_, .token = true),                  \
        h0_row,                                                                                    \
        LS_INPUT("dt_bias", dt_bias, .dims = "[H]", .shape = shape_dt_bias,                        \
                 .case_flag = "has_dt_bias", .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3,           \
                 .b = 1e-1)

/* Every gradient in table order, with the op's own dh0 row. */
#define SSD_GRADS(dh0_row)                                                                         \
    LS_GRAD("dx", dx, "x", .dims = "[B,T,H,P]", .shape = shape_hp, .token = true),                 \
        LS_GRAD("ddt", ddt, "dt", .dims = "[B,T,H]", .shape = shape_dt, .token = true),            \
        LS_GRAD("dA", dA, "A", .dims = "[H]", .shape = shape_heads),                               \
        LS_GRAD("dB", dB_proj, "B", .dims = "[B,T,G,N]", .shape = shape_bc, .token = true),        \
        LS_GRAD("dC", dC_proj, "C", .dims = "[B,T,G,N]", .shape = shape_bc, .token = true),        \
        LS_GRAD("dD", dD_skip, "D", .dims = "[H] ([H,P] D_per_channel)",                           \
                .shape = shape_d_skip_grad),                                                       \
        LS_GRAD("dz", dz, "z", .dims = "[B,T,H,P]", .shape = shape_z_grad, .token = true),         \
        dh0_row, LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = "[H]", .shape = shape_dt_bias)

/* ---- the SSD op ---------------------------------------------------------------------------- */

static linseq_status ssd_forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ssd_forward(p, exec, out[0], out[1]);
}

static linseq_status ssd_backward(const void *p, const linseq_exec *exec, const float *const *up,
                                  const void *grads)
{
    linseq_ssd_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_ssd_backward(p, exec, up[0], up[1], &g);
}

static linseq_status ssd_decode(const void *v, const linseq_exec *exec, float *pool, int64_t n_rows,
                                const int64_t *rows, float *const *out)
{
    return linseq_ssd_decode(v, exec, pool, n_rows, rows, out[0]);
}

static linseq_status ssd_decode_rows(const void *v, const linseq_exec *exec,
                                     const ls_state_rows *rows, int64_t n_rows, float *const *out)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_op_decode_pool", &isa);
    return st ? st : ls_ssd_decode_rows_isa(v, exec, rows, n_rows, out[0], isa);
}

static const ls_tensor_desc ssd_tensors[] = {
    SSD_INPUTS(true, LS_INPUT("h0", h0, .dims = STATE_DIMS, .shape = shape_state,
                              .case_flag = "has_h0", .dist = LS_DIST_NORMAL, .a = 0.5)),
    LS_OUTPUT("y", 0, .required = true, .dims = "[B,T,H,P]", .shape = shape_hp, .token = true),
    LS_OUTPUT("hT", 1, .dims = STATE_DIMS, .shape = shape_state, .alias_of = "h0"),
    LS_UPSTREAM("d_y", 0, "y", .required = true, .dims = "[B,T,H,P]", .shape = shape_hp,
                .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_UPSTREAM("d_hT", 1, "hT", .dims = STATE_DIMS, .shape = shape_state, .case_flag = "has_dhT",
                .dist = LS_DIST_NORMAL, .a = 1),
    SSD_GRADS(LS_GRAD("dh0", dh0, "h0", .dims = STATE_DIMS, .shape = shape_state)),
};

const ls_op ls_op_ssd = {
    LS_OP_STRUCTS_OF(linseq_ssd_problem, linseq_ssd_grads, sizes, options, ssd_tensors),
    LS_OP_VARLEN(linseq_ssd_problem),
    .name = "ssd",
    .forward = ssd_forward,
    .backward = ssd_backward,
    .flops = ls_ssd_flops,
    .bench_options = bench_options,
    .bench_fwdbwd = true,
    .decode = ssd_decode,
    .decode_rows = ssd_decode_rows,
    .decode_state = "h0",
    .decode_state_out = "hT",
    .has_modes = true,
};

/* ---- the segment summary ------------------------------------------------------------------- */

static linseq_status segment_forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ssd_segment_forward(p, exec, out[0], out[1]);
}

static linseq_status segment_backward(const void *p, const linseq_exec *exec,
                                      const float *const *up, const void *grads)
{
    linseq_ssd_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_ssd_segment_backward(p, exec, up[0], up[1], &g);
}

/* The summary ignores D and z (R is a state), so a benchmark leaves them out. */
static const ls_tensor_desc segment_tensors[] = {
    SSD_INPUTS(false, LS_INPUT("h0", h0, .dims = NO_STATE_DIMS, .shape = ls_shape_none)),
    LS_OUTPUT("P", 0, .required = true, .dims = "[N_seq,H]", .shape = shape_transition),
    LS_OUTPUT("R", 1, .dims = STATE_DIMS, .shape = shape_state),
    LS_UPSTREAM("d_P", 0, "P", .dims = "[N_seq,H]", .shape = shape_transition,
                .dist = LS_DIST_NORMAL, .a = 1),
    LS_UPSTREAM("d_R", 1, "R", .dims = STATE_DIMS, .shape = shape_state, .dist = LS_DIST_NORMAL,
                .a = 1),
    SSD_GRADS(LS_GRAD("dh0", dh0, "h0", .dims = NO_STATE_DIMS, .shape = ls_shape_none)),
};

const ls_op ls_op_ssd_segment = {
    LS_OP_STRUCTS_OF(linseq_ssd_problem, linseq_ssd_grads, sizes, options, segment_tensors),
    LS_OP_VARLEN(linseq_ssd_problem),
    .name = "ssd_segment",
    .entry_stem = "linseq_ssd_segment",
    .forward = segment_forward,
    .backward = segment_backward,
    .flops = ls_ssd_flops,
    .bench_options = bench_options,
    .bench_fwdbwd = true,
    .has_modes = true,
};
