/* The Mamba1 selective scan (linseq_ssm1_problem) in the op table: see optable.h. What other
 * ops on the same problem reuse of it is declared in ssm1_op.h. */
#include "ssm/ssm1_op.h"

#include <string.h>

#include "core/status.h"
#include "optable/op_shapes.h"

typedef linseq_ssm1_problem P;

static const P *ssm(const void *p) { return p; }
static int64_t state_rows(const P *p) { return p->cu_seqlens ? p->n_seqs : p->B; }

/* [B,T,D], or [B,D,T] with channel_first (the dense layout; strided inputs are described by
 * their strides fields, not by these shapes). */
int ls_op_ssm1_shape_token(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    return p->channel_first ? ls_dims(d, 3, p->B, p->D, p->T) : ls_dims(d, 3, p->B, p->T, p->D);
}

int ls_op_ssm1_shape_a(const void *v, int64_t *d) { return ls_dims(d, 2, ssm(v)->D, ssm(v)->N); }
int ls_op_ssm1_shape_channels(const void *v, int64_t *d) { return ls_dims(d, 1, ssm(v)->D); }

/* [B,T,G,N]; G == 0 means one group, and then the files are [B,T,N] as in the reference
 * data (the memory is the same). channel_first: [B,G,N,T] (or [B,N,T]). */
int ls_op_ssm1_shape_bc(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    if (p->channel_first)
        return p->G ? ls_dims(d, 4, p->B, p->G, p->N, p->T) : ls_dims(d, 3, p->B, p->N, p->T);
    return p->G ? ls_dims(d, 4, p->B, p->T, p->G, p->N) : ls_dims(d, 3, p->B, p->T, p->N);
}

int ls_op_ssm1_shape_state(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    return ls_dims(d, 3, state_rows(p), p->D, p->N);
}

/* Gradients of optional inputs exist only with them (dh0 also without h0: at zeros). */
int ls_op_ssm1_shape_d_skip_grad(const void *v, int64_t *d)
{
    return ssm(v)->D_skip ? ls_op_ssm1_shape_channels(v, d) : 0;
}
int ls_op_ssm1_shape_gate_grad(const void *v, int64_t *d)
{
    return ssm(v)->gate ? ls_op_ssm1_shape_token(v, d) : 0;
}
int ls_op_ssm1_shape_dt_bias(const void *v, int64_t *d)
{
    return ssm(v)->dt_softplus ? ls_op_ssm1_shape_channels(v, d) : 0;
}

static linseq_status forward(const void *p, const linseq_exec *exec, float *const *out)
{
    return linseq_ssm1_forward(p, exec, out[0], out[1]);
}

static linseq_status backward(const void *p, const linseq_exec *exec, const float *const *up,
                              const void *grads)
{
    linseq_ssm1_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_ssm1_backward(p, exec, up[0], up[1], &g);
}

static linseq_status saved_size(const void *p, const linseq_exec *exec, size_t *bytes)
{
    return linseq_ssm1_saved_size(p, exec, bytes);
}

static linseq_status forward_train(const void *p, const linseq_exec *exec, float *const *out,
                                   void *saved, size_t saved_bytes)
{
    return linseq_ssm1_forward_train(p, exec, out[0], out[1], saved, saved_bytes);
}

static linseq_status backward_saved(const void *p, const linseq_exec *exec, const void *saved,
                                    size_t saved_bytes, const float *const *up, const void *grads)
{
    linseq_ssm1_grads g;
    memcpy(&g, grads, sizeof g);
    return linseq_ssm1_backward_saved(p, exec, saved, saved_bytes, up[0], up[1], &g);
}

static linseq_status decode(const void *v, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out)
{
    return linseq_ssm1_decode(v, exec, pool, n_rows, rows, out[0]);
}

double ls_op_ssm1_flops(const void *v, const linseq_exec *exec)
{
    (void)exec;
    const P *p = ssm(v);
    return 6.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N;
}

static void bench_options(void *v)
{
    P *p = v;
    p->G = 1;
    p->gate_activation = LINSEQ_ACT_SILU;
}

const ls_size_desc ls_op_ssm1_sizes[LS_OP_SSM1_N_SIZES] = {
    {"B", offsetof(P, B), true, 1},    {"T", offsetof(P, T), true, 2048},
    {"D", offsetof(P, D), true, 1536}, {"N", offsetof(P, N), true, 16},
    {"G", offsetof(P, G), false, 0},
};

/* The reference data names the gate's activation "activation"; "gate_activation" (the
 * field's name) wins when both are given. */
const ls_option_desc ls_op_ssm1_options[LS_OP_SSM1_N_OPTIONS] = {
    {"dt_softplus", "dt_softplus", LS_CTYPE_BOOL, offsetof(P, dt_softplus), NULL, 0},
    {"activation", "gate_activation", LS_CTYPE_ENUM, offsetof(P, gate_activation),
     ls_activation_names, LINSEQ_ACT_DEFAULT},
    {"gate_activation", "gate_activation", LS_CTYPE_ENUM, offsetof(P, gate_activation),
     ls_activation_names, LS_ENUM_KEEP},
    {"channel_first", "channel_first", LS_CTYPE_BOOL, offsetof(P, channel_first), NULL, 0},
};

/* What the strides of x, dt and gate step over: (batch, token, channel); of B and C: (batch,
 * token, group, state), one group when G is 0. */
static int axes_token(const void *v, int64_t *d)
{
    return ls_dims(d, 3, ssm(v)->B, ssm(v)->T, ssm(v)->D);
}
static int axes_bc(const void *v, int64_t *d)
{
    const P *p = ssm(v);
    return ls_dims(d, 4, p->B, p->T, p->G ? p->G : (int64_t)1, p->N);
}

const ls_strides_desc ls_op_ssm1_strides[LS_OP_SSM1_N_STRIDES] = {
    {"x_strides", "x", offsetof(P, x_strides), axes_token},
    {"dt_strides", "dt", offsetof(P, dt_strides), axes_token},
    {"gate_strides", "gate", offsetof(P, gate_strides), axes_token},
    {"B_strides", "B", offsetof(P, B_strides), axes_bc},
    {"C_strides", "C", offsetof(P, C_strides), axes_bc},
};

typedef linseq_ssm1_grads G;
static const ls_tensor_desc tensors[] = {
    LS_INPUT("x", x, .required = true, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("dt", dt, .required = true, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
             .dist = LS_DIST_LOG_UNIFORM, .a = 1e-3, .b = 1e-1, .token = true),
    LS_INPUT("A", A, .required = true, .dims = "[D,N]", .shape = ls_op_ssm1_shape_a,
             .dist = LS_DIST_S4D_REAL),
    LS_INPUT("B", B_proj, .required = true, .dims = LS_OP_SSM1_BC_DIMS,
             .shape = ls_op_ssm1_shape_bc, .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("C", C_proj, .required = true, .dims = LS_OP_SSM1_BC_DIMS,
             .shape = ls_op_ssm1_shape_bc, .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("D", D_skip, .dims = "[D]", .shape = ls_op_ssm1_shape_channels,
             .dist = LS_DIST_UNIFORM, .a = 1, .b = 1, .bench = true),
    LS_INPUT("gate", gate, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
             .case_flag = "has_gate", .dist = LS_DIST_NORMAL, .a = 1, .bench = true, .token = true),
    LS_INPUT("h0", h0, .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state,
             .case_flag = "has_h0", .dist = LS_DIST_NORMAL, .a = 0.5),
    LS_INPUT("dt_bias", dt_bias, .dims = "[D]", .shape = ls_op_ssm1_shape_dt_bias,
             .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1),
    LS_OUTPUT("y", 0, .required = true, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
              .token = true),
    LS_OUTPUT("hT", 1, .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state, .alias_of = "h0"),
    LS_UPSTREAM("d_y", 0, "y", .required = true, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
                .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_UPSTREAM("d_hT", 1, "hT", .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state,
                .case_flag = "has_dhT", .dist = LS_DIST_NORMAL, .a = 1),
    LS_GRAD("dx", dx, "x", .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token, .token = true),
    LS_GRAD("ddt", ddt, "dt", .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token, .token = true),
    LS_GRAD("dA", dA, "A", .dims = "[D,N]", .shape = ls_op_ssm1_shape_a),
    LS_GRAD("dB", dB_proj, "B", .dims = LS_OP_SSM1_BC_DIMS, .shape = ls_op_ssm1_shape_bc,
            .token = true),
    LS_GRAD("dC", dC_proj, "C", .dims = LS_OP_SSM1_BC_DIMS, .shape = ls_op_ssm1_shape_bc,
            .token = true),
    LS_GRAD("dD", dD_skip, "D", .dims = "[D]", .shape = ls_op_ssm1_shape_d_skip_grad),
    LS_GRAD("dgate", dgate, "gate", .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_gate_grad,
            .token = true),
    LS_GRAD("dh0", dh0, "h0", .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state),
    LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = "[D]", .shape = ls_op_ssm1_shape_dt_bias),
};

const ls_op ls_op_ssm1 = {
    LS_OP_STRUCTS_OF(linseq_ssm1_problem, linseq_ssm1_grads, ls_op_ssm1_sizes, ls_op_ssm1_options,
                     tensors),
    LS_OP_VARLEN(linseq_ssm1_problem),
    .strides = ls_op_ssm1_strides,
    .n_strides = LS_COUNT(ls_op_ssm1_strides),
    .name = "ssm1",
    .forward = forward,
    .backward = backward,
    .flops = ls_op_ssm1_flops,
    .bench_options = bench_options,
    .bench_fwdbwd = true,
    .saved_size = saved_size,
    .forward_train = forward_train,
    .backward_saved = backward_saved,
    .decode = decode,
    .decode_state = "h0",
    .decode_state_out = "hT",
};
