/* Internal: what the SSM1 and conv1d entry points share with their kernels and references.
 *
 * The entry points (ssm1.c, conv1d.c) validate the problem; the fast forwards split it into
 * independent items, one per (sequence, block of SSM_LANES channels). The backwards use one
 * item per block of channels that walks every sequence in order, so the gradients of the
 * parameters shared by sequences (A, D_skip, dt_bias, weight, bias) are summed inside one item
 * in a fixed order. Both ops walk time in the outer loop and channels in the inner loop, so
 * the reads of x along D are contiguous. The items' kernels are compiled once per ISA
 * (ssm_kernels.h); the fast paths take the ISA to run as an argument.
 *
 * Layouts (channel_first, strided inputs): the kernels address every per-token tensor through
 * an ssm_view and read token rows; a tensor whose channels are not contiguous is packed a tile
 * at a time (ssm_layout.h; conv1d packs spans of its own width in conv1d_simd.c and
 * conv1d_bwd_simd.c). */
#ifndef LS_SSM_INTERNAL_H
#define LS_SSM_INTERNAL_H

#include <stdint.h>

#include "core/device.h"
#include "core/status.h"
#include "core/validate.h"
#include "core/state_rows.h"
#include "linseq.h"
#include "simd/isa.h"

/* Channels per work item: a whole number of vectors on every ISA (4 with AVX-512), and
 * 64 channels x N states (N = 16 in Mamba checkpoints) stay in L1. */
#define SSM_LANES 64

/* Tokens [*start, *start + *len) of sequence n in the flattened [B*T] time axis. */
static inline void ssm_seq_range(const int64_t *cu_seqlens, int64_t T, int64_t n, int64_t *start,
                                 int64_t *len)
{
    if (cu_seqlens) {
        *start = cu_seqlens[n];
        *len = cu_seqlens[n + 1] - cu_seqlens[n];
    } else {
        *start = n * T;
        *len = T;
    }
}

/* The number of state rows: B, or the varlen sequence count. */
static inline int64_t ssm_seq_count(const int64_t *cu_seqlens, int64_t n_seqs, int64_t B)
{
    return cu_seqlens ? n_seqs : B;
}

/* The checks both entry points of both ops make once their argument table is complete:
 * pointers, sizes and aliasing, then the offsets in cu_seqlens, read only once its size is
 * known to be valid. */
static inline linseq_status ssm_check_table(ls_args *a, const linseq_exec *exec,
                                            const int64_t *cu_seqlens, int64_t n_seqs, int64_t B,
                                            int64_t T)
{
    linseq_status st = ls_args_validate(a);
    if (st) return st;
    /* device memory is not read here: the CUDA entry checks its host copy */
    if (cu_seqlens && !ls_on_cuda(exec))
        return ls_check_cu_seqlens(a->fn, cu_seqlens, n_seqs, B, T);
    return LINSEQ_OK;
}

/* ---- layouts of the per-token tensors (ssm_layout.c) ------------------------------------ */

/* A per-token tensor as the kernels address it: element (b, t, c, s) at
 * base[b*batch + t*token + c*channel + s*state], every stride resolved (no zero-means-dense).
 * Dense token-major is channel == 1 (rows of channels contiguous), which the kernels read in
 * place; any other layout they pack a tile at a time (ssm_layout.h). */
typedef struct ssm_view {
    const float *base;
    int64_t batch, token, channel, state;
} ssm_view;

/* The strides of a dense [B,T,C,S] (token-major) or [B,C,S,T] (channel_first) tensor. */
static inline linseq_strides ssm_dense_strides(bool channel_first, int64_t T, int64_t C, int64_t S)
{
    if (channel_first) return (linseq_strides){C * S * T, 1, S * T, T};
    return (linseq_strides){T * C * S, C * S, S, 1};
}

static inline bool ssm_strides_zero(linseq_strides s)
{
    return !s.batch && !s.token && !s.channel && !s.state;
}

/* The view of a validated input: its own strides, or the dense ones when they are all zero. */
static inline ssm_view ssm_view_of(const float *ptr, linseq_strides s, bool channel_first,
                                   int64_t T, int64_t C, int64_t S)
{
    if (ssm_strides_zero(s)) s = ssm_dense_strides(channel_first, T, C, S);
    return (ssm_view){ptr, s.batch, s.token, s.channel, s.state};
}

/* The conv's description (conv1d_op.c), which its entry points validate through. */
struct ls_op;
extern const struct ls_op ls_op_conv1d;

static inline linseq_activation ssm1_gate_activation(const linseq_ssm1_problem *p)
{
    return p->gate_activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_SILU : p->gate_activation;
}

static inline linseq_activation conv1d_activation(const linseq_conv1d_problem *p)
{
    return p->activation == LINSEQ_ACT_DEFAULT ? LINSEQ_ACT_IDENTITY : p->activation;
}

/* Where a conv state's entries lie: entry (row r, channel d, position i) of rows of L
 * positions is at r * L * D + d * channel + i * position, [D,L] rows or tap-major [L,D]. */
typedef struct conv1d_state_strides {
    int64_t channel, position;
} conv1d_state_strides;

static inline conv1d_state_strides conv1d_state_layout(const linseq_conv1d_problem *p, int64_t L)
{
    return p->state_tap_major ? (conv1d_state_strides){1, p->D} : (conv1d_state_strides){L, 1};
}

static inline int64_t conv1d_state_at(const linseq_conv1d_problem *p, int64_t r, int64_t d,
                                      int64_t i, int64_t L)
{
    const conv1d_state_strides ss = conv1d_state_layout(p, L);
    return r * L * p->D + d * ss.channel + i * ss.position;
}

/* weight[d][j] (and dweight's) at d * channel + j * tap: [D,W], or [W,D] tap-major. */
typedef struct conv1d_weight_strides {
    int64_t channel, tap;
} conv1d_weight_strides;

static inline conv1d_weight_strides conv1d_weight_layout(const linseq_conv1d_problem *p)
{
    return p->weight_tap_major ? (conv1d_weight_strides){1, p->D}
                               : (conv1d_weight_strides){p->W, 1};
}

/* The public entry points with the kernels' instruction set as an argument: linseq_X(...) is
 * ls_X_isa(..., ls_isa_active()) once LINSEQ_ISA has been checked (ls_isa_resolve). isa must
 * be one ls_isa_available() accepts. The tests call these to run every kernel the CPU can
 * run, each through the full validation. */
linseq_status ls_ssm1_forward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                                  float *hT, ls_isa isa);
linseq_status ls_ssm1_backward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                   const float *d_y, const float *d_hT,
                                   const linseq_ssm1_grads *grads, ls_isa isa);
linseq_status ls_ssm1_decode_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                 float *state, int64_t n_state_rows, const int64_t *state_rows,
                                 float *y, ls_isa isa);
/* The conv decode over a serving engine's rows (ls_op.decode_rows): one token over
 * tap-major float32 or bf16 rows, read from the source row and written to the destination
 * where they lie; what it takes (ls_op.decode_rows_takes). */
bool ls_conv1d_decode_rows_take(const linseq_conv1d_problem *p, linseq_pool_dtype dtype);
linseq_status ls_conv1d_decode_rows_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                        const ls_state_rows *rows, int64_t n_rows, float *y,
                                        ls_isa isa);
linseq_status ls_conv1d_decode_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                   float *state, int64_t n_state_rows, int64_t state_len,
                                   const int64_t *state_rows, const int64_t *cache_seqlens,
                                   float *y, ls_isa isa);
linseq_status ls_conv1d_forward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out, ls_isa isa);
linseq_status ls_conv1d_backward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads, ls_isa isa);

/* SSM1's checks of sizes, options and exec as `op` (the scan's description or the segment
 * summary's) describes them, with its input tensors appended to `a` (ssm1.c): what every entry
 * point that takes a linseq_ssm1_problem runs first. */
struct ls_op;
linseq_status ssm1_check_problem(ls_args *a, const struct ls_op *op, const linseq_ssm1_problem *p,
                                 const linseq_exec *exec);
/* A backward's rules for the grads of optional inputs (ssm1.c): no dgate without a gate, no
 * dD_skip without D_skip, no ddt_bias without dt_softplus. */
linseq_status ssm1_check_option_grads(const char *fn, const linseq_ssm1_problem *p,
                                      const linseq_ssm1_grads *g);
/* The segment summary (ssm1_segment.c) with the scan's ISA as an argument. */
linseq_status ls_ssm1_segment_forward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                          float *P, float *R, ls_isa isa);
linseq_status ls_ssm1_segment_backward_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                           const float *d_P, const float *d_R,
                                           const linseq_ssm1_grads *grads, ls_isa isa);

/* The kernels of one ISA (ssm_kernels.h), which the drivers below run. */
struct ssm_kernels;

/* The fast float32 forward of a validated problem (arguments as in linseq_ssm1_forward).
 * Returns LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, when its workspace cannot be
 * allocated. */
linseq_status ls_ssm1_scan(const linseq_ssm1_problem *p, const linseq_exec *exec,
                           const struct ssm_kernels *kern, float *y, float *hT);

/* ls_ssm1_scan for decode over a pool of states (linseq_ssm1_decode, validated): sequence b's
 * state is row rows[b] (NULL: row b) of pool [rows, D, N], advanced in place; a negative row
 * gets y = 0 and touches no state. */
linseq_status ls_ssm1_scan_pool(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                const struct ssm_kernels *kern, float *y, float *pool,
                                const int64_t *rows);

/* Tokens between two state checkpoints of the SSM1 backward: the backward stores one state per
 * segment of this many tokens and recomputes the states inside a segment, so its memory is
 * O(T / SSM_BWD_SEGMENT) states instead of O(T). */
#define SSM_BWD_SEGMENT 64

/* The fast float32 backward of a validated problem (arguments as in linseq_ssm1_backward;
 * every NULL gradient is skipped). Returns LINSEQ_ERR_OUT_OF_MEMORY, having written nothing,
 * when its workspace cannot be allocated. */
linseq_status ls_ssm1_scan_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                    const struct ssm_kernels *kern, const float *d_y,
                                    const float *d_hT, const linseq_ssm1_grads *grads);

/* ---- training without the checkpoint pass (ssm1_saved.c) -------------------------------- */

/* The saved block of linseq_ssm1_forward_train: a header of this many bytes, then the state
 * before every SSM_BWD_SEGMENT-token segment of every sequence (ceil(L / SSM_BWD_SEGMENT) per
 * sequence of L tokens, sequence after sequence), each state-major [N][D]: state n of channel
 * d of checkpoint c (counted over all sequences) is float (c*N + n)*D + d after the header. */
#define SSM1_SAVED_HEADER_BYTES 128

/* The byte size of the saved block of a problem whose sizes (and cu_seqlens) are valid;
 * LINSEQ_ERR_SIZE_OVERFLOW, naming fn, when it cannot be represented. */
linseq_status ls_ssm1_saved_size_of(const char *fn, const linseq_ssm1_problem *p, size_t *bytes);
/* The checks of a saved block of saved_bytes bytes for the validated problem p: its size, and
 * with saved != NULL (a backward) its header; then *first (malloc'ed, n_seqs + 1 entries) is
 * each sequence's first checkpoint. Failures name fn and write nothing. */
linseq_status ls_ssm1_saved_layout(const char *fn, const linseq_ssm1_problem *p, const void *saved,
                                   size_t saved_bytes, int64_t **first);
/* The header of p's block, written once the states are. */
void ls_ssm1_saved_write_header(const linseq_ssm1_problem *p, void *saved);

/* ls_ssm1_scan that also writes the checkpoints `saved` (after the header) of the layout
 * `first`, and ls_ssm1_scan_backward that reads them instead of recomputing them. */
linseq_status ls_ssm1_scan_train(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                 const struct ssm_kernels *kern, float *y, float *hT, float *saved,
                                 const int64_t *first);
linseq_status ls_ssm1_scan_backward_saved(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                          const struct ssm_kernels *kern, const float *saved,
                                          const int64_t *first, const float *d_y, const float *d_hT,
                                          const linseq_ssm1_grads *grads);

/* linseq_ssm1_forward_train / _backward_saved with the kernels' ISA as an argument. */
linseq_status ls_ssm1_forward_train_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                        float *y, float *hT, void *saved, size_t saved_bytes,
                                        ls_isa isa);
linseq_status ls_ssm1_backward_saved_isa(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                         const void *saved, size_t saved_bytes, const float *d_y,
                                         const float *d_hT, const linseq_ssm1_grads *grads,
                                         ls_isa isa);

/* The fast float32 conv1d forward and backward of a validated problem (arguments as in
 * linseq_conv1d_forward / _backward; with W == 1 the state arguments must be NULL). Return
 * LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, when their workspace cannot be
 * allocated. */
linseq_status ls_conv1d_scan(const linseq_conv1d_problem *p, const linseq_exec *exec,
                             const struct ssm_kernels *kern, float *y, float *conv_state_out);
linseq_status ls_conv1d_scan_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                      const struct ssm_kernels *kern, const float *d_y,
                                      const float *d_conv_state_out,
                                      const linseq_conv1d_grads *grads);

/* The readable references: the header's formulas transcribed literally, computed in double.
 * They assume a validated problem and accept the same in-place state (hT == h0, state_out ==
 * conv_state) as the entry points. The float versions round to float32 on store; the _f64
 * versions keep double outputs (the finite-difference tests evaluate the loss with them). The
 * SSM1 ones return LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, if their state row cannot
 * be allocated. */
linseq_status ls_ssm1_reference(const linseq_ssm1_problem *p, float *y, float *hT);
linseq_status ls_ssm1_reference_f64(const linseq_ssm1_problem *p, double *y, double *hT);
void ls_conv1d_reference(const linseq_conv1d_problem *p, float *y, float *state_out);
void ls_conv1d_reference_f64(const linseq_conv1d_problem *p, double *y, double *state_out);

/* linseq_conv1d_decode in double, as its header words it (test code; a validated call): the
 * pool is updated in place (copies, exact), y is [B,T,D] token-major in double whatever the
 * problem's layout; LINSEQ_ERR_OUT_OF_MEMORY, nothing written, when its rows cannot be
 * allocated. The other references read dense token-major problems only. */
linseq_status ls_conv1d_decode_reference(const linseq_conv1d_problem *p, float *state,
                                         int64_t state_len, const int64_t *rows,
                                         const int64_t *cache_seqlens, double *y);

/* The reference backwards' outputs: linseq_ssm1_grads / linseq_conv1d_grads in double, with
 * the same shapes and the same meaning (NULL = not computed, non-NULL = overwritten). */
typedef struct ls_ssm1_grads_f64 {
    double *dx, *ddt, *dA, *dB_proj, *dC_proj, *dD_skip, *dgate, *dh0, *ddt_bias;
} ls_ssm1_grads_f64;

typedef struct ls_conv1d_grads_f64 {
    double *dx, *dweight, *dbias, *dconv_state;
} ls_conv1d_grads_f64;

/* Reverse mode of the references' recurrences in double, every state of the current (sequence,
 * channel) kept (test code: (T + 1) N doubles). Arguments as the backward entry points,
 * validated. Return LINSEQ_ERR_OUT_OF_MEMORY, having written nothing, when their buffers cannot
 * be allocated. */
linseq_status ls_ssm1_backward_reference(const linseq_ssm1_problem *p, const float *d_y,
                                         const float *d_hT, const ls_ssm1_grads_f64 *grads);
linseq_status ls_conv1d_backward_reference(const linseq_conv1d_problem *p, const float *d_y,
                                           const float *d_conv_state_out,
                                           const ls_conv1d_grads_f64 *grads);

#endif
