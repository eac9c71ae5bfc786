/* The causal depthwise conv1d (linseq_conv1d_problem) in the op table: see optable.h. */
#include "optable/op_shapes.h"
#include "ssm/ssm_internal.h"

#include <string.h>

typedef linseq_conv1d_problem P;

static const P *conv(const void *p) { return p; }
static int64_t state_rows(const P *p) { return p->cu_seqlens ? p->n_seqs : p->B; }

/* [B,T,D], or [B,D,T] with channel_first (x's dense layout; a strided x is described by
 * x_strides). */
static int shape_token(const void *v, int64_t *d)
{
    const P *p = conv(v);
    return p->channel_first ? ls_dims(d, 3, p->B, p->D, p->T) : ls_dims(d, 3, p->B, p->T, p->D);
}

static int shape_weight(const void *v, int64_t *d)
{
    const P *p = conv(v);
    return p->weight_tap_major ? ls_dims(d, 2, p->W, p->D) : ls_dims(d, 2, p->D, p->W);
}
static int shape_channels(const void *v, int64_t *d) { return ls_dims(d, 1, conv(v)->D); }
static int shape_bias_grad(const void *v, int64_t *d)
{
    return conv(v)->bias ? shape_channels(v, d) : 0;
}

/* The window of the last W-1 inputs; empty (zero-sized) for W = 1. */
static int shape_state(const void *v, int64_t *d)
{
    const P *p = conv(v);
    const int64_t taps = p->W >= 1 ? p->W - 1 : (int64_t)-1; /* -1: refused */
    return p->state_tap_major ? ls_dims(d, 3, state_rows(p), taps, p->D)
                              : ls_dims(d, 3, state_rows(p), p->D, taps);
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_conv1d_forward(p, exec, out[0], out[1]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_conv1d_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_conv1d_backward(p, exec, up[0], up[1], &g);
}

/* README "Benchmarks": W multiply-adds per output. */
static double flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = conv(v);
    return 2.0 * (double)p->W * (double)p->B * (double)p->T * (double)p->D;
}

static void bench_options(void *v)
{
    P *p = v;
    p->activation = LINSEQ_ACT_SILU;
}

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},
    {"T", offsetof(P, T), true, 2048},
    {"D", offsetof(P, D), true, 4096},
    {"W", offsetof(P, W), true, 4},
};

/* "activation": null means none (the op's default is identity). */
static const ls_option_desc options[] = {
    {"activation", "activation", LS_CTYPE_ENUM, offsetof(P, activation), ls_activation_names,
     LINSEQ_ACT_IDENTITY},
    {"channel_first", "channel_first", LS_CTYPE_BOOL, offsetof(P, channel_first), NULL, 0},
    {"state_tap_major", "state_tap_major", LS_CTYPE_BOOL, offsetof(P, state_tap_major), NULL, 0},
    {"weight_tap_major", "weight_tap_major", LS_CTYPE_BOOL, offsetof(P, weight_tap_major), NULL, 0},
};

/* x_strides step over (batch, token, channel). */
static int axes_x(const void *v, int64_t *d)
{
    return ls_dims(d, 3, conv(v)->B, conv(v)->T, conv(v)->D);
}

static const ls_strides_desc strides[] = {
    {"x_strides", "x", offsetof(P, x_strides), axes_x},
};

/* The weight and bias as torch initialises a conv: U(-1/sqrt(W), 1/sqrt(W)); the benchmark
 * draws them at W = 4. */
typedef linseq_conv1d_grads G;
#define WEIGHT_DIMS "[D,W] ([W,D] weight_tap_major)"
#define STATE_DIMS "[N_seq,D,W-1] ([N_seq,W-1,D] state_tap_major)"
static const ls_tensor_desc tensors[] = {
    LS_INPUT("x", x, .required = true, .dims = "[B,T,D]", .shape = shape_token,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("weight", weight, .required = true, .dims = WEIGHT_DIMS, .shape = shape_weight,
             .dist = LS_DIST_UNIFORM, .a = -0.5, .b = 0.5),
    LS_INPUT("bias", bias, .dims = "[D]", .shape = shape_channels, .case_flag = "has_bias",
             .dist = LS_DIST_UNIFORM, .a = -0.5, .b = 0.5, .bench = true),
    LS_INPUT("conv_state", conv_state, .dims = STATE_DIMS, .shape = shape_state,
             .case_flag = "has_state", .dist = LS_DIST_NORMAL, .a = 1),
    LS_OUTPUT("y", 0, .required = true, .dims = "[B,T,D]", .shape = shape_token, .token = true),
    LS_OUTPUT("conv_state_out", 1, .dims = STATE_DIMS, .shape = shape_state,
              .alias_of = "conv_state"),
    LS_UPSTREAM("d_y", 0, "y", .required = true, .dims = "[B,T,D]", .shape = shape_token,
                .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_UPSTREAM("d_conv_state_out", 1, "conv_state_out", .dims = STATE_DIMS, .shape = shape_state,
                .dist = LS_DIST_NORMAL, .a = 1),
    LS_GRAD("dx", dx, "x", .dims = "[B,T,D]", .shape = shape_token, .token = true),
    LS_GRAD("dweight", dweight, "weight", .dims = WEIGHT_DIMS, .shape = shape_weight),
    LS_GRAD("dbias", dbias, "bias", .dims = "[D]", .shape = shape_bias_grad),
    LS_GRAD("dconv_state", dconv_state, "conv_state", .dims = STATE_DIMS, .shape = shape_state),
};

/* The table's decode step: each request's state row holds the W-1 previous inputs per
 * channel and shifts by the new token (linseq_conv1d_decode with state_len W-1, no
 * cache_seqlens), so the generic pool calls reach the conv as every other op with a state. */
static linseq_status decode(const void *v, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out)
{
    const P *p = v;
    return linseq_conv1d_decode(p, exec, pool, n_rows, p->W - 1, rows, NULL, out[0]);
}

static linseq_status decode_rows(const void *v, const linseq_exec *exec, const ls_state_rows *rows,
                                 int64_t n_rows, float *const *out)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_op_decode_pool", &isa);
    return st ? st : ls_conv1d_decode_rows_isa(v, exec, rows, n_rows, out[0], isa);
}

static bool decode_rows_takes(const void *v, linseq_pool_dtype dtype)
{
    return ls_conv1d_decode_rows_take(v, dtype);
}

const ls_op ls_op_conv1d = {
    LS_OP_STRUCTS(linseq_conv1d_problem, linseq_conv1d_grads),
    LS_OP_OPTIONS(options),
    LS_OP_VARLEN(linseq_conv1d_problem),
    .strides = strides,
    .n_strides = LS_COUNT(strides),
    .name = "causal_conv1d",
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = bench_options,
    .bench_name = "conv",
    .decode = decode,
    .decode_rows = decode_rows,
    .decode_rows_takes = decode_rows_takes,
    .decode_state = "conv_state",
    .decode_state_out = "conv_state_out",
};
