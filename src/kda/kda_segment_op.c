/* The KDA segment summary (linseq_kda_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are KDA's, and so are the shapes, sizes and options
 * (kda_op.h); h0 and dh0 do not exist here (the summary starts from zeros), so their shapes
 * are empty, and the outputs are the summary's P and R. */
#include <string.h>

#include "kda/kda_op.h"
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

#define P_DIMS "[N,HV,K,K]"

typedef linseq_kda_grads G;
static const ls_tensor_desc tensors[] = {
    LS_INPUT("q", q, .required = true, .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("k", k, .required = true, .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("v", v, .required = true, .dims = "[B,T,HV,V]", .shape = ls_op_kda_shape_token_value,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("beta", beta, .required = true, .dims = "[B,T,HV]", .shape = ls_op_kda_shape_beta,
             .dist = LS_DIST_SIGMOID, .token = true),
    LS_INPUT("g", g, .required = true, .dims = LS_OP_KDA_G_DIMS, .shape = ls_op_kda_shape_g,
             .dist = LS_DIST_LOGSIGMOID, .token = true),
    LS_INPUT("h0", h0, .dims = "none (must be NULL)", .shape = ls_shape_none),
    LS_INPUT("A_log", A_log, .dims = "[HV]", .shape = ls_op_kda_shape_a_log,
             .dist = LS_DIST_LOG_OF_UNIFORM, .a = 1, .b = 16),
    LS_INPUT("dt_bias", dt_bias, .dims = LS_OP_KDA_DT_BIAS_DIMS, .shape = ls_op_kda_shape_dt_bias,
             .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1),
    LS_OUTPUT("P", 0, .required = true, .dims = P_DIMS, .shape = shape_transition),
    LS_OUTPUT("R", 1, .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state),
    LS_UPSTREAM("d_P", 0, "P", .dims = P_DIMS, .shape = shape_transition, .dist = LS_DIST_NORMAL,
                .a = 1),
    LS_UPSTREAM("d_R", 1, "R", .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state,
                .dist = LS_DIST_NORMAL, .a = 1),
    LS_GRAD("dq", dq, "q", .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk, .token = true),
    LS_GRAD("dk", dk, "k", .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk, .token = true),
    LS_GRAD("dv", dv, "v", .dims = "[B,T,HV,V]", .shape = ls_op_kda_shape_token_value,
            .token = true),
    LS_GRAD("dbeta", dbeta, "beta", .dims = "[B,T,HV]", .shape = ls_op_kda_shape_beta,
            .token = true),
    LS_GRAD("dg", dg, "g", .dims = LS_OP_KDA_G_DIMS, .shape = ls_op_kda_shape_g, .token = true),
    LS_GRAD("dh0", dh0, "h0", .dims = "none (must be NULL)", .shape = ls_shape_none),
    LS_GRAD("dA_log", dA_log, "A_log", .dims = "[HV]", .shape = ls_op_kda_shape_a_log),
    LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = LS_OP_KDA_DT_BIAS_DIMS,
            .shape = ls_op_kda_shape_dt_bias),
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
