/* The KDA segment summary (linseq_kda_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are KDA's; h0 and dh0 do not exist here (the
 * summary starts from zeros), so their shapes are empty. */
#include "optable/op_shapes.h"

#include <string.h>

typedef linseq_kda_problem P;

static const P *kda(const void *p) { return p; }
static int64_t value_heads(const P *p) { return p->HV ? p->HV : p->H; }
static int64_t state_rows(const P *p) { return p->cu_seqlens ? p->n_seqs : p->B; }

static int shape_qk(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return ls_dims(d, 4, p->B, p->T, p->H, p->K);
}

static int shape_token_value(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return ls_dims(d, 4, p->B, p->T, value_heads(p), p->V);
}

static int shape_beta(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return ls_dims(d, 3, p->B, p->T, value_heads(p));
}

static int shape_g(const void *v, int64_t *d)
{
    const P *p = kda(v);
    if (p->decay == LINSEQ_DECAY_PER_CHANNEL)
        return ls_dims(d, 4, p->B, p->T, value_heads(p), p->K);
    if (p->decay == LINSEQ_DECAY_PER_HEAD) return ls_dims(d, 3, p->B, p->T, value_heads(p));
    return 0;
}

static int shape_none(const void *v, int64_t *d)
{
    (void)v, (void)d;
    return 0;
}

static int shape_transition(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return ls_dims(d, 4, state_rows(p), value_heads(p), p->K, p->K);
}

static int shape_state(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return p->state_v_first ? ls_dims(d, 4, state_rows(p), value_heads(p), p->V, p->K)
                            : ls_dims(d, 4, state_rows(p), value_heads(p), p->K, p->V);
}

static int shape_a_log(const void *v, int64_t *d)
{
    const P *p = kda(v);
    return p->gate_in_kernel ? ls_dims(d, 1, value_heads(p)) : 0;
}

static int shape_dt_bias(const void *v, int64_t *d)
{
    const P *p = kda(v);
    if (!p->gate_in_kernel) return 0;
    const bool per_channel = p->decay == LINSEQ_DECAY_PER_CHANNEL;
    return ls_dims(d, 1, per_channel ? ls_mul_sat(value_heads(p), p->K) : value_heads(p));
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_kda_segment_forward(p, exec, out[0], out[1]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_kda_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_kda_segment_backward(p, exec, up[0], up[1], &g);
}

/* Per token and value head: the solve and the advance over V + K columns (4K(V+K)), their
 * in-chunk substitution (C(V+K)) and the chunk's K-wide scores (2CK), C = min(chunk, T). */
static double flops(const void *v, const linseq_exec *exec)
{
    const P *p = kda(v);
    const double K = (double)p->K, V = (double)p->V;
    const int chunk = exec && exec->chunk_size ? exec->chunk_size : 64;
    const double C = (double)(chunk < p->T ? chunk : p->T);
    const double tokens_heads = (double)p->B * (double)p->T * (double)value_heads(p);
    return tokens_heads * (4.0 * K * (V + K) + C * (V + K) + 2.0 * C * K);
}

static void bench_options(void *v)
{
    P *p = v;
    p->decay = LINSEQ_DECAY_PER_CHANNEL;
    p->qk_l2norm = true;
}

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},   {"T", offsetof(P, T), true, 2048},
    {"H", offsetof(P, H), true, 16},  {"HV", offsetof(P, HV), false, 0},
    {"K", offsetof(P, K), true, 128}, {"V", offsetof(P, V), true, 128},
};

static const ls_enum_name decay_names[] = {{"none", LINSEQ_DECAY_NONE},
                                           {"per_head", LINSEQ_DECAY_PER_HEAD},
                                           {"per_channel", LINSEQ_DECAY_PER_CHANNEL},
                                           {NULL, 0}};

static const ls_option_desc options[] = {
    {"decay", "decay", LS_CTYPE_ENUM, offsetof(P, decay), decay_names, LINSEQ_DECAY_NONE},
    {"scale", "scale", LS_CTYPE_F32, offsetof(P, scale), NULL, 0},
    {"use_qk_l2norm", "qk_l2norm", LS_CTYPE_BOOL, offsetof(P, qk_l2norm), NULL, 0},
    {"beta_is_logit", "beta_is_logit", LS_CTYPE_BOOL, offsetof(P, beta_is_logit), NULL, 0},
    {"state_v_first", "state_v_first", LS_CTYPE_BOOL, offsetof(P, state_v_first), NULL, 0},
    {"gate_in_kernel", "gate_in_kernel", LS_CTYPE_BOOL, offsetof(P, gate_in_kernel), NULL, 0},
    {"lower_bound", "lower_bound", LS_CTYPE_F32, offsetof(P, lower_bound), NULL, 0},
};

#define IN(name, field, req, dims, shape, dist, a, b)                                              \
    {                                                                                              \
        name, LS_ROLE_INPUT, #field, offsetof(P, field), req, dims, shape, NULL, NULL, dist, a, b, \
            false                                                                                  \
    }
#define GRAD(name, field, of, dims, shape)                                                         \
    {                                                                                              \
        name, LS_ROLE_GRAD, #field, offsetof(linseq_kda_grads, field), false, dims, shape, NULL,   \
            of, LS_DIST_ZERO, 0, 0, false                                                          \
    }
#define STATE_DIMS "[N,HV,K,V] ([N,HV,V,K] V-first)"

static const ls_tensor_desc tensors[] = {
    IN("q", q, true, "[B,T,H,K]", shape_qk, LS_DIST_NORMAL, 1, 0),
    IN("k", k, true, "[B,T,H,K]", shape_qk, LS_DIST_NORMAL, 1, 0),
    IN("v", v, true, "[B,T,HV,V]", shape_token_value, LS_DIST_NORMAL, 1, 0),
    IN("beta", beta, true, "[B,T,HV]", shape_beta, LS_DIST_SIGMOID, 0, 0),
    IN("g", g, true, "[B,T,HV,K] per channel, [B,T,HV] per head", shape_g, LS_DIST_LOGSIGMOID, 0,
       0),
    IN("h0", h0, false, "none (must be NULL)", shape_none, LS_DIST_ZERO, 0, 0),
    IN("A_log", A_log, false, "[HV]", shape_a_log, LS_DIST_LOG_OF_UNIFORM, 1, 16),
    IN("dt_bias", dt_bias, false, "[HV*K] per channel, [HV] per head", shape_dt_bias,
       LS_DIST_INV_SOFTPLUS_DT, 1e-3, 1e-1),
    {"P", LS_ROLE_OUTPUT, NULL, 0, true, "[N,HV,K,K]", shape_transition, NULL, NULL, LS_DIST_ZERO,
     0, 0, false},
    {"R", LS_ROLE_OUTPUT, NULL, 1, false, STATE_DIMS, shape_state, NULL, NULL, LS_DIST_ZERO, 0, 0,
     false},
    {"d_P", LS_ROLE_UPSTREAM, NULL, 0, false, "[N,HV,K,K]", shape_transition, NULL, "P",
     LS_DIST_NORMAL, 1, 0, false},
    {"d_R", LS_ROLE_UPSTREAM, NULL, 1, false, STATE_DIMS, shape_state, NULL, "R", LS_DIST_NORMAL, 1,
     0, false},
    GRAD("dq", dq, "q", "[B,T,H,K]", shape_qk),
    GRAD("dk", dk, "k", "[B,T,H,K]", shape_qk),
    GRAD("dv", dv, "v", "[B,T,HV,V]", shape_token_value),
    GRAD("dbeta", dbeta, "beta", "[B,T,HV]", shape_beta),
    GRAD("dg", dg, "g", "[B,T,HV,K] per channel, [B,T,HV] per head", shape_g),
    GRAD("dh0", dh0, "h0", "none (must be NULL)", shape_none),
    GRAD("dA_log", dA_log, "A_log", "[HV]", shape_a_log),
    GRAD("ddt_bias", ddt_bias, "dt_bias", "[HV*K] per channel, [HV] per head", shape_dt_bias),
};

const ls_op ls_op_kda_segment = {
    LS_OP_STRUCTS(linseq_kda_problem, linseq_kda_grads),
    LS_OP_VARLEN(linseq_kda_problem),
    .name = "kda_segment",
    .entry_stem = "linseq_kda_segment",
    .has_modes = true,
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = bench_options,
    .bench_fwdbwd = true,
};
