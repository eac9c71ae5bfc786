/* The SSM1 segment summary (linseq_ssm1_segment_forward / _backward) in the op table: see
 * optable.h. The problem and grads structs are SSM1's, and so are the shapes, sizes, options
 * and strides fields (op_ssm1.h); h0 and dh0 do not exist here (the summary starts from
 * zeros), so their shapes are empty, and the outputs are the summary's P and R. */
#include <string.h>

#include "optable/op_shapes.h"
#include "optable/op_ssm1.h"

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

static const ls_tensor_desc tensors[] = {
    IN("x", x, true, "[B,T,D]", ls_op_ssm1_shape_token, LS_DIST_NORMAL, 1, 0),
    IN("dt", dt, true, "[B,T,D]", ls_op_ssm1_shape_token, LS_DIST_LOG_UNIFORM, 1e-3, 1e-1),
    IN("A", A, true, "[D,N]", ls_op_ssm1_shape_a, LS_DIST_S4D_REAL, 0, 0),
    IN("B", B_proj, true, LS_OP_SSM1_BC_DIMS, ls_op_ssm1_shape_bc, LS_DIST_NORMAL, 1, 0),
    IN("C", C_proj, true, LS_OP_SSM1_BC_DIMS, ls_op_ssm1_shape_bc, LS_DIST_NORMAL, 1, 0),
    IN("D", D_skip, false, "[D]", ls_op_ssm1_shape_channels, LS_DIST_UNIFORM, 1, 1),
    IN("gate", gate, false, "[B,T,D]", ls_op_ssm1_shape_token, LS_DIST_NORMAL, 1, 0),
    IN("h0", h0, false, "none (must be NULL)", ls_shape_none, LS_DIST_ZERO, 0, 0),
    IN("dt_bias", dt_bias, false, "[D]", ls_op_ssm1_shape_dt_bias, LS_DIST_INV_SOFTPLUS_DT, 1e-3,
       1e-1),
    {"P", LS_ROLE_OUTPUT, NULL, 0, true, "[N_seq,D,N]", ls_op_ssm1_shape_state, NULL, NULL,
     LS_DIST_ZERO, 0, 0, false},
    {"R", LS_ROLE_OUTPUT, NULL, 1, false, "[N_seq,D,N]", ls_op_ssm1_shape_state, NULL, NULL,
     LS_DIST_ZERO, 0, 0, false},
    {"d_P", LS_ROLE_UPSTREAM, NULL, 0, false, "[N_seq,D,N]", ls_op_ssm1_shape_state, NULL, "P",
     LS_DIST_NORMAL, 1, 0, false},
    {"d_R", LS_ROLE_UPSTREAM, NULL, 1, false, "[N_seq,D,N]", ls_op_ssm1_shape_state, NULL, "R",
     LS_DIST_NORMAL, 1, 0, false},
    GRAD("dx", dx, "x", "[B,T,D]", ls_op_ssm1_shape_token),
    GRAD("ddt", ddt, "dt", "[B,T,D]", ls_op_ssm1_shape_token),
    GRAD("dA", dA, "A", "[D,N]", ls_op_ssm1_shape_a),
    GRAD("dB", dB_proj, "B", LS_OP_SSM1_BC_DIMS, ls_op_ssm1_shape_bc),
    GRAD("dC", dC_proj, "C", LS_OP_SSM1_BC_DIMS, ls_op_ssm1_shape_bc),
    GRAD("dD", dD_skip, "D", "[D]", ls_op_ssm1_shape_d_skip_grad),
    GRAD("dgate", dgate, "gate", "[B,T,D]", ls_op_ssm1_shape_gate_grad),
    GRAD("dh0", dh0, "h0", "none (must be NULL)", ls_shape_none),
    GRAD("ddt_bias", ddt_bias, "dt_bias", "[D]", ls_op_ssm1_shape_dt_bias),
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
