/* The SSM1 segment summary (linseq_ssm1_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are SSM1's; h0 and dh0 do not exist here (the
 * summary starts from zeros), so their shapes are empty. */
#include "optable/op_shapes.h"

#include <string.h>

typedef linseq_ssm1_problem P;

static const P *ssm(const void *p) { return p; }
static int64_t state_rows(const P *p) { return p->cu_seqlens ? p->n_seqs : p->B; }

static int shape_token(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    return p->channel_first ? ls_dims(d, 3, p->B, p->D, p->T) : ls_dims(d, 3, p->B, p->T, p->D);
}

static int shape_a(const void *v, int64_t *d) { return ls_dims(d, 2, ssm(v)->D, ssm(v)->N); }
static int shape_channels(const void *v, int64_t *d) { return ls_dims(d, 1, ssm(v)->D); }

static int shape_bc(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    if (p->channel_first)
        return p->G ? ls_dims(d, 4, p->B, p->G, p->N, p->T) : ls_dims(d, 3, p->B, p->N, p->T);
    return p->G ? ls_dims(d, 4, p->B, p->T, p->G, p->N) : ls_dims(d, 3, p->B, p->T, p->N);
}

static int shape_state(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    return ls_dims(d, 3, state_rows(p), p->D, p->N);
}

static int shape_none(const void *v, int64_t *d)
{
    (void)v, (void)d;
    return 0;
}

static int shape_d_skip_grad(const void *v, int64_t *d)
{
    return ssm(v)->D_skip ? shape_channels(v, d) : 0;
}
static int shape_gate_grad(const void *v, int64_t *d)
{
    return ssm(v)->gate ? shape_token(v, d) : 0;
}
static int shape_dt_bias(const void *v, int64_t *d)
{
    return ssm(v)->dt_softplus ? shape_channels(v, d) : 0;
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ssm1_segment_forward(p, exec, out[0], out[1]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_ssm1_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_ssm1_segment_backward(p, exec, up[0], up[1], &g);
}

/* The scan's 6 per token, channel and state (R comes from it). */
static double flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = ssm(v);
    return 6.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N;
}

static void bench_options(void *v)
{
    P *p = v;
    p->G = 1;
}

static const ls_size_desc sizes[] = {
    {"B", offsetof(P, B), true, 1},    {"T", offsetof(P, T), true, 2048},
    {"D", offsetof(P, D), true, 1536}, {"N", offsetof(P, N), true, 16},
    {"G", offsetof(P, G), false, 0},
};

static const ls_option_desc options[] = {
    {"dt_softplus", "dt_softplus", LS_CTYPE_BOOL, offsetof(P, dt_softplus), NULL, 0},
    {"activation", "gate_activation", LS_CTYPE_ENUM, offsetof(P, gate_activation),
     ls_activation_names, LINSEQ_ACT_DEFAULT},
    {"gate_activation", "gate_activation", LS_CTYPE_ENUM, offsetof(P, gate_activation),
     ls_activation_names, LS_ENUM_KEEP},
    {"channel_first", "channel_first", LS_CTYPE_BOOL, offsetof(P, channel_first), NULL, 0},
};

static const ls_strides_desc strides[] = {
    {"x_strides", "x", offsetof(P, x_strides)},
    {"dt_strides", "dt", offsetof(P, dt_strides)},
    {"gate_strides", "gate", offsetof(P, gate_strides)},
    {"B_strides", "B", offsetof(P, B_strides)},
    {"C_strides", "C", offsetof(P, C_strides)},
};

#define IN(name, field, req, dims, shape, dist, a, b)                                              \
    {                                                                                              \
        name, LS_ROLE_INPUT, #field, offsetof(P, field), req, dims, shape, NULL, NULL, dist, a, b, \
            false                                                                                  \
    }
#define GRAD(name, field, of, dims, shape)                                                         \
    {                                                                                              \
        name, LS_ROLE_GRAD, #field, offsetof(linseq_ssm1_grads, field), false, dims, shape, NULL,  \
            of, LS_DIST_ZERO, 0, 0, false                                                          \
    }
#define BC_DIMS "[B,T,G,N] ([B,T,N] without G)"

static const ls_tensor_desc tensors[] = {
    IN("x", x, true, "[B,T,D]", shape_token, LS_DIST_NORMAL, 1, 0),
    IN("dt", dt, true, "[B,T,D]", shape_token, LS_DIST_LOG_UNIFORM, 1e-3, 1e-1),
    IN("A", A, true, "[D,N]", shape_a, LS_DIST_S4D_REAL, 0, 0),
    IN("B", B_proj, true, BC_DIMS, shape_bc, LS_DIST_NORMAL, 1, 0),
    IN("C", C_proj, true, BC_DIMS, shape_bc, LS_DIST_NORMAL, 1, 0),
    IN("D", D_skip, false, "[D]", shape_channels, LS_DIST_UNIFORM, 1, 1),
    IN("gate", gate, false, "[B,T,D]", shape_token, LS_DIST_NORMAL, 1, 0),
    IN("h0", h0, false, "none (must be NULL)", shape_none, LS_DIST_ZERO, 0, 0),
    IN("dt_bias", dt_bias, false, "[D]", shape_dt_bias, LS_DIST_INV_SOFTPLUS_DT, 1e-3, 1e-1),
    {"P", LS_ROLE_OUTPUT, NULL, 0, true, "[N_seq,D,N]", shape_state, NULL, NULL, LS_DIST_ZERO, 0, 0,
     false},
    {"R", LS_ROLE_OUTPUT, NULL, 1, false, "[N_seq,D,N]", shape_state, NULL, NULL, LS_DIST_ZERO, 0,
     0, false},
    {"d_P", LS_ROLE_UPSTREAM, NULL, 0, false, "[N_seq,D,N]", shape_state, NULL, "P", LS_DIST_NORMAL,
     1, 0, false},
    {"d_R", LS_ROLE_UPSTREAM, NULL, 1, false, "[N_seq,D,N]", shape_state, NULL, "R", LS_DIST_NORMAL,
     1, 0, false},
    GRAD("dx", dx, "x", "[B,T,D]", shape_token),
    GRAD("ddt", ddt, "dt", "[B,T,D]", shape_token),
    GRAD("dA", dA, "A", "[D,N]", shape_a),
    GRAD("dB", dB_proj, "B", BC_DIMS, shape_bc),
    GRAD("dC", dC_proj, "C", BC_DIMS, shape_bc),
    GRAD("dD", dD_skip, "D", "[D]", shape_d_skip_grad),
    GRAD("dgate", dgate, "gate", "[B,T,D]", shape_gate_grad),
    GRAD("dh0", dh0, "h0", "none (must be NULL)", shape_none),
    GRAD("ddt_bias", ddt_bias, "dt_bias", "[D]", shape_dt_bias),
};

const ls_op ls_op_ssm1_segment = {
    LS_OP_STRUCTS(linseq_ssm1_problem, linseq_ssm1_grads),
    LS_OP_VARLEN(linseq_ssm1_problem),
    .strides = strides,
    .n_strides = LS_COUNT(strides),
    .name = "ssm1_segment",
    .entry_stem = "linseq_ssm1_segment",
    .forward = forward,
    .backward = backward,
    .flops = flops,
    .bench_options = bench_options,
    .bench_fwdbwd = true,
};
