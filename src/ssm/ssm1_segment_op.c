/* The SSM1 segment summary (linseq_ssm1_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are SSM1's, and so are the shapes, sizes, options
 * and strides fields (ssm1_op.h); h0 and dh0 do not exist here (the summary starts from
 * zeros), so their shapes are empty, and the outputs are the summary's P and R. */
#include <string.h>

#include "optable/op_shapes.h"
#include "ssm/ssm1_op.h"

typedef linseq_ssm1_problem P;

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

/* One group of B and C (the gate, whose activation SSM1's benchmark sets, does not enter). */
static void bench_options(void *v)
{
    P *p = v;
    p->G = 1;
}

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
             .dist = LS_DIST_UNIFORM, .a = 1, .b = 1),
    LS_INPUT("gate", gate, .dims = "[B,T,D]", .shape = ls_op_ssm1_shape_token,
             .dist = LS_DIST_NORMAL, .a = 1, .token = true),
    LS_INPUT("h0", h0, .dims = "none (must be NULL)", .shape = ls_shape_none),
    LS_INPUT("dt_bias", dt_bias, .dims = "[D]", .shape = ls_op_ssm1_shape_dt_bias,
             .dist = LS_DIST_INV_SOFTPLUS_DT, .a = 1e-3, .b = 1e-1),
    LS_OUTPUT("P", 0, .required = true, .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state),
    LS_OUTPUT("R", 1, .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state),
    LS_UPSTREAM("d_P", 0, "P", .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state,
                .dist = LS_DIST_NORMAL, .a = 1),
    LS_UPSTREAM("d_R", 1, "R", .dims = "[N_seq,D,N]", .shape = ls_op_ssm1_shape_state,
                .dist = LS_DIST_NORMAL, .a = 1),
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
    LS_GRAD("dh0", dh0, "h0", .dims = "none (must be NULL)", .shape = ls_shape_none),
    LS_GRAD("ddt_bias", ddt_bias, "dt_bias", .dims = "[D]", .shape = ls_op_ssm1_shape_dt_bias),
};

const ls_op ls_op_ssm1_segment = {
    LS_OP_STRUCTS_OF(linseq_ssm1_problem, linseq_ssm1_grads, ls_op_ssm1_sizes, ls_op_ssm1_options,
                     tensors),
    LS_OP_VARLEN(linseq_ssm1_problem),
    .strides = ls_op_ssm1_strides,
    .n_strides = LS_COUNT(ls_op_ssm1_strides),
    .name = "ssm1_segment",
    .entry_stem = "linseq_ssm1_segment",
    .forward = forward,
    .backward = backward,
    .flops = ls_op_ssm1_flops, /* the scan's: R comes from it */
    .bench_options = bench_options,
    .bench_fwdbwd = true,
};
