/* The KDA op (linseq_kda_problem) in the op table: see optable.h. What other ops on the same
 * problem reuse of it is declared in kda_op.h. */
#include "kda/kda_op.h"

#include <string.h>

#include "optable/op_shapes.h"

typedef linseq_kda_problem P;

int ls_op_kda_shape_qk(const void *v, int64_t *d)
{
    const P *p = v;
    return ls_dims(d, 4, p->B, p->T, p->H, p->K);
}

int ls_op_kda_shape_token_value(const void *v, int64_t *d)
{
    const P *p = v;
    return ls_dims(d, 4, p->B, p->T, ls_op_kda_value_heads(p), p->V);
}

int ls_op_kda_shape_beta(const void *v, int64_t *d)
{
    const P *p = v;
    return ls_dims(d, 3, p->B, p->T, ls_op_kda_value_heads(p));
}

/* [B,T,HV,K] per channel, [B,T,HV] per head, none without decay. */
int ls_op_kda_shape_g(const void *v, int64_t *d)
{
    const P *p = v;
    if (p->decay == LINSEQ_DECAY_PER_CHANNEL)
        return ls_dims(d, 4, p->B, p->T, ls_op_kda_value_heads(p), p->K);
    if (p->decay == LINSEQ_DECAY_PER_HEAD)
        return ls_dims(d, 3, p->B, p->T, ls_op_kda_value_heads(p));
    return 0;
}

int ls_op_kda_shape_state(const void *v, int64_t *d)
{
    const P *p = v;
    const int64_t rows = ls_op_kda_state_rows(p), HV = ls_op_kda_value_heads(p);
    return p->state_v_first ? ls_dims(d, 4, rows, HV, p->V, p->K)
                            : ls_dims(d, 4, rows, HV, p->K, p->V);
}

int ls_op_kda_shape_a_log(const void *v, int64_t *d)
{
    const P *p = v;
    return p->gate_in_kernel ? ls_dims(d, 1, ls_op_kda_value_heads(p)) : 0;
}

int ls_op_kda_shape_dt_bias(const void *v, int64_t *d)
{
    const P *p = v;
    if (!p->gate_in_kernel) return 0;
    const int64_t HV = ls_op_kda_value_heads(p);
    return ls_dims(d, 1, p->decay == LINSEQ_DECAY_PER_CHANNEL ? ls_mul_sat(HV, p->K) : HV);
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_kda_forward(p, exec, out[0], out[1]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_kda_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_kda_backward(p, exec, up[0], up[1], &g);
}

static linseq_status saved_size(const void *p, const linseq_exec *exec, size_t *bytes)
{
    return linseq_kda_saved_size(p, exec, bytes);
}

static linseq_status forward_train(const void *p, const linseq_exec *exec, float *const *out,
                                   void *saved, size_t saved_bytes)
{
    return linseq_kda_forward_train(p, exec, out[0], out[1], saved, saved_bytes);
}

static linseq_status backward_saved(const void *p, const linseq_exec *exec, const void *saved,
                                    size_t saved_bytes, const float *const *up, const void *grads)
{
    linseq_kda_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_kda_backward_saved(p, exec, saved, saved_bytes, up[0], up[1], &g);
}

static linseq_status decode(const void *p, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out)
{
    return linseq_kda_decode(p, exec, pool, n_rows, rows, out[0]);
}

static linseq_status decode_rows(const void *p, const linseq_exec *exec, const ls_state_rows *rows,
                                 int64_t n_rows, float *const *out)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_op_decode_pool", &isa);
    return st ? st : ls_kda_decode_rows_isa(p, exec, rows, n_rows, out[0], isa);
}

/* README "Benchmarks": 7KV per token and head recurrent (and decode, one step of the
 * recurrence: a caller passes the recurrent mode), 6KV + 2CK + 2CV chunked with
 * C = min(chunk, T), also at T = 1. */
static double flops(const void *v, const linseq_exec *exec)
{
    const P *p = v;
    const double K = (double)p->K, V = (double)p->V;
    const double tokens_heads = (double)p->B * (double)p->T * (double)ls_op_kda_value_heads(p);
    if (exec && exec->mode == LINSEQ_MODE_RECURRENT) return tokens_heads * 7.0 * K * V;
    const int chunk = exec && exec->chunk_size ? exec->chunk_size : 64;
    const double C = (double)(chunk < p->T ? chunk : p->T);
    return tokens_heads * (6.0 * K * V + 2.0 * C * K + 2.0 * C * V);
}

void ls_op_kda_bench_options(void *v)
{
    P *p = v;
    p->decay = LINSEQ_DECAY_PER_CHANNEL;
    p->qk_l2norm = true;
}

const ls_size_desc ls_op_kda_sizes[LS_OP_KDA_N_SIZES] = {
    {"B", offsetof(P, B), true, 1},   {"T", offsetof(P, T), true, 2048},
    {"H", offsetof(P, H), true, 16},  {"HV", offsetof(P, HV), false, 0},
    {"K", offsetof(P, K), true, 128}, {"V", offsetof(P, V), true, 128},
};

static const ls_enum_name decay_names[] = {{"none", LINSEQ_DECAY_NONE},
                                           {"per_head", LINSEQ_DECAY_PER_HEAD},
                                           {"per_channel", LINSEQ_DECAY_PER_CHANNEL},
                                           {NULL, 0}};

const ls_option_desc ls_op_kda_options[LS_OP_KDA_N_OPTIONS] = {
    {"decay", "decay", LS_CTYPE_ENUM, offsetof(P, decay), decay_names, LINSEQ_DECAY_NONE},
    {"scale", "scale", LS_CTYPE_F32, offsetof(P, scale), NULL, 0},
    {"use_qk_l2norm", "qk_l2norm", LS_CTYPE_BOOL, offsetof(P, qk_l2norm), NULL, 0},
    {"beta_is_logit", "beta_is_logit", LS_CTYPE_BOOL, offsetof(P, beta_is_logit), NULL, 0},
    {"state_v_first", "state_v_first", LS_CTYPE_BOOL, offsetof(P, state_v_first), NULL, 0},
    {"gate_in_kernel", "gate_in_kernel", LS_CTYPE_BOOL, offsetof(P, gate_in_kernel), NULL, 0},
    {"lower_bound", "lower_bound", LS_CTYPE_F32, offsetof(P, lower_bound), NULL, 0},
    {"l2norm_eps", "l2norm_eps", LS_CTYPE_F32, offsetof(P, l2norm_eps), NULL, 0},
};

typedef linseq_kda_grads G;
static const ls_tensor_desc tensors[] = {
    LS_INPUT("q", q, .required = true, .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("k", k, .required = true, .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("v", v, .required = true, .dims = "[B,T,HV,V]", .shape = ls_op_kda_shape_token_value,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    /* optional: without beta the op is gated linear attention (no delta rule) */
    LS_INPUT("beta", beta, .dims = "[B,T,HV]", .shape = ls_op_kda_shape_beta,
             .dist = LS_DIST_SIGMOID, .bench = true, .token = true),
    LS_INPUT("g", g, .required = true, .dims = LS_OP_KDA_G_DIMS, .shape = ls_op_kda_shape_g,
             .dist = LS_DIST_LOGSIGMOID, .token = true),
    LS_INPUT("h0", h0, .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state,
             .case_flag = "has_h0", .dist = LS_DIST_NORMAL, .a = 0.5),
    LS_INPUT("A_log", A_log, .dims = "[HV]", .shape = ls_op_kda_shape_a_log,
             .dist = LS_DIST_LOG_OF_UNIFORM, .a = 1, .b = 16),
    LS_INPUT("dt_bias", dt_bias, .dims = LS_OP_KDA_DT_BIAS_DIMS, .shape = ls_op_kda_shape_dt_bias,
             .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1),
    LS_OUTPUT("o", 0, .required = true, .dims = "[B,T,HV,V]", .shape = ls_op_kda_shape_token_value,
              .token = true),
    LS_OUTPUT("ht", 1, .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state,
              .alias_of = "h0"),
    LS_UPSTREAM("d_o", 0, "o", .required = true, .dims = "[B,T,HV,V]",
                .shape = ls_op_kda_shape_token_value, .dist = LS_DIST_NORMAL, .a = 1,
                .token = true),
    LS_UPSTREAM("d_ht", 1, "ht", .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state,
                .case_flag = "has_dht", .dist = LS_DIST_NORMAL, .a = 1),
    LS_GRAD("dq", dq, "q", .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk, .token = true),
    LS_GRAD("dk", dk, "k", .dims = "[B,T,H,K]", .shape = ls_op_kda_shape_qk, .token = true),
    LS_GRAD("dv", dv, "v", .dims = "[B,T,HV,V]", .shape = ls_op_kda_shape_token_value,
            .token = true),
    LS_GRAD("dbeta", dbeta, "beta", .dims = "[B,T,HV]", .shape = ls_op_kda_shape_beta,
            .token = true),
    LS_GRAD("dg", dg, "g", .dims = LS_OP_KDA_G_DIMS, .shape = ls_op_kda_shape_g, .token = true),
    LS_GRAD("dh0", dh0, "h0", .dims = LS_OP_KDA_STATE_DIMS, .shape = ls_op_kda_shape_state),
    LS_GRAD("dA_log", dA_log, "A_log", .dims = "[HV]", .shape = ls_op_kda_shape_a_log),
    LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = LS_OP_KDA_DT_BIAS_DIMS,
            .shape = ls_op_kda_shape_dt_bias),
};

const ls_op ls_op_kda = {
    LS_OP_STRUCTS_OF(linseq_kda_problem, linseq_kda_grads, ls_op_kda_sizes, ls_op_kda_options,
                     tensors),
    LS_OP_VARLEN(linseq_kda_problem),
    .name = "kda",
    .has_modes = true,
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = ls_op_kda_bench_options,
    .bench_fwdbwd = true,
    .saved_size = saved_size,
    .forward_train = forward_train,
    .backward_saved = backward_saved,
    .decode = decode,
    .decode_rows = decode_rows,
    .decode_state = "h0",
    .decode_state_out = "ht",
};
