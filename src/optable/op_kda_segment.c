/* The KDA segment summary (linseq_kda_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are KDA's, and so are the shapes, sizes and options
 * (op_kda.h); h0 and dh0 do not exist here (the summary starts from zeros), so their shapes
 * are empty, and the outputs are the summary's P and R. */
#include <string.h>

#include "optable/op_kda.h"
#include "optable/op_shapes.h"

typedef linseq_kda_problem P;

static int shape_transition(const void *v, int64_t *d)
{
    const P *p = v;
    return ls_dims(d, 4, ls_op_kda_state_rows(p), ls_op_kda_value_heads(p), p->K, p->K);
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
    const P *p = v;
    const double K = (double)p->K, V = (double)p->V;
    const int chunk = exec && exec->chunk_size ? exec->chunk_size : 64;
    const double C = (double)(chunk < p->T ? chunk : p->T);
    const double tokens_heads = (double)p->B * (double)p->T * (double)ls_op_kda_value_heads(p);
    return tokens_heads * (4.0 * K * (V + K) + C * (V + K) + 2.0 * C * K);
}

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
#define P_DIMS "[N,HV,K,K]"

static const ls_tensor_desc tensors[] = {
    IN("q", q, true, "[B,T,H,K]", ls_op_kda_shape_qk, LS_DIST_NORMAL, 1, 0),
    IN("k", k, true, "[B,T,H,K]", ls_op_kda_shape_qk, LS_DIST_NORMAL, 1, 0),
    IN("v", v, true, "[B,T,HV,V]", ls_op_kda_shape_token_value, LS_DIST_NORMAL, 1, 0),
    IN("beta", beta, true, "[B,T,HV]", ls_op_kda_shape_beta, LS_DIST_SIGMOID, 0, 0),
    IN("g", g, true, LS_OP_KDA_G_DIMS, ls_op_kda_shape_g, LS_DIST_LOGSIGMOID, 0, 0),
    IN("h0", h0, false, "none (must be NULL)", ls_shape_none, LS_DIST_ZERO, 0, 0),
    IN("A_log", A_log, false, "[HV]", ls_op_kda_shape_a_log, LS_DIST_LOG_OF_UNIFORM, 1, 16),
    IN("dt_bias", dt_bias, false, LS_OP_KDA_DT_BIAS_DIMS, ls_op_kda_shape_dt_bias,
       LS_DIST_INV_SOFTPLUS_DT, 1e-3, 1e-1),
    {"P", LS_ROLE_OUTPUT, NULL, 0, true, P_DIMS, shape_transition, NULL, NULL, LS_DIST_ZERO, 0, 0,
     false},
    {"R", LS_ROLE_OUTPUT, NULL, 1, false, LS_OP_KDA_STATE_DIMS, ls_op_kda_shape_state, NULL, NULL,
     LS_DIST_ZERO, 0, 0, false},
    {"d_P", LS_ROLE_UPSTREAM, NULL, 0, false, P_DIMS, shape_transition, NULL, "P", LS_DIST_NORMAL,
     1, 0, false},
    {"d_R", LS_ROLE_UPSTREAM, NULL, 1, false, LS_OP_KDA_STATE_DIMS, ls_op_kda_shape_state, NULL,
     "R", LS_DIST_NORMAL, 1, 0, false},
    GRAD("dq", dq, "q", "[B,T,H,K]", ls_op_kda_shape_qk),
    GRAD("dk", dk, "k", "[B,T,H,K]", ls_op_kda_shape_qk),
    GRAD("dv", dv, "v", "[B,T,HV,V]", ls_op_kda_shape_token_value),
    GRAD("dbeta", dbeta, "beta", "[B,T,HV]", ls_op_kda_shape_beta),
    GRAD("dg", dg, "g", LS_OP_KDA_G_DIMS, ls_op_kda_shape_g),
    GRAD("dh0", dh0, "h0", "none (must be NULL)", ls_shape_none),
    GRAD("dA_log", dA_log, "A_log", "[HV]", ls_op_kda_shape_a_log),
    GRAD("ddt_bias", ddt_bias, "dt_bias", LS_OP_KDA_DT_BIAS_DIMS, ls_op_kda_shape_dt_bias),
};

const ls_op ls_op_kda_segment = {
    LS_OP_STRUCTS_OF(linseq_kda_problem, linseq_kda_grads, ls_op_kda_sizes, ls_op_kda_options,
                     tensors),
    LS_OP_VARLEN(linseq_kda_problem),
    .name = "kda_segment",
    .entry_stem = "linseq_kda_segment",
    .has_modes = true,
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = ls_op_kda_bench_options,
    .bench_fwdbwd = true,
};
