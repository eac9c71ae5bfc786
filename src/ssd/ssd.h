/* Internal: the SSD op (linseq_ssd_forward, linseq_ssd_decode): its plan, its kernels (one per
 * ISA, ssd_simd.c) and the entry points per ISA (for the tests). */
#ifndef LS_SSD_SSD_H
#define LS_SSD_SSD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/state_rows.h"
#include "linseq.h"
#include "simd/isa.h"

/* The descriptions of the op and of its segment summary (ssd_op.c), which their entry points
 * (ssd.c, ssd_segment.c) validate through. */
struct ls_op;
extern const struct ls_op ls_op_ssd, ls_op_ssd_segment;

/* The groups of B and C: G, or 1 when G is 0. */
static inline int64_t ls_ssd_groups(const linseq_ssd_problem *p) { return p->G ? p->G : 1; }

/* The sequences, each with its state row: the batch rows, or n_seqs with cu_seqlens. */
static inline int64_t ls_ssd_state_rows(const linseq_ssd_problem *p)
{
    return p->cu_seqlens ? p->n_seqs : p->B;
}

/* Per token and head, the recurrence's 4 P N. */
double ls_ssd_flops(const void *p, const linseq_exec *exec);

/* Tokens per chunk of the chunked form: exec->chunk_size (16, 32, 64 or 128; 0 = 64). */
#define SSD_DEFAULT_CHUNK 64

/* One call's work. Item i is (sequence i / H, head i % H): a sequence is batch row b, or the
 * tokens [cu[s], cu[s+1]) of row 0 with cu_seqlens. Its state is row rows[s] (NULL: row s) of
 * s0 (read; NULL: zeros) and of sT (written; NULL: not written); a negative row is a padding
 * request (y = 0, no state touched). The forward passes h0 and hT (possibly the same buffer),
 * decode the pool as both. Each thread works in its own `scratch_floats` floats of scratch. */
typedef struct ssd_plan {
    int64_t T, H, P, N, G;
    const int64_t *cu; /* NULL: B sequences of T tokens */
    const float *x, *dt, *A, *Bp, *Cp, *D, *z, *dt_bias;
    float *y;
    const float *s0;
    float *sT;
    const int64_t *rows;
    const ls_state_rows *by_row; /* a decode over a serving engine's rows (rows unused) */
    bool dt_softplus, D_per_channel, n_first, chunked;
    int64_t chunk;        /* tokens per chunk (chunked) */
    float dt_min, dt_max; /* clamp when dt_max > dt_min */
    /* The chunked forward's products that only y reads take bf16 operands (exec->products,
     * simd/gemm_bf16.h): C B^T, C St and M U between 16-token blocks; in the backward those
     * that only the tokens' gradients read (ssd_bwd_simd.c), never those of the gradient at
     * the state; bf16_dot: on vdpbf16ps (the AVX-512 kernels, on a CPU with AVX512-BF16).
     * Never set for decode, the recurrent mode or the segment summary. */
    bool bf16_products, bf16_dot;
    /* A decode's bf16 rows rounded by vcvtneps2bf16 (the AVX-512 kernels, on a CPU with
     * AVX512-BF16): the integer rounding's bits, faster. */
    bool round_by_instruction;
    float *scratch;
    int64_t scratch_floats;

    /* The backward (ls_ssd_bwd_item): the upstream gradients, the per-token gradients, dh0,
     * and per item (sequence, head) slots of the per-head sums, which the entry point adds
     * up over the sequences in order: dA and ddt_bias one float each, dD one (per head) or P
     * (D_per_channel). dBh and dCh [tokens,H,N]: each head's share of dB_proj and dC_proj,
     * added over the group's heads in order afterwards (NULL when G == H: written directly). */
    const float *d_y, *d_hT;
    float *dx, *ddt, *dB, *dC, *dz, *dh0;
    float *dBh, *dCh;
    int64_t n_tokens; /* B T: the rows of dBh and dCh */
    float *item_dA, *item_dD, *item_dbias;
} ssd_plan;

/* A scratch part's floats, rounded to whole 64-byte lines. */
static inline int64_t ssd_round16(int64_t n) { return (n + 15) / 16 * 16; }

/* The floats of scratch one thread needs for a plan's sizes: recurrent, the state St [N,P]
 * and a row of P; chunked, the parts ssd_simd.c carves (the state, C [L,N], B^T [N,L], U, W
 * and Y [L,P], M [L,L], four rows of L and one of N, L the chunk). */
static inline int64_t ssd_scratch_floats(int64_t P, int64_t N, bool chunked, int64_t L)
{
    if (!chunked) return ssd_round16(N * P) + ssd_round16(P);
    return ssd_round16(N * P) + 2 * ssd_round16(L * N) + 3 * ssd_round16(L * P) +
           ssd_round16(L * L) + 4 * ssd_round16(L) + ssd_round16(N);
}

/* Tokens per row block of M U with bf16 products: the products between blocks take bf16
 * operands, each block's own triangle stays float32 (no product visits a later token). */
#define SSD_BF16_BLOCK 16

/* With bf16 products, the 32-bit words of each packed operand, in the order they lie after
 * the chunked scratch, each part rounded up to 16 words (gemm_bf16.h's layouts): C by rows
 * [L, ceil(N/2)], B^T by pairs [ceil(N/2), L], St by pairs [ceil(N/2), P], M by rows [L, L/2]
 * and U by pairs [L/2, P]. ssd_bf16_words sums them; ssd_kernel.h's carve_words lays them
 * out. */
enum { SSD_BF16_PARTS = 5, SSD_BWD_BF16_PARTS = 13 };
static inline void ssd_bf16_parts(int64_t P, int64_t N, int64_t L, int64_t words[SSD_BF16_PARTS])
{
    const int64_t Nw = (N + 1) / 2, Lw = L / 2;
    const int64_t w[SSD_BF16_PARTS] = {L * Nw, L * Nw, Nw * P, L * Lw, Lw * P};
    for (int i = 0; i < SSD_BF16_PARTS; i++) words[i] = w[i];
}

/* The backward's own parts, after the forward's (ssd_bwd_simd.c's carve_bwd_words, in this
 * order): dY by rows [L, P/2] and by pairs [L/2, P], U^T [P/2, L], S_prev^T [P/2, N], dS^T
 * [P/2, N], Q o E by rows [L, L/2] and by pairs [L/2, L], B and C by pairs [L/2, N], diag(w) U
 * by rows [L, P/2], diag(w) B by rows [L, N/2], dS by pairs [N/2, P], M by pairs [L/2, L]. */
static inline void ssd_bwd_bf16_parts(int64_t P, int64_t N, int64_t L,
                                      int64_t words[SSD_BWD_BF16_PARTS])
{
    const int64_t Pw = (P + 1) / 2, Nw = (N + 1) / 2, Lw = L / 2;
    const int64_t w[SSD_BWD_BF16_PARTS] = {L * Pw, Lw * P, Pw * L, Pw * N, Pw * N, L * Lw, Lw * L,
                                           Lw * N, Lw * N, L * Pw, L * Nw, Nw * P, Lw * L};
    for (int i = 0; i < SSD_BWD_BF16_PARTS; i++) words[i] = w[i];
}

static inline int64_t ssd_bf16_words(int64_t P, int64_t N, int64_t L)
{
    int64_t w[SSD_BF16_PARTS], sum = 0;
    ssd_bf16_parts(P, N, L, w);
    for (int i = 0; i < SSD_BF16_PARTS; i++) sum += ssd_round16(w[i]);
    return sum;
}

static inline int64_t ssd_bwd_bf16_words(int64_t P, int64_t N, int64_t L)
{
    int64_t w[SSD_BWD_BF16_PARTS], sum = ssd_bf16_words(P, N, L);
    ssd_bwd_bf16_parts(P, N, L, w);
    for (int i = 0; i < SSD_BWD_BF16_PARTS; i++) sum += ssd_round16(w[i]);
    return sum;
}

/* The backward's scratch: the chunked forward's, its own blocks, and the state before each
 * chunk of the longest sequence (recomputed from h0, then walked back); with bf16 products
 * ssd_bwd_bf16_words more after them. */
static inline int64_t ssd_bwd_scratch_floats(int64_t P, int64_t N, int64_t L, int64_t longest)
{
    const int64_t chunks = (longest + L - 1) / L;
    return ssd_scratch_floats(P, N, true, L) + 4 * ssd_round16(L * N) + 4 * ssd_round16(L * P) +
           ssd_round16(L * L) + ssd_round16(P * L) + 3 * ssd_round16(N * P) + ssd_round16(L) +
           (chunks > 0 ? chunks : 1) * ssd_round16(N * P);
}

/* The item functions of ls_parallel_for over an ssd_plan: the forward (and decode), and the
 * backward. */
LS_ISA_DECLARE(void, ls_ssd_item, (void *ctx, int64_t item, int thread));
LS_ISA_DECLARE(void, ls_ssd_bwd_item, (void *ctx, int64_t item, int thread));

/* What the entry points share with the segment summary's: the problem's checks against a
 * description `op` (its input tensors appended to `a`), the checks of values after
 * ls_args_validate, and the forward and backward runs of a validated problem. y NULL: the
 * final states only (the outputs are not computed). */
struct ls_args;
linseq_status ls_ssd_check_problem(struct ls_args *a, const struct ls_op *op,
                                   const linseq_ssd_problem *p, const linseq_exec *exec);
linseq_status ls_ssd_check_values(const char *fn, const struct ls_op *op,
                                  const linseq_ssd_problem *p, const linseq_exec *exec);
linseq_status ls_ssd_run_forward(const char *fn, const linseq_ssd_problem *p,
                                 const linseq_exec *exec, ls_isa isa, float *y, float *hT);
/* products: whether exec->products applies (the SSD backward; not the segment summary's,
 * whose forward has no product that only y reads). */
linseq_status ls_ssd_run_backward(const char *fn, const linseq_ssd_problem *p,
                                  const linseq_exec *exec, ls_isa isa, const float *d_y,
                                  const float *d_hT, const linseq_ssd_grads *g, bool products);

/* The entry points with the ISA chosen (linseq_ssd_* resolve it from the CPU). */
linseq_status ls_ssd_forward_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *y,
                                 float *hT, ls_isa isa);
linseq_status ls_ssd_backward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                  const float *d_y, const float *d_hT, const linseq_ssd_grads *g,
                                  ls_isa isa);
linseq_status ls_ssd_segment_forward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                         float *P_out, float *R, ls_isa isa);
linseq_status ls_ssd_segment_backward_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                          const float *d_P, const float *d_R,
                                          const linseq_ssd_grads *grads, ls_isa isa);
/* linseq_ssd_decode over a serving engine's rows (ls_op.decode_rows): each head's state read
 * from its source row and written to its destination where they lie, through the thread's
 * scratch unless the row is float32 and its own destination. */
linseq_status ls_ssd_decode_rows_isa(const linseq_ssd_problem *p, const linseq_exec *exec,
                                     const ls_state_rows *rows, int64_t n_rows, float *y,
                                     ls_isa isa);
linseq_status ls_ssd_decode_isa(const linseq_ssd_problem *p, const linseq_exec *exec, float *state,
                                int64_t n_state_rows, const int64_t *state_rows, float *y,
                                ls_isa isa);

#endif
