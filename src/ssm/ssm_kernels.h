/* Internal: the plans the SSM1 and conv1d drivers (ssm1_scan.c, ssm1_scan_bwd.c, conv1d.c,
 * conv1d_bwd.c) hand to their work-item kernels, which live in *_simd.c sources compiled once
 * per ISA. A driver validates nothing (its caller did), sizes and allocates the per-thread
 * workspace and runs the item kernel of the table it is given (ssm_kernels, one per ISA) over
 * the items with ls_parallel_for; each item function has the ls_item_fn signature and takes its
 * plan as the context. */
#ifndef LS_SSM_KERNELS_H
#define LS_SSM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/state_rows.h"
#include "linseq.h"
#include "simd/isa.h"
#include "ssm/ssm_internal.h"

/* ---- SSM1 forward: one item per (sequence, blocks of SSM_LANES channels) --------------- */

typedef struct ssm1_scan_plan {
    const linseq_ssm1_problem *p;
    int64_t G, channels_per_group, n_blocks;
    int64_t blocks_per_item; /* consecutive blocks of one sequence per work item */
    linseq_activation gate_act;
    ssm_view x, dt, gate, B, C; /* the per-token inputs in their layouts (ssm_layout.h) */
    int64_t bc_groups;          /* groups per B/C tile (0: B and C are read in place) */
    float *y, *hT;
    /* Decode over a pool: sequence s's state is row pool_rows[s] (NULL: row s) of pool, read
     * and written in place (h0 and hT unused); a negative row gets y = 0. NULL: no pool. */
    float *pool;
    const int64_t *pool_rows;
    float *workspace;     /* per thread: thread_floats, 64-byte aligned */
    size_t thread_floats; /* SSM1_SCAN_FLOATS(N, bc_groups) */
    /* Training: the checkpoints of the saved block (ssm_internal.h), written at every
     * SSM_BWD_SEGMENT-th token; saved_first[seq] is sequence seq's first. NULL: none. */
    float *saved;
    const int64_t *saved_first;
} ssm1_scan_plan;

/* Tokens whose step inputs (dt after softplus, dt x, act(gate)) are computed in one pass
 * before their state updates, so that the long latency of softplus and the activation
 * overlaps across tokens instead of stalling each token's updates. */
#define SSM1_SCAN_CHUNK 16

/* Tokens per layout tile (ssm_layout.h): a channel-first input is packed, and a channel-first
 * y written back, this many tokens at a time (256 bytes of each channel's row, whole cache
 * lines read in order). */
#define SSM1_SCAN_PACK 64

/* Per thread: four [N][SSM_LANES] tiles (the state, A transposed, and B_t, C_t spread over the
 * lanes of a block spanning groups), three [SSM1_SCAN_CHUNK][SSM_LANES] rows of step inputs
 * (dt, dt x, act(gate)), four [SSM1_SCAN_PACK][SSM_LANES] layout tiles of x, dt, gate and y,
 * and two [SSM1_SCAN_PACK][bc_groups][N] tiles of B and C. */
#define SSM1_SCAN_FLOATS(N, bc_groups)                                                             \
    (4 * (N)*SSM_LANES + 3 * SSM1_SCAN_CHUNK * SSM_LANES + 4 * SSM1_SCAN_PACK * SSM_LANES +        \
     2 * SSM1_SCAN_PACK * (bc_groups) * (N))

LS_ISA_DECLARE(void, ls_ssm1_scan_item, (void *plan, int64_t item, int thread));

/* ---- SSM1 backward: one item per block of channels inside one group -------------------- */

typedef struct ssm1_bwd_plan {
    const linseq_ssm1_problem *p;
    const float *d_y, *d_hT;
    const linseq_ssm1_grads *grads;
    int64_t G, channels_per_group, blocks_per_group, n_blocks, n_tokens;
    int64_t max_segments; /* of the longest sequence, at least 1 */
    linseq_activation gate_act;
    ssm_view x, dt, gate, B, C, dy; /* the per-token inputs and d_y in their layouts */
    float *dB_partial, *dC_partial; /* [n_blocks][n_tokens][N], or NULL (written directly) */
    /* The forward's checkpoints (ssm1_scan_plan.saved), read instead of recomputed; then
     * max_segments is 1 (one checkpoint tile per thread). NULL: the checkpoint pass runs. */
    const float *saved;
    const int64_t *saved_first;
    float *workspace;
    size_t thread_floats; /* the layout below */
} ssm1_bwd_plan;

/* Per thread, in this order (L = SSM_LANES): checkpoints [max_segments][N][L], the segment's
 * states and decays [SEGMENT][N][L] each, SSM1_BWD_SEG_ROWS per-token inputs [SEGMENT][L]
 * each (dt, dt x, gy, the softplus and gate slopes), the tiles rate, dh and the two dA sums
 * [4][N][L], the per-token dB and dC rows [2][N rounded up to 16][16], four lane vectors
 * [4][L] (the dD_skip and ddt_bias sums), then the layout tiles of a segment (ssm_layout.h):
 * SSM1_BWD_LAYOUT_ROWS [SEGMENT][L] (x, dt, gate, d_y, dx, ddt, dgate) and B, C
 * [SEGMENT][N rounded up to 16] each. */
#define SSM1_BWD_SEG_ROWS 5
#define SSM1_BWD_LAYOUT_ROWS 7

LS_ISA_DECLARE(void, ls_ssm1_bwd_item, (void *plan, int64_t item, int thread));

/* dB and dC of SSM1_REDUCE_TOKENS tokens: each group's partials added in block order. */
#define SSM1_REDUCE_TOKENS 256
LS_ISA_DECLARE(void, ls_ssm1_bwd_reduce_item, (void *plan, int64_t item, int thread));

/* ---- conv1d: items of (sequence, channel span, token chunk) forward, blocks backward ----- */

typedef struct conv1d_plan {
    const linseq_conv1d_problem *p;
    int64_t n_blocks;              /* forward: channel spans; backward: items */
    int64_t chunk, n_chunks;       /* forward: tokens per item, items per sequence */
    int64_t blocks_per_item, ring; /* backward: blocks per item, rows of ring of g */
    linseq_activation act;
    ssm_view x;                       /* x in its layout */
    bool x_tiled;                     /* x's channels are not contiguous: packed in tiles */
    bool bf16;                        /* forward: x and y bfloat16 (dense [B,T,D]), in place */
    float *y, *state_out;             /* forward */
    const float *d_y, *d_state_out;   /* backward */
    const linseq_conv1d_grads *grads; /* backward */
    float *workspace;
    size_t thread_floats;
} conv1d_plan;

/* Forward items: channels per item (8 blocks: a token's row of them is 2 KiB, read and written
 * contiguously), and at least this many tokens per item (at least W-1, so that only the first
 * chunk of a sequence reads its conv state). */
#define CONV1D_SPAN (8 * SSM_LANES)
#define CONV1D_CHUNK 64

/* Per-thread rows: forward 2W rows of CONV1D_SPAN floats (the taps [W], the conv state's
 * columns [W-1], one spare), backward 4W + 1 + ring rows of SSM_LANES per block of the item
 * (taps, the two dweight sums [W] each, the state's columns [W-1], the two dbias sums, the
 * ring of g). */
#define CONV1D_FWD_FLOATS(W) (2 * (W)*CONV1D_SPAN)
/* Forward in another layout, after those: x's tile [chunk + W-1][CONV1D_SPAN] when x_tiled, and
 * y's [chunk][CONV1D_SPAN] with channel_first (ssm_layout.h's approach, a span wide). */
#define CONV1D_FWD_TILE_FLOATS(W, chunk, x_tiled, channel_first)                                   \
    ((((x_tiled) ? (chunk) + (W)-1 : 0) + ((channel_first) ? (chunk) : 0)) * CONV1D_SPAN)
#define CONV1D_BWD_ROWS(W, ring) (4 * (W) + 1 + (ring))

/* Backward: tokens whose g (d_y times the activation's slope) is computed in one pass before
 * their sums; the ring of g then holds at least CONV1D_BWD_CHUNK + W - 1 rows (a power of two,
 * conv1d_plan.ring). */
#define CONV1D_BWD_CHUNK 16

/* Backward items: at most this many blocks each (a token's rows of them read and written
 * contiguously), fewer when that would leave fewer than 4 items per thread. */
#define CONV1D_BWD_MAX_BLOCKS 4

/* Backward: tokens per chunk of a sequence (conv1d_bwd_simd.c), and in another layout the
 * per-thread tiles after the blocks' rows, `wide` = blocks_per_item * SSM_LANES columns each:
 * x [PACK + W-1], d_y [PACK], dx [max(PACK, W-1)] rows. */
#define CONV1D_BWD_PACK 64
#define CONV1D_BWD_TILE_ROWS(W)                                                                    \
    (2 * CONV1D_BWD_PACK + (W)-1 + ((W)-1 > CONV1D_BWD_PACK ? (W)-1 : CONV1D_BWD_PACK))

LS_ISA_DECLARE(void, ls_conv1d_item, (void *plan, int64_t item, int thread));
LS_ISA_DECLARE(void, ls_conv1d_bwd_item, (void *plan, int64_t item, int thread));

/* ---- conv1d decode: one item per request ---------------------------------------------- */

typedef struct conv1d_decode_plan {
    const linseq_conv1d_problem *p;
    ssm_view x;
    float *y, *state;
    int64_t state_len;
    const int64_t *rows, *cache_seqlens;
    bool bf16; /* x and y bfloat16 (tap-major span only) */
    /* a serving engine's rows (linseq_op_decode_pool; tap-major span only, float32 or bf16):
     * state, rows unused */
    const ls_state_rows *by_row;
    linseq_activation act;
    float *workspace;
    size_t thread_floats; /* CONV1D_DECODE_FLOATS(W, T) */
} conv1d_decode_plan;

/* Per thread: the taps [W][SSM_LANES], the window [W-1+T][SSM_LANES] and y's tile
 * [T][SSM_LANES]. */
#define CONV1D_DECODE_FLOATS(W, T) ((2 * (W) + 2 * (T)) * SSM_LANES)

LS_ISA_DECLARE(void, ls_conv1d_decode_item, (void *plan, int64_t item, int thread));

/* One token per request over tap-major rows without cache_seqlens, x's channels contiguous: one
 * item per span of CONV1D_SPAN channels, over every request (the span's taps, [W][CONV1D_SPAN]
 * per thread, transposed once for all of them). */
#define CONV1D_DECODE_SPAN_FLOATS(W) ((W)*CONV1D_SPAN)
LS_ISA_DECLARE(void, ls_conv1d_decode_span_item, (void *plan, int64_t item, int thread));
/* The same, rounding bf16 rows by AVX512-BF16's instruction on the AVX-512 kernels (run only
 * where ls_cpu_has_bf16_dot; every other ISA: the integer rounding, the same bits). */
LS_ISA_DECLARE(void, ls_conv1d_decode_span_item_bf16, (void *plan, int64_t item, int thread));

/* ---- the activations as the kernels compute them, over arrays (for tests) ------------- */

typedef enum ls_ssm_vfn {
    LS_SSM_VACT = 0,          /* act(x) */
    LS_SSM_VACT_GRAD = 1,     /* act'(x) */
    LS_SSM_VSOFTPLUS = 2,     /* softplus(x), threshold 20 */
    LS_SSM_VSOFTPLUS_GRAD = 3 /* softplus'(x) */
} ls_ssm_vfn;

/* y[i] = fn(x[i]) for i < n with the kernels' vector forms (act resolved); y may equal x. */
LS_ISA_DECLARE(void, ls_ssm_vmath_n,
               (ls_ssm_vfn fn, linseq_activation act, int64_t n, const float *x, float *y));

/* ---- the kernels of one ISA ------------------------------------------------------------ */

typedef struct ssm_kernels {
    ls_isa isa;
    void (*ssm1_scan_item)(void *plan, int64_t item, int thread);
    void (*ssm1_bwd_item)(void *plan, int64_t item, int thread);
    void (*ssm1_bwd_reduce_item)(void *plan, int64_t item, int thread);
    void (*conv1d_item)(void *plan, int64_t item, int thread);
    void (*conv1d_bwd_item)(void *plan, int64_t item, int thread);
    void (*conv1d_decode_item)(void *plan, int64_t item, int thread);
    void (*conv1d_decode_span_item)(void *plan, int64_t item, int thread);
    void (*conv1d_decode_span_item_bf16)(void *plan, int64_t item, int thread);
    void (*vmath_n)(ls_ssm_vfn fn, linseq_activation act, int64_t n, const float *x, float *y);
} ssm_kernels;

/* The table of isa, which must be one ls_isa_available() accepts. */
const ssm_kernels *ls_ssm_kernels(ls_isa isa);

#endif
