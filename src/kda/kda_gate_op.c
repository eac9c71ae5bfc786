/* The standalone KDA gate (linseq_kda_gate_problem) in the op table: see optable.h. */
#include "kda/kda_op.h"
#include "optable/op_shapes.h"

#include <string.h>

typedef linseq_kda_gate_problem P;

static const P *gate(const void *p) { return p; }
static bool per_channel(const P *p) { return p->decay == LINSEQ_DECAY_PER_CHANNEL; }

/* g_raw and g: [B,T,H,K] per channel, [B,T,H] per head. */
static int shape_g(const void *v, int64_t *d)
{
    const P *p = gate(v);
    return per_channel(p) ? ls_dims(d, 4, p->B, p->T, p->H, p->K) : ls_dims(d, 3, p->B, p->T, p->H);
}

static int shape_heads(const void *v, int64_t *d) { return ls_dims(d, 1, gate(v)->H); }

static int shape_dt_bias(const void *v, int64_t *d)
{
    const P *p = gate(v);
    return ls_dims(d, 1, per_channel(p) ? ls_mul_sat(p->H, p->K) : p->H);
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_kda_gate_forward(p, exec, out[0]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_kda_gate_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_kda_gate_backward(p, exec, up[0], &g);
}

/* README "Benchmarks": 2 per element of g (bias add, scale by -exp(A_log)). */
static double flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    int64_t d[LS_OP_MAX_DIMS];
    const int n = shape_g(v, d);
    double count = 1.0;
    for (int i = 0; i < n; i++) count *= (double)d[i];
    return 2.0 * count;
}

static void bench_options(void *v)
{
    P *p = v;
    p->decay = LINSEQ_DECAY_PER_CHANNEL;
}

/* K is ignored per head (the reference data writes "K": null there). */
static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},
    {"T", offsetof(P, T), true, 2048},
    {"H", offsetof(P, H), true, 16},
    {"K", offsetof(P, K), false, 128},
};

static const ls_enum_name decay_names[] = {
    {"per_head", LINSEQ_DECAY_PER_HEAD}, {"per_channel", LINSEQ_DECAY_PER_CHANNEL}, {NULL, 0}};

static const ls_option_desc options[] = {
    {"decay", "decay", LS_CTYPE_ENUM, offsetof(P, decay), decay_names, LS_ENUM_REQUIRED},
    {"lower_bound", "lower_bound", LS_CTYPE_F32, offsetof(P, lower_bound), NULL, 0},
};

#define G_DIMS "[B,T,H,K] per channel, [B,T,H] per head"
#define BIAS_DIMS "[H*K] per channel, [H] per head"

typedef linseq_kda_gate_grads G;
static const ls_tensor_desc tensors[] = {
    LS_INPUT("g_raw", g_raw, .required = true, .dims = G_DIMS, .shape = shape_g,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("A_log", A_log, .dims = "[H]", .shape = shape_heads, .dist = LS_DIST_LOG_OF_UNIFORM,
             .a = 1, .b = 16, .bench = true),
    LS_INPUT("dt_bias", dt_bias, .dims = BIAS_DIMS, .shape = shape_dt_bias,
             .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1, .bench = true),
    LS_OUTPUT("g", 0, .required = true, .dims = G_DIMS, .shape = shape_g, .token = true),
    LS_UPSTREAM("d_g", 0, "g", .required = true, .dims = G_DIMS, .shape = shape_g,
                .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_GRAD("dg_raw", dg_raw, "g_raw", .dims = G_DIMS, .shape = shape_g, .token = true),
    LS_GRAD("dA_log", dA_log, "A_log", .dims = "[H]", .shape = shape_heads),
    LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = BIAS_DIMS, .shape = shape_dt_bias),
};

const ls_op ls_op_kda_gate = {
    LS_OP_STRUCTS(linseq_kda_gate_problem, linseq_kda_gate_grads),
    LS_OP_OPTIONS(options),
    .name = "kda_gate",
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = bench_options,
    .bench_name = "gate",
};
