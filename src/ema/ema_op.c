/* The per-channel EMA (linseq_ema_problem) in the op table: see optable.h. The template op:
 * forward-only, with a decode step over a pool of states. */
#include "ema/ema.h"
#include "optable/op_shapes.h"

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
