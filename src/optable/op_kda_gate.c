/* The standalone KDA gate (linseq_kda_gate_problem) in the op table: see optable.h. */
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

#define GRAD(name, field, of, dims, shape)                                                         \
    {                                                                                              \
        name, LS_ROLE_GRAD, #field, offsetof(linseq_kda_gate_grads, field), false, dims, shape,    \
            NULL, of, LS_DIST_ZERO, 0, 0, false                                                    \
    }
#define G_DIMS "[B,T,H,K] per channel, [B,T,H] per head"
#define BIAS_DIMS "[H*K] per channel, [H] per head"

static const ls_tensor_desc tensors[] = {
    {"g_raw", LS_ROLE_INPUT, "g_raw", offsetof(P, g_raw), true, G_DIMS, shape_g, NULL, NULL,
     LS_DIST_NORMAL, 1, 0, false},
    {"A_log", LS_ROLE_INPUT, "A_log", offsetof(P, A_log), false, "[H]", shape_heads, NULL, NULL,
     LS_DIST_LOG_OF_UNIFORM, 1, 16, true},
    {"dt_bias", LS_ROLE_INPUT, "dt_bias", offsetof(P, dt_bias), false, BIAS_DIMS, shape_dt_bias,
     NULL, NULL, LS_DIST_INV_SOFTPLUS_DT, 1e-3, 1e-1, true},
    {"g", LS_ROLE_OUTPUT, NULL, 0, true, G_DIMS, shape_g, NULL, NULL, LS_DIST_ZERO, 0, 0, false},
    {"d_g", LS_ROLE_UPSTREAM, NULL, 0, true, G_DIMS, shape_g, NULL, "g", LS_DIST_NORMAL, 1, 0,
     false},
    GRAD("dg_raw", dg_raw, "g_raw", G_DIMS, shape_g),
    GRAD("dA_log", dA_log, "A_log", "[H]", shape_heads),
    GRAD("ddt_bias", ddt_bias, "dt_bias", BIAS_DIMS, shape_dt_bias),
};

const ls_op ls_op_kda_gate = {
    LS_OP_STRUCTS(linseq_kda_gate_problem, linseq_kda_gate_grads),
    .name = "kda_gate",
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = bench_options,
    .bench_name = "gate",
};
