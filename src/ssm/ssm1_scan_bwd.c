/* The fast SSM1 backward: reverse mode of the recurrence with checkpointed states.
 *
 * Per channel d and state n, with a_t = exp(A dt_t), gy_t = d_y_t act(gate_t) and dh the
 * gradient of L with respect to a state:
 *     adj_t     = dh_t + C_t gy_t               (dh_T = d_hT; everything L gets from h_t)
 *     dh_{t-1}  = a_t adj_t                     (dh0 = what is left at the sequence start)
 *     dx_t      = dt_t sum_n adj_t B_t + D gy_t
 *     ddt_t     = sum_n adj_t (B_t x_t + A a_t h_{t-1})    (times softplus' with dt_softplus)
 *     dA       += adj_t dt_t a_t h_{t-1}
 *     dB_t[g]  += adj_t dt_t x_t,   dC_t[g] += gy_t h_t     (over the channels of group g)
 *     dgate_t   = d_y_t (sum_n h_t C_t + D x_t) act'(gate_t)
 * The reverse walk needs h_{t-1} and a_t for every token. Storing one state per token would
 * take T D N floats (6 GiB at T = 64k for one Mamba-130m layer), so a forward pass keeps only
 * the state before every segment of SSM_BWD_SEGMENT tokens; the reverse walk then recomputes
 * one segment at a time into a SEGMENT-deep buffer of states and decays, from its checkpoint,
 * with the forward's arithmetic (so the states are bitwise the forward's). h_{t-1} is read
 * from that buffer, never recovered by dividing h_t by a_t: a_t underflows to 0 for
 * A dt < -104.
 *
 * Work items are blocks of up to SSM_LANES channels inside one group of B_proj/C_proj (the
 * blocks of group 0, then of group 1, ...), each walking every sequence in order. A block then
 * owns its rows of dx, ddt, dgate, dh0 and its channels of dA, dD_skip, ddt_bias, which it sums
 * over all tokens in a fixed order; B_t and C_t are one scalar per state for the whole block.
 * dB_proj and dC_proj sum over the channels of a group: a group of one block writes them
 * directly, otherwise each block writes its own partial rows ([tokens][N] each) and a second
 * pass adds the partials of each group in block order, in parallel over tokens. No result
 * depends on which thread ran which item, so results are bitwise identical for every thread
 * count.
 *
 * Extra memory (floats):
 *     2 * n_blocks * B*T * N      dB/dC partials, only for groups of more than SSM_LANES
 *                                 channels (n_blocks = G * ceil((D/G) / SSM_LANES))
 *   + n_threads * (ceil(L / SEGMENT) + 2 * SEGMENT) * SSM_LANES * N
 *                                 checkpoints of the longest sequence L, and the segment's
 *                                 states and decays (about 4.7 MB per thread at L = 64k,
 *                                 N = 16), plus O(SSM_LANES * (N + SEGMENT)) small buffers.
 * Keeping the decays costs one extra segment buffer and saves recomputing one exp per state
 * update in the reverse walk, the dominant cost. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "core/matmul.h"
#include "core/parallel.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

#define SEGMENT SSM_BWD_SEGMENT

/* Tokens per item of the pass that adds the dB/dC partials. */
#define REDUCE_TOKENS 256

typedef struct bwd_plan {
    const linseq_ssm1_problem *p;
    const float *d_y, *d_hT;
    const linseq_ssm1_grads *grads;
    int64_t G, channels_per_group, blocks_per_group, n_blocks, n_tokens;
    int64_t max_segments; /* of the longest sequence, at least 1                          */
    linseq_activation gate_act;
    float *dB_partial, *dC_partial; /* [n_blocks][n_tokens][N], or NULL (written directly) */
    float *workspace;
    size_t thread_floats;
} bwd_plan;

/* One thread's buffers ([N][SSM_LANES] tiles are state-major like the forward's). */
typedef struct bwd_tile {
    float *checkpoints; /* [max_segments][N][SSM_LANES] the state before each segment      */
    float *seg_h;       /* [SEGMENT][N][SSM_LANES] h_t of each token of the segment        */
    float *seg_decay;   /* [SEGMENT][N][SSM_LANES] a_t                                      */
    float *seg_dt;      /* [SEGMENT][SSM_LANES] dt_t after softplus                         */
    float *rate;        /* [N][SSM_LANES] A of the block, transposed                        */
    float *dh;          /* [N][SSM_LANES] the gradient reaching the current state           */
    float *dA_sum, *dA_seg; /* [N][SSM_LANES]: over all tokens, over the current segment    */
    float *adj;         /* [SSM_LANES] adj_t of one state row                               */
    float *x, *dtx, *gy, *dx_acc, *ddt_acc, *pre; /* [SSM_LANES] of the current token       */
    float *dD_sum, *dD_seg, *dbias_sum, *dbias_seg; /* [SSM_LANES]                          */
} bwd_tile;

enum { TILE_ROWS = 4, LANE_VECTORS = 11 };

static bwd_tile tile_of_thread(const bwd_plan *pl, int thread)
{
    const size_t rows = (size_t)pl->p->N * SSM_LANES;
    float *w = pl->workspace + (size_t)thread * pl->thread_floats;
    bwd_tile tl;
    tl.checkpoints = w;
    w += (size_t)pl->max_segments * rows;
    tl.seg_h = w;
    w += SEGMENT * rows;
    tl.seg_decay = w;
    w += SEGMENT * rows;
    tl.seg_dt = w;
    w += SEGMENT * SSM_LANES;
    tl.rate = w;
    tl.dh = w + rows;
    tl.dA_sum = w + 2 * rows;
    tl.dA_seg = w + 3 * rows;
    w += TILE_ROWS * rows;
    float **lane_vectors[LANE_VECTORS] = {&tl.adj,    &tl.x,      &tl.dtx,    &tl.gy,
                                          &tl.dx_acc, &tl.ddt_acc, &tl.pre,   &tl.dD_sum,
                                          &tl.dD_seg, &tl.dbias_sum, &tl.dbias_seg};
    for (int i = 0; i < LANE_VECTORS; i++) *lane_vectors[i] = w + (size_t)i * SSM_LANES;
    return tl;
}

/* dt after softplus and dt * x for the lanes of one token: the forward's arithmetic. */
static void step_inputs(const bwd_plan *pl, int64_t tok, int64_t d0, int64_t lanes, float *dt,
                        float *dtx)
{
    const linseq_ssm1_problem *p = pl->p;
    const float *x_t = p->x + tok * p->D + d0;
    const float *dt_t = p->dt + tok * p->D + d0;
    for (int64_t l = 0; l < lanes; l++) {
        float v = dt_t[l];
        if (p->dt_softplus) v = ls_softplusf(v + (p->dt_bias ? p->dt_bias[d0 + l] : 0.0f));
        dt[l] = v;
        dtx[l] = v * x_t[l];
    }
}

/* The update of one state row, in place (checkpoint pass) and into a new row (segment
 * recompute). The same expression as the forward's update_state_row, so that the three passes
 * produce the same bits. Called with lanes == SSM_LANES (a literal) for full blocks, which
 * gcc vectorises at -O2 after inlining. */
static inline void step_row_in_place(int64_t lanes, float *restrict h, const float *restrict rate,
                                     const float *restrict dt, const float *restrict dtx,
                                     float *restrict decay, float b)
{
    for (int64_t l = 0; l < lanes; l++) decay[l] = expf(rate[l] * dt[l]);
    for (int64_t l = 0; l < lanes; l++) h[l] = decay[l] * h[l] + dtx[l] * b;
}

static inline void step_row_into(int64_t lanes, const float *restrict h_prev, float *restrict h,
                                 const float *restrict rate, const float *restrict dt,
                                 const float *restrict dtx, float *restrict decay, float b)
{
    for (int64_t l = 0; l < lanes; l++) decay[l] = expf(rate[l] * dt[l]);
    for (int64_t l = 0; l < lanes; l++) h[l] = decay[l] * h_prev[l] + dtx[l] * b;
}

/* One state row of one token in reverse: see the formulas at the top. dh holds dh_t on entry
 * and dh_{t-1} on return; adj receives adj_t for the dB dot product. */
static inline void reverse_row(int64_t lanes, float *restrict dh, float *restrict adj,
                               const float *restrict h, const float *restrict h_prev,
                               const float *restrict decay, const float *restrict rate,
                               const float *restrict gy, const float *restrict x,
                               const float *restrict dt, float *restrict dx_acc,
                               float *restrict ddt_acc, float *restrict dA_seg,
                               float *restrict pre, float b, float c)
{
    for (int64_t l = 0; l < lanes; l++) {
        const float adj_l = dh[l] + c * gy[l];
        const float decayed_prev = decay[l] * h_prev[l];
        dx_acc[l] += adj_l * b;
        ddt_acc[l] += adj_l * (b * x[l] + rate[l] * decayed_prev);
        dA_seg[l] += adj_l * dt[l] * decayed_prev;
        dh[l] = decay[l] * adj_l;
        adj[l] = adj_l;
        pre[l] += h[l] * c;
    }
}

static inline void add_lanes(int64_t lanes, float *restrict sum, float *restrict part)
{
    for (int64_t l = 0; l < lanes; l++) {
        sum[l] += part[l];
        part[l] = 0.0f;
    }
}

/* Where one block writes its dB (or dC) rows: the gradient itself (row stride G*N) when its
 * group has one block, else its partial buffer (row stride N). */
typedef struct proj_rows {
    float *base;
    int64_t stride;
} proj_rows;

typedef struct block {
    int64_t group, d0, lanes;
    bool full;
    proj_rows dB, dC;
} block;

/* Recomputes the states of tokens [seg_start, seg_start + seg_len) of one block from the state
 * before them (prev, [N][SSM_LANES]). */
static void recompute_segment(const bwd_plan *pl, const bwd_tile *tl, const block *bk,
                              int64_t seg_start, int64_t seg_len, const float *prev)
{
    const int64_t N = pl->p->N, lanes = bk->lanes;
    const size_t rows = (size_t)N * SSM_LANES;
    for (int64_t i = 0; i < seg_len; i++) {
        const int64_t tok = seg_start + i;
        float *dt = tl->seg_dt + i * SSM_LANES;
        step_inputs(pl, tok, bk->d0, lanes, dt, tl->dtx);
        const float *B_t = pl->p->B_proj + (tok * pl->G + bk->group) * N;
        const float *h_prev = i ? tl->seg_h + (size_t)(i - 1) * rows : prev;
        float *h = tl->seg_h + (size_t)i * rows, *decay = tl->seg_decay + (size_t)i * rows;
        for (int64_t n = 0; n < N; n++) {
            const size_t r = (size_t)n * SSM_LANES;
            if (bk->full)
                step_row_into(SSM_LANES, h_prev + r, h + r, tl->rate + r, dt, tl->dtx,
                              decay + r, B_t[n]);
            else
                step_row_into(lanes, h_prev + r, h + r, tl->rate + r, dt, tl->dtx, decay + r,
                              B_t[n]);
        }
    }
}

/* Token seg_start + i of a recomputed segment, in reverse. */
static void reverse_token(const bwd_plan *pl, const bwd_tile *tl, const block *bk,
                          int64_t seg_start, int64_t i, const float *prev)
{
    const linseq_ssm1_problem *p = pl->p;
    const linseq_ssm1_grads *g = pl->grads;
    const int64_t D = p->D, N = p->N, lanes = bk->lanes, d0 = bk->d0;
    const int64_t tok = seg_start + i;
    const size_t rows = (size_t)N * SSM_LANES;
    const float *dt = tl->seg_dt + i * SSM_LANES;
    const float *x_t = p->x + tok * D + d0, *d_y = pl->d_y + tok * D + d0;
    const float *gate = p->gate ? p->gate + tok * D + d0 : NULL;
    for (int64_t l = 0; l < lanes; l++) {
        tl->x[l] = x_t[l];
        tl->dtx[l] = dt[l] * x_t[l];
        tl->gy[l] = gate ? d_y[l] * ls_activate(pl->gate_act, gate[l]) : d_y[l];
        tl->dx_acc[l] = 0.0f;
        tl->ddt_acc[l] = 0.0f;
        tl->pre[l] = 0.0f;
    }

    const float *B_t = p->B_proj + (tok * pl->G + bk->group) * N;
    const float *C_t = p->C_proj + (tok * pl->G + bk->group) * N;
    const float *h_prev = i ? tl->seg_h + (size_t)(i - 1) * rows : prev;
    const float *h = tl->seg_h + (size_t)i * rows, *decay = tl->seg_decay + (size_t)i * rows;
    float *dB_t = bk->dB.base ? bk->dB.base + tok * bk->dB.stride : NULL;
    float *dC_t = bk->dC.base ? bk->dC.base + tok * bk->dC.stride : NULL;
    for (int64_t n = 0; n < N; n++) {
        const size_t r = (size_t)n * SSM_LANES;
        if (bk->full)
            reverse_row(SSM_LANES, tl->dh + r, tl->adj, h + r, h_prev + r, decay + r,
                        tl->rate + r, tl->gy, tl->x, dt, tl->dx_acc, tl->ddt_acc,
                        tl->dA_seg + r, tl->pre, B_t[n], C_t[n]);
        else
            reverse_row(lanes, tl->dh + r, tl->adj, h + r, h_prev + r, decay + r, tl->rate + r,
                        tl->gy, tl->x, dt, tl->dx_acc, tl->ddt_acc, tl->dA_seg + r, tl->pre,
                        B_t[n], C_t[n]);
        if (dB_t) dB_t[n] = ls_dot(lanes, tl->adj, tl->dtx);
        if (dC_t) dC_t[n] = ls_dot(lanes, tl->gy, h + r);
    }

    const float *D_skip = p->D_skip ? p->D_skip + d0 : NULL;
    const float *dt_raw = p->dt + tok * D + d0;
    const float *dt_bias = p->dt_bias ? p->dt_bias + d0 : NULL;
    for (int64_t l = 0; l < lanes; l++) {
        const float x = tl->x[l], gy = tl->gy[l];
        float dx = dt[l] * tl->dx_acc[l];
        if (D_skip) dx += D_skip[l] * gy;
        float ddt = tl->ddt_acc[l];
        if (p->dt_softplus) ddt *= ls_softplus_gradf(dt_raw[l] + (dt_bias ? dt_bias[l] : 0.0f));
        if (g->dx) g->dx[tok * D + d0 + l] = dx;
        if (g->ddt) g->ddt[tok * D + d0 + l] = ddt;
        if (g->dgate) {
            /* y before the gate, as the forward computes it. */
            float y = tl->pre[l];
            if (D_skip) y += D_skip[l] * x;
            g->dgate[tok * D + d0 + l] = d_y[l] * y * ls_activate_gradf(pl->gate_act, gate[l]);
        }
        tl->dD_seg[l] += gy * x;
        tl->dbias_seg[l] += ddt;
    }
}

/* Sequence seq for one block: checkpoints, then the segments in reverse. */
static void backward_sequence(const bwd_plan *pl, const bwd_tile *tl, const block *bk,
                              int64_t seq)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N, lanes = bk->lanes, d0 = bk->d0;
    const size_t rows = (size_t)N * SSM_LANES;
    for (int64_t l = 0; l < lanes; l++) {
        const float *h0_row = p->h0 ? p->h0 + (seq * D + d0 + l) * N : NULL;
        const float *d_hT_row = pl->d_hT ? pl->d_hT + (seq * D + d0 + l) * N : NULL;
        for (int64_t n = 0; n < N; n++) {
            tl->checkpoints[n * SSM_LANES + l] = h0_row ? h0_row[n] : 0.0f;
            tl->dh[n * SSM_LANES + l] = d_hT_row ? d_hT_row[n] : 0.0f;
        }
    }

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const int64_t n_segments = (len + SEGMENT - 1) / SEGMENT;
    /* The last segment is recomputed by the reverse walk anyway: no checkpoint after it. */
    for (int64_t k = 0; k + 1 < n_segments; k++) {
        float *h = tl->checkpoints + (size_t)(k + 1) * rows;
        memcpy(h, tl->checkpoints + (size_t)k * rows, rows * sizeof *h);
        for (int64_t tok = start + k * SEGMENT; tok < start + (k + 1) * SEGMENT; tok++) {
            step_inputs(pl, tok, d0, lanes, tl->seg_dt, tl->dtx);
            const float *B_t = p->B_proj + (tok * pl->G + bk->group) * N;
            for (int64_t n = 0; n < N; n++) {
                const size_t r = (size_t)n * SSM_LANES;
                if (bk->full)
                    step_row_in_place(SSM_LANES, h + r, tl->rate + r, tl->seg_dt, tl->dtx,
                                      tl->seg_decay, B_t[n]);
                else
                    step_row_in_place(lanes, h + r, tl->rate + r, tl->seg_dt, tl->dtx,
                                      tl->seg_decay, B_t[n]);
            }
        }
    }

    for (int64_t k = n_segments - 1; k >= 0; k--) {
        const int64_t seg_start = start + k * SEGMENT;
        const int64_t seg_len = len - k * SEGMENT < SEGMENT ? len - k * SEGMENT : SEGMENT;
        const float *prev = tl->checkpoints + (size_t)k * rows;
        recompute_segment(pl, tl, bk, seg_start, seg_len, prev);
        for (int64_t i = seg_len - 1; i >= 0; i--) reverse_token(pl, tl, bk, seg_start, i, prev);
        /* Two-level sums: a float32 running sum over T tokens drifts by up to ~T ulp; summing
         * each segment first keeps it near (SEGMENT + T / SEGMENT) ulp. */
        for (int64_t n = 0; n < N; n++)
            add_lanes(lanes, tl->dA_sum + n * SSM_LANES, tl->dA_seg + n * SSM_LANES);
        add_lanes(lanes, tl->dD_sum, tl->dD_seg);
        add_lanes(lanes, tl->dbias_sum, tl->dbias_seg);
    }

    if (pl->grads->dh0) {
        for (int64_t l = 0; l < lanes; l++) {
            float *dh0_row = pl->grads->dh0 + (seq * D + d0 + l) * N;
            for (int64_t n = 0; n < N; n++) dh0_row[n] = tl->dh[n * SSM_LANES + l];
        }
    }
}

static proj_rows proj_destination(const bwd_plan *pl, float *grad, float *partial, int64_t item,
                                  int64_t group)
{
    proj_rows r = {NULL, 0};
    if (!grad) return r;
    const int64_t N = pl->p->N;
    if (partial) {
        r.base = partial + (size_t)item * (size_t)pl->n_tokens * (size_t)N;
        r.stride = N;
    } else {
        r.base = grad + group * N;
        r.stride = pl->G * N;
    }
    return r;
}

static void backward_item(void *ctx, int64_t item, int thread)
{
    const bwd_plan *pl = ctx;
    const linseq_ssm1_problem *p = pl->p;
    const linseq_ssm1_grads *g = pl->grads;
    const int64_t N = p->N;
    const bwd_tile tl = tile_of_thread(pl, thread);

    block bk;
    bk.group = item / pl->blocks_per_group;
    bk.d0 = bk.group * pl->channels_per_group + item % pl->blocks_per_group * SSM_LANES;
    const int64_t group_end = (bk.group + 1) * pl->channels_per_group;
    bk.lanes = group_end - bk.d0 < SSM_LANES ? group_end - bk.d0 : SSM_LANES;
    bk.full = bk.lanes == SSM_LANES;
    bk.dB = proj_destination(pl, g->dB_proj, pl->dB_partial, item, bk.group);
    bk.dC = proj_destination(pl, g->dC_proj, pl->dC_partial, item, bk.group);

    const size_t rows = (size_t)N * SSM_LANES;
    /* The tiles and the lane vectors (adj first) are contiguous; zeroing them starts the sums. */
    memset(tl.rate, 0, TILE_ROWS * rows * sizeof(float));
    memset(tl.adj, 0, LANE_VECTORS * SSM_LANES * sizeof(float));
    for (int64_t l = 0; l < bk.lanes; l++)
        for (int64_t n = 0; n < N; n++) tl.rate[n * SSM_LANES + l] = p->A[(bk.d0 + l) * N + n];

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t seq = 0; seq < n_seqs; seq++) backward_sequence(pl, &tl, &bk, seq);

    for (int64_t l = 0; l < bk.lanes; l++) {
        const int64_t d = bk.d0 + l;
        if (g->dA)
            for (int64_t n = 0; n < N; n++) g->dA[d * N + n] = tl.dA_sum[n * SSM_LANES + l];
        if (g->dD_skip) g->dD_skip[d] = tl.dD_sum[l];
        if (g->ddt_bias) g->ddt_bias[d] = tl.dbias_sum[l];
    }
}

/* dB and dC of tokens [item * REDUCE_TOKENS, ...): each group's partials in block order. */
static void reduce_item(void *ctx, int64_t item, int thread)
{
    (void)thread;
    const bwd_plan *pl = ctx;
    const int64_t N = pl->p->N, G = pl->G, bpg = pl->blocks_per_group;
    const int64_t t0 = item * REDUCE_TOKENS;
    const int64_t t1 = t0 + REDUCE_TOKENS < pl->n_tokens ? t0 + REDUCE_TOKENS : pl->n_tokens;
    const size_t block_stride = (size_t)pl->n_tokens * (size_t)N;
    float *grads[2] = {pl->grads->dB_proj, pl->grads->dC_proj};
    const float *partials[2] = {pl->dB_partial, pl->dC_partial};
    for (int which = 0; which < 2; which++) {
        if (!grads[which]) continue;
        for (int64_t tok = t0; tok < t1; tok++)
            for (int64_t grp = 0; grp < G; grp++) {
                float *dst = grads[which] + (tok * G + grp) * N;
                const float *first = partials[which] + (size_t)(grp * bpg) * block_stride +
                                     (size_t)(tok * N);
                for (int64_t n = 0; n < N; n++) dst[n] = first[n];
                for (int64_t j = 1; j < bpg; j++) {
                    const float *part = first + (size_t)j * block_stride;
                    for (int64_t n = 0; n < N; n++) dst[n] += part[n];
                }
            }
    }
}

linseq_status ls_ssm1_scan_backward(const linseq_ssm1_problem *p, const linseq_exec *exec,
                                    const float *d_y, const float *d_hT,
                                    const linseq_ssm1_grads *grads)
{
    bwd_plan pl = {.p = p, .d_y = d_y, .d_hT = d_hT, .grads = grads};
    pl.G = p->G ? p->G : 1;
    pl.channels_per_group = p->D / pl.G;
    pl.blocks_per_group = (pl.channels_per_group + SSM_LANES - 1) / SSM_LANES;
    pl.n_blocks = pl.G * pl.blocks_per_group;
    pl.n_tokens = p->B * p->T;
    pl.gate_act = ssm1_gate_activation(p);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);
    pl.max_segments = longest > 0 ? (longest + SEGMENT - 1) / SEGMENT : 1;

    const int n_threads =
        ls_resolve_threads(exec, pl.n_blocks,
                           40.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N);

    /* Per thread: checkpoints, segment states and decays, the [N][SSM_LANES] tiles and lane
     * vectors, rounded up to 64 bytes so that threads never share a cache line. A size this
     * cannot represent could not be allocated either. */
    int64_t tile_rows, state_floats, thread_floats, total_bytes, partial_bytes = 0;
    if (!ls_mul_ok(&tile_rows, 2, pl.max_segments + 2 * SEGMENT + TILE_ROWS, p->N) ||
        !ls_mul_ok(&state_floats, 2, tile_rows, (int64_t)SSM_LANES) ||
        state_floats > INT64_MAX - (SEGMENT + LANE_VECTORS + 16) * SSM_LANES)
        return LINSEQ_ERR_OUT_OF_MEMORY;
    thread_floats = (state_floats + (SEGMENT + LANE_VECTORS) * SSM_LANES + 15) / 16 * 16;
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    const bool partials = pl.blocks_per_group > 1;
    if (partials &&
        !ls_mul_ok(&partial_bytes, 4, pl.n_blocks, pl.n_tokens, p->N, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;

    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (partials && grads->dB_proj) pl.dB_partial = malloc((size_t)partial_bytes);
    if (partials && grads->dC_proj) pl.dC_partial = malloc((size_t)partial_bytes);
    if (!pl.workspace || (partials && grads->dB_proj && !pl.dB_partial) ||
        (partials && grads->dC_proj && !pl.dC_partial)) {
        free(pl.workspace);
        free(pl.dB_partial);
        free(pl.dC_partial);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }

    ls_parallel_for(pl.n_blocks, n_threads, backward_item, &pl);
    if (pl.dB_partial || pl.dC_partial) {
        const int64_t n_chunks = (pl.n_tokens + REDUCE_TOKENS - 1) / REDUCE_TOKENS;
        const int reduce_threads =
            ls_resolve_threads(exec, n_chunks,
                               2.0 * (double)pl.n_tokens * (double)p->D / SSM_LANES * p->N);
        ls_parallel_for(n_chunks, reduce_threads, reduce_item, &pl);
    }
    free(pl.workspace);
    free(pl.dB_partial);
    free(pl.dC_partial);
    return LINSEQ_OK;
}
