/* Internal: what ssm1_op.c shares of SSM1's description with the other ops on a
 * linseq_ssm1_problem (ssm1_segment_op.c): the shapes of its tensors, its sizes, options and
 * strides fields, and its FLOP count. */
#ifndef LS_SSM_SSM1_OP_H
#define LS_SSM_SSM1_OP_H

#include <stdint.h>

#include "optable/optable.h"

/* Shape functions (ls_shape_fn) of the problem's tensors, with their dims for messages. */
/* The descriptions of the ops on SSM1's problem, which their entry points validate through. */
extern const ls_op ls_op_ssm1, ls_op_ssm1_segment;

int ls_op_ssm1_shape_token(const void *p, int64_t *d);    /* x, dt, gate, y: "[B,T,D]" */
int ls_op_ssm1_shape_a(const void *p, int64_t *d);        /* "[D,N]" */
int ls_op_ssm1_shape_channels(const void *p, int64_t *d); /* D_skip: "[D]" */
int ls_op_ssm1_shape_bc(const void *p, int64_t *d);       /* LS_OP_SSM1_BC_DIMS */
int ls_op_ssm1_shape_state(const void *p, int64_t *d);    /* "[N_seq,D,N]" */
/* The gradients of the optional inputs: they exist only with them. */
int ls_op_ssm1_shape_d_skip_grad(const void *p, int64_t *d); /* "[D]" */
int ls_op_ssm1_shape_gate_grad(const void *p, int64_t *d);   /* "[B,T,D]" */
int ls_op_ssm1_shape_dt_bias(const void *p, int64_t *d);     /* "[D]", with dt_softplus */

#define LS_OP_SSM1_BC_DIMS "[B,T,G,N] ([B,T,N] without G)"

/* The sizes, options and strides fields of linseq_ssm1_problem, declared with their lengths
 * so that LS_COUNT sees them (ssm1_op.c defines them with the same: a row too many draws a
 * warning). */
#define LS_OP_SSM1_N_SIZES 5
#define LS_OP_SSM1_N_OPTIONS 4
#define LS_OP_SSM1_N_STRIDES 5
extern const ls_size_desc ls_op_ssm1_sizes[LS_OP_SSM1_N_SIZES];
extern const ls_option_desc ls_op_ssm1_options[LS_OP_SSM1_N_OPTIONS];
extern const ls_strides_desc ls_op_ssm1_strides[LS_OP_SSM1_N_STRIDES];

/* README "Benchmarks": the scan's 6 per token, channel and state. */
double ls_op_ssm1_flops(const void *p, const linseq_exec *exec);

#endif
