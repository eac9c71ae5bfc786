/* The SSM1 backward kernels, compiled once per ISA (the algorithm, its formulas and memory
 * are described in ssm1_scan_bwd.c).
 *
 * Lanes are channels, as in the forward: per token, each state row n of the block is STRIPS
 * whole vectors. The checkpoint pass and the segment recompute run the forward's update
 * (ssm1_simd.h), so every state is the forward's bits. The reverse walk fuses everything one
 * state row contributes (the adjoint, dx, ddt, dA, the decayed adjoint, the recomputed y for
 * dgate) in registers; dB_t and dC_t, sums over the block's channels, are accumulated over the
 * strips in one vector per state and reduced VW states at a time with vf_hsum_lanes. */
#include <stdbool.h>
#include <string.h>

#include "ssm/ssm1_simd.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"

#define SEGMENT SSM_BWD_SEGMENT

/* Rows of 16 floats (the widest vector) per state for the per-token dB/dC sums. */
#define ROW 16

/* How many tokens ahead the per-token rows are prefetched (see ls_prefetch_floats): a token of
 * a block takes several hundred cycles in the reverse walk, a row from memory about as long. */
#define PREFETCH_REVERSE 1
#define PREFETCH_INPUTS 6

/* One thread's buffers; [N][SSM_LANES] tiles are state-major. */
typedef struct bwd_tile {
    float *checkpoints; /* [max_segments][N][SSM_LANES] the state before each segment */
    float *seg_h;       /* [SEGMENT][N][SSM_LANES] h_t of each token of the segment */
    float *seg_decay;   /* [SEGMENT][N][SSM_LANES] a_t */
    /* [SEGMENT][SSM_LANES] per token of the segment: dt after softplus, dt x, gy = d_y act(gate),
     * softplus'(dt + dt_bias) and act'(gate) (the last two only when used) */
    float *seg_dt, *seg_dtx, *seg_gy, *seg_sp_slope, *seg_act_slope;
    float *rate;            /* [N][SSM_LANES] A of the block, transposed */
    float *dh;              /* [N][SSM_LANES] the gradient reaching the current state */
    float *dA_sum, *dA_seg; /* [N][SSM_LANES]: over all tokens, over the current segment */
    float *rows_B, *rows_C; /* [N rounded up to ROW][ROW] one vector of dB / dC sums per state */
    float *dD_sum, *dD_seg, *dbias_sum, *dbias_seg; /* [SSM_LANES] */
    /* layout tiles (ssm_layout.h): [SSM1_BWD_LAYOUT_ROWS][SEGMENT][SSM_LANES] of x, dt, gate,
     * d_y, dx, ddt, dgate, and B, C [SEGMENT][N rounded up to ROW] */
    float *layout, *B, *C;
} bwd_tile;

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

static bwd_tile tile_of_thread(const ssm1_bwd_plan *pl, int thread)
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
    tl.seg_dtx = w + SEGMENT * SSM_LANES;
    tl.seg_gy = w + 2 * SEGMENT * SSM_LANES;
    tl.seg_sp_slope = w + 3 * SEGMENT * SSM_LANES;
    tl.seg_act_slope = w + 4 * SEGMENT * SSM_LANES;
    w += SSM1_BWD_SEG_ROWS * SEGMENT * SSM_LANES;
    tl.rate = w;
    tl.dh = w + rows;
    tl.dA_sum = w + 2 * rows;
    tl.dA_seg = w + 3 * rows;
    w += 4 * rows;
    tl.rows_B = w;
    tl.rows_C = w + round_up(pl->p->N, ROW) * ROW;
    w += 2 * round_up(pl->p->N, ROW) * ROW;
    tl.dD_sum = w;
    tl.dD_seg = w + SSM_LANES;
    tl.dbias_sum = w + 2 * SSM_LANES;
    tl.dbias_seg = w + 3 * SSM_LANES;
    w += 4 * SSM_LANES;
    tl.layout = w;
    w += SSM1_BWD_LAYOUT_ROWS * SEGMENT * SSM_LANES;
    tl.B = w;
    tl.C = w + SEGMENT * round_up(pl->p->N, ROW);
    return tl;
}

/* Where one block writes its dB (or dC) rows: the gradient itself (row stride G*N) when its
 * group has one block, else its partial buffer (row stride N). */
typedef struct proj_rows {
    float *base;
    int64_t stride;
} proj_rows;

typedef struct block {
    int64_t group, d0, lanes;
    proj_rows dB, dC;
} block;

/* The rows of one segment of a block: in place, or the thread's tiles (ssm_layout.h). d_y and
 * the outputs only for the reverse walk. */
typedef struct seg_rows {
    ssm_rows x, dt, gate, d_y;
    ssm_proj_rows B, C;
    ssm_out_rows dx, ddt, dgate;
} seg_rows;

static seg_rows seg_rows_of(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                            int64_t tok0, int64_t count, bool reverse, ssm_prefetch pf)
{
    const linseq_ssm1_problem *p = pl->p;
    const linseq_ssm1_grads *g = pl->grads;
    const int64_t T = p->T, D = p->D, N = p->N, d0 = bk->d0, lanes = bk->lanes;
    const bool cf = p->channel_first;
    float *t[SSM1_BWD_LAYOUT_ROWS];
    for (int i = 0; i < SSM1_BWD_LAYOUT_ROWS; i++) t[i] = tl->layout + i * SEGMENT * SSM_LANES;
    seg_rows r;
    memset(&r, 0, sizeof r);
    r.x = ssm_rows_in(&pl->x, T, tok0, count, pf, d0, lanes, t[0]);
    r.dt = ssm_rows_in(&pl->dt, T, tok0, count, pf, d0, lanes, t[1]);
    r.B = ssm_proj_in(&pl->B, T, N, tok0, count, pf, bk->group, 1, tl->B);
    if (!reverse) return r;
    r.C = ssm_proj_in(&pl->C, T, N, tok0, count, pf, bk->group, 1, tl->C);
    if (p->gate) r.gate = ssm_rows_in(&pl->gate, T, tok0, count, pf, d0, lanes, t[2]);
    r.d_y = ssm_rows_in(&pl->dy, T, tok0, count, pf, d0, lanes, t[3]);
    r.dx = ssm_rows_out(g->dx, cf, T, D, tok0, count, d0, lanes, t[4]);
    r.ddt = ssm_rows_out(g->ddt, cf, T, D, tok0, count, d0, lanes, t[5]);
    r.dgate = ssm_rows_out(g->dgate, cf, T, D, tok0, count, d0, lanes, t[6]);
    return r;
}

/* The per-token inputs of tokens [tok0, tok0 + count) into the segment rows: dt and dt x, and
 * with `reverse` also gy and the slopes the reverse walk multiplies by. Computed in one pass
 * before the updates, so that the latency of softplus and the activations overlaps across
 * tokens instead of stalling each token's updates. */
static void segment_inputs(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                           const seg_rows *sr, int64_t count, bool reverse)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t d0 = bk->d0, lanes = bk->lanes;
    for (int64_t k = 0; k < count; k++) {
        const float *dt_t = sr->dt.p + k * sr->dt.stride, *x_t = sr->x.p + k * sr->x.stride;
        if (k + PREFETCH_INPUTS < count) {
            if (sr->dt.in_place) ls_prefetch_floats(dt_t + PREFETCH_INPUTS * sr->dt.stride, lanes);
            if (sr->x.in_place) ls_prefetch_floats(x_t + PREFETCH_INPUTS * sr->x.stride, lanes);
            if (reverse && sr->d_y.in_place)
                ls_prefetch_floats(sr->d_y.p + (k + PREFETCH_INPUTS) * sr->d_y.stride, lanes);
            if (reverse && p->gate && sr->gate.in_place)
                ls_prefetch_floats(sr->gate.p + (k + PREFETCH_INPUTS) * sr->gate.stride, lanes);
        }
        for (int64_t s = 0; s < STRIPS; s++) {
            const int64_t valid = lanes - s * VW, o = k * SSM_LANES + s * VW, d = d0 + s * VW;
            vf dt = vf_load_part(dt_t + s * VW, valid);
            if (p->dt_softplus) {
                /* ssm1_step_dt's softplus and its slope side by side: one exp for both */
                const vf z =
                    vf_add(dt, p->dt_bias ? vf_load_part(p->dt_bias + d, valid) : vf_zero());
                dt = vf_softplus(z);
                if (reverse) vf_store(tl->seg_sp_slope + o, vf_softplus_grad(z));
            }
            vf_store(tl->seg_dt + o, dt);
            vf_store(tl->seg_dtx + o, vf_mul(dt, vf_load_part(x_t + s * VW, valid)));
            if (!reverse) continue;
            vf gy = vf_load_part(sr->d_y.p + k * sr->d_y.stride + s * VW, valid);
            if (p->gate) {
                const vf z = vf_load_part(sr->gate.p + k * sr->gate.stride + s * VW, valid);
                vf f, slope;
                vf_act_and_grad(pl->gate_act, z, &f, &slope);
                gy = vf_mul(gy, f);
                if (pl->grads->dgate) vf_store(tl->seg_act_slope + o, slope);
            }
            vf_store(tl->seg_gy + o, gy);
        }
    }
}

/* Token k of a segment forward from h_prev into h (the same pointer in the checkpoint pass),
 * with its inputs from row k of the segment rows; the recompute also keeps the decays. */
static inline void forward_token(const ssm1_bwd_plan *pl, const bwd_tile *tl, const seg_rows *sr,
                                 int64_t k, const float *h_prev, float *h, float *decay_out)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t N = p->N;
    const float *rate = tl->rate;
    vf dt[STRIPS], dtx[STRIPS];
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) {
        dt[s] = vf_load(tl->seg_dt + k * SSM_LANES + s * VW);
        dtx[s] = vf_load(tl->seg_dtx + k * SSM_LANES + s * VW);
    }
    const float *B_t = sr->B.p + k * sr->B.token;
    for (int64_t n = 0; n < N; n++) {
        const vf b = vf_set1(B_t[n]);
        const int64_t r = n * SSM_LANES;
        LS_UNROLL_STRIPS
        for (int64_t s = 0; s < STRIPS; s++) {
            const vf decay = ssm1_decay(vf_load(rate + r + s * VW), dt[s]);
            if (decay_out) vf_store(decay_out + r + s * VW, decay);
            vf_store(h + r + s * VW, ssm1_update(decay, vf_load(h_prev + r + s * VW), dtx[s], b));
        }
    }
}

/* dB_t[n] (or dC_t) = the lanes' sum of rows[n] for every n, VW states per reduction. */
static inline void store_row_sums(float *dst, const float *rows, int64_t N)
{
    for (int64_t n0 = 0; n0 < N; n0 += VW) {
        vf r[VW];
        _Pragma("GCC unroll 16") for (int i = 0; i < VW; i++) r[i] =
            n0 + i < N ? vf_load(rows + (n0 + i) * ROW) : vf_zero();
        vf_store_part(dst + n0, vf_hsum_lanes(r), N - n0);
    }
}

/* Token seg_start + i of a recomputed segment, in reverse: see the formulas in
 * ssm1_scan_bwd.c. dh holds dh_t on entry and dh_{t-1} on return. */
static inline void reverse_token(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                                 const seg_rows *sr, int64_t seg_start, int64_t i,
                                 const float *prev)
{
    const linseq_ssm1_problem *p = pl->p;
    const linseq_ssm1_grads *g = pl->grads;
    const int64_t N = p->N, lanes = bk->lanes, d0 = bk->d0;
    const int64_t tok = seg_start + i;
    const size_t rows = (size_t)N * SSM_LANES;
    const int64_t o_tok = i * SSM_LANES;
    float *dx_t = g->dx ? sr->dx.p + i * sr->dx.stride : NULL;
    float *ddt_t = g->ddt ? sr->ddt.p + i * sr->ddt.stride : NULL;
    float *dgate_t = g->dgate ? sr->dgate.p + i * sr->dgate.stride : NULL;
    if (i >= PREFETCH_REVERSE) {
        /* the rows of the token this walk reaches PREFETCH_REVERSE tokens later (the tiles
         * are in cache already) */
        const int64_t back = PREFETCH_REVERSE;
        if (sr->x.in_place) ls_prefetch_floats(sr->x.p + (i - back) * sr->x.stride, lanes);
        if (sr->d_y.in_place) ls_prefetch_floats(sr->d_y.p + (i - back) * sr->d_y.stride, lanes);
        if (dx_t && !sr->dx.dst) ls_prefetch_floats_for_write(dx_t - back * sr->dx.stride, lanes);
        if (ddt_t && !sr->ddt.dst)
            ls_prefetch_floats_for_write(ddt_t - back * sr->ddt.stride, lanes);
        if (dgate_t && !sr->dgate.dst)
            ls_prefetch_floats_for_write(dgate_t - back * sr->dgate.stride, lanes);
        if (bk->dB.base)
            ls_prefetch_floats_for_write(bk->dB.base + (tok - PREFETCH_REVERSE) * bk->dB.stride, N);
        if (bk->dC.base)
            ls_prefetch_floats_for_write(bk->dC.base + (tok - PREFETCH_REVERSE) * bk->dC.stride, N);
    }
    const float *x_t = sr->x.p + i * sr->x.stride, *d_y = sr->d_y.p + i * sr->d_y.stride;

    vf x[STRIPS], dt[STRIPS], dtx[STRIPS], gy[STRIPS];
    vf dx_acc[STRIPS], ddt_acc[STRIPS], pre[STRIPS];
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) {
        x[s] = vf_load_part(x_t + s * VW, lanes - s * VW);
        dt[s] = vf_load(tl->seg_dt + o_tok + s * VW);
        dtx[s] = vf_load(tl->seg_dtx + o_tok + s * VW);
        gy[s] = vf_load(tl->seg_gy + o_tok + s * VW);
        dx_acc[s] = ddt_acc[s] = pre[s] = vf_zero();
    }

    const float *B_t = sr->B.p + i * sr->B.token, *C_t = sr->C.p + i * sr->C.token;
    const float *h_prev = i ? tl->seg_h + (size_t)(i - 1) * rows : prev;
    const float *h = tl->seg_h + (size_t)i * rows, *decay = tl->seg_decay + (size_t)i * rows;
    /* Locals, not fields of tl: the vector stores may alias anything and would force reloads. */
    const float *rate = tl->rate;
    float *dh = tl->dh, *dA_seg = tl->dA_seg, *rows_B = tl->rows_B, *rows_C = tl->rows_C;
    for (int64_t n = 0; n < N; n++) {
        const vf b = vf_set1(B_t[n]), c = vf_set1(C_t[n]);
        const int64_t r = n * SSM_LANES;
        vf acc_B = vf_zero(), acc_C = vf_zero();
        LS_UNROLL_STRIPS
        for (int64_t s = 0; s < STRIPS; s++) {
            const int64_t o = r + s * VW;
            const vf a = vf_load(decay + o), hv = vf_load(h + o);
            const vf adj = vf_fmadd(c, gy[s], vf_load(dh + o));
            const vf decayed_prev = vf_mul(a, vf_load(h_prev + o));
            dx_acc[s] = vf_fmadd(adj, b, dx_acc[s]);
            ddt_acc[s] = vf_fmadd(adj, vf_mul(vf_load(rate + o), decayed_prev), ddt_acc[s]);
            vf_store(dA_seg + o, vf_fmadd(adj, vf_mul(dt[s], decayed_prev), vf_load(dA_seg + o)));
            vf_store(dh + o, vf_mul(a, adj));
            pre[s] = vf_fmadd(hv, c, pre[s]);
            acc_B = vf_fmadd(adj, dtx[s], acc_B);
            acc_C = vf_fmadd(gy[s], hv, acc_C);
        }
        vf_store(rows_B + n * ROW, acc_B);
        vf_store(rows_C + n * ROW, acc_C);
    }
    if (bk->dB.base) store_row_sums(bk->dB.base + tok * bk->dB.stride, rows_B, N);
    if (bk->dC.base) store_row_sums(bk->dC.base + tok * bk->dC.stride, rows_C, N);

    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) {
        const int64_t valid = lanes - s * VW, d = d0 + s * VW;
        const float *D_skip = p->D_skip ? p->D_skip + d : NULL;
        vf dx = vf_mul(dt[s], dx_acc[s]);
        if (D_skip) dx = vf_fmadd(vf_load_part(D_skip, valid), gy[s], dx);
        /* sum_n adj B x = x dx_acc: the B x term of ddt costs one fma per token, not per state */
        vf ddt = vf_fmadd(x[s], dx_acc[s], ddt_acc[s]);
        if (p->dt_softplus) ddt = vf_mul(ddt, vf_load(tl->seg_sp_slope + o_tok + s * VW));
        if (dx_t) vf_store_part(dx_t + s * VW, dx, valid);
        if (ddt_t) vf_store_part(ddt_t + s * VW, ddt, valid);
        if (g->dgate) {
            /* y before the gate, as the forward computes it. */
            const vf y = ssm1_skip(pre[s], D_skip, x[s], valid);
            const vf dy_y = vf_mul(vf_load_part(d_y + s * VW, valid), y);
            vf_store_part(dgate_t + s * VW,
                          vf_mul(dy_y, vf_load(tl->seg_act_slope + o_tok + s * VW)), valid);
        }
        vf_store(tl->dD_seg + s * VW, vf_fmadd(gy[s], x[s], vf_load(tl->dD_seg + s * VW)));
        vf_store(tl->dbias_seg + s * VW, vf_add(vf_load(tl->dbias_seg + s * VW), ddt));
    }
}

/* sum += part, part = 0, over n whole rows of SSM_LANES lanes. */
static inline void add_and_clear(int64_t n, float *restrict sum, float *restrict part)
{
    for (int64_t i = 0; i < n * SSM_LANES; i += VW) {
        vf_store(sum + i, vf_add(vf_load(sum + i), vf_load(part + i)));
        vf_store(part + i, vf_zero());
    }
}

/* The checkpoints of sequence seq for one block: the state before every segment (the last
 * segment is recomputed by the reverse walk anyway: no checkpoint after it). */
static void checkpoint_pass(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                            int64_t seq, int64_t start, int64_t len)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N, lanes = bk->lanes, d0 = bk->d0;
    const size_t rows = (size_t)N * SSM_LANES;
    /* Lanes past a ragged block start at zero. */
    if (!p->h0 || lanes < SSM_LANES) memset(tl->checkpoints, 0, rows * sizeof(float));
    if (p->h0)
        ls_transpose_copy(tl->checkpoints, SSM_LANES, p->h0 + (seq * D + d0) * N, N, lanes, N);
    const int64_t n_segments = (len + SEGMENT - 1) / SEGMENT;
    for (int64_t k = 0; k + 1 < n_segments; k++) {
        const int64_t seg_start = start + k * SEGMENT;
        float *h = tl->checkpoints + (size_t)(k + 1) * rows;
        const float *h_prev = tl->checkpoints + (size_t)k * rows;
        const int64_t next = len - (k + 1) * SEGMENT;
        const ssm_prefetch ahead = {SEGMENT, next < SEGMENT ? next : SEGMENT};
        const seg_rows sr = seg_rows_of(pl, tl, bk, seg_start, SEGMENT, false, ahead);
        segment_inputs(pl, tl, bk, &sr, SEGMENT, false);
        for (int64_t i = 0; i < SEGMENT; i++) {
            forward_token(pl, tl, &sr, i, h_prev, h, NULL);
            h_prev = h;
        }
    }
}

/* Checkpoint k of sequence seq from the forward's saved block ([N][D] rows, ssm_internal.h)
 * into the thread's one checkpoint tile; lanes past a ragged block are zero. */
static const float *saved_checkpoint(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                                     int64_t seq, int64_t k)
{
    const int64_t N = pl->p->N, D = pl->p->D, lanes = bk->lanes;
    const int64_t c = pl->saved_first[seq] + k;
    const float *src = pl->saved + (size_t)c * (size_t)N * (size_t)D + (size_t)bk->d0;
    for (int64_t n = 0; n < N; n++) {
        float *row = tl->checkpoints + n * SSM_LANES;
        memcpy(row, src + (size_t)n * (size_t)D, (size_t)lanes * sizeof(float));
        if (lanes < SSM_LANES) memset(row + lanes, 0, (size_t)(SSM_LANES - lanes) * sizeof(float));
    }
    return tl->checkpoints;
}

/* Sequence seq for one block: checkpoints (computed, or the forward's), then the segments in
 * reverse. */
static void backward_sequence(const ssm1_bwd_plan *pl, const bwd_tile *tl, const block *bk,
                              int64_t seq)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N, lanes = bk->lanes, d0 = bk->d0;
    const size_t rows = (size_t)N * SSM_LANES;
    if (!pl->d_hT || lanes < SSM_LANES) memset(tl->dh, 0, rows * sizeof(float));
    if (pl->d_hT) ls_transpose_copy(tl->dh, SSM_LANES, pl->d_hT + (seq * D + d0) * N, N, lanes, N);

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const int64_t n_segments = (len + SEGMENT - 1) / SEGMENT;
    if (!pl->saved) checkpoint_pass(pl, tl, bk, seq, start, len);

    for (int64_t k = n_segments - 1; k >= 0; k--) {
        const int64_t seg_start = start + k * SEGMENT;
        const int64_t seg_len = len - k * SEGMENT < SEGMENT ? len - k * SEGMENT : SEGMENT;
        const float *prev =
            pl->saved ? saved_checkpoint(pl, tl, bk, seq, k) : tl->checkpoints + (size_t)k * rows;
        /* the reverse walk's next segment is the one before */
        const ssm_prefetch behind = {-SEGMENT, k > 0 ? SEGMENT : 0};
        const seg_rows sr = seg_rows_of(pl, tl, bk, seg_start, seg_len, true, behind);
        segment_inputs(pl, tl, bk, &sr, seg_len, true);
        for (int64_t i = 0; i < seg_len; i++)
            forward_token(pl, tl, &sr, i, i ? tl->seg_h + (size_t)(i - 1) * rows : prev,
                          tl->seg_h + (size_t)i * rows, tl->seg_decay + (size_t)i * rows);
        for (int64_t i = seg_len - 1; i >= 0; i--)
            reverse_token(pl, tl, bk, &sr, seg_start, i, prev);
        ssm_rows_flush(&sr.dx, behind);
        ssm_rows_flush(&sr.ddt, behind);
        ssm_rows_flush(&sr.dgate, behind);
        /* Two-level sums: a float32 running sum over T tokens drifts by up to ~T ulp; summing
         * each segment first keeps it near (SEGMENT + T / SEGMENT) ulp. */
        add_and_clear(N, tl->dA_sum, tl->dA_seg);
        add_and_clear(1, tl->dD_sum, tl->dD_seg);
        add_and_clear(1, tl->dbias_sum, tl->dbias_seg);
    }

    if (pl->grads->dh0)
        ls_transpose_copy(pl->grads->dh0 + (seq * D + d0) * N, N, tl->dh, SSM_LANES, N, lanes);
}

static proj_rows proj_destination(const ssm1_bwd_plan *pl, float *grad, float *partial,
                                  int64_t item, int64_t group)
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

void LS_ISA_FN(ls_ssm1_bwd_item)(void *ctx, int64_t item, int thread)
{
    const ssm1_bwd_plan *pl = ctx;
    const linseq_ssm1_problem *p = pl->p;
    const linseq_ssm1_grads *g = pl->grads;
    const int64_t N = p->N;
    const bwd_tile tl = tile_of_thread(pl, thread);

    block bk;
    bk.group = item / pl->blocks_per_group;
    bk.d0 = bk.group * pl->channels_per_group + item % pl->blocks_per_group * SSM_LANES;
    const int64_t group_end = (bk.group + 1) * pl->channels_per_group;
    bk.lanes = group_end - bk.d0 < SSM_LANES ? group_end - bk.d0 : SSM_LANES;
    bk.dB = proj_destination(pl, g->dB_proj, pl->dB_partial, item, bk.group);
    bk.dC = proj_destination(pl, g->dC_proj, pl->dC_partial, item, bk.group);

    /* The sums start at zero, and so do the lanes past a ragged block: rate 0 gives decay 1,
     * and zero inputs keep every state and adjoint there at 0, adding nothing to dB and dC.
     * The tiles from rate on are contiguous; the segment buffers are written before read. */
    const float *end = pl->workspace + (size_t)(thread + 1) * pl->thread_floats;
    memset(tl.rate, 0, (size_t)(end - tl.rate) * sizeof(float));
    ls_transpose_copy(tl.rate, SSM_LANES, p->A + bk.d0 * N, N, bk.lanes, N);

    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    for (int64_t seq = 0; seq < n_seqs; seq++) backward_sequence(pl, &tl, &bk, seq);

    if (g->dA) ls_transpose_copy(g->dA + bk.d0 * N, N, tl.dA_sum, SSM_LANES, N, bk.lanes);
    if (g->dD_skip) memcpy(g->dD_skip + bk.d0, tl.dD_sum, (size_t)bk.lanes * sizeof(float));
    if (g->ddt_bias) memcpy(g->ddt_bias + bk.d0, tl.dbias_sum, (size_t)bk.lanes * sizeof(float));
}

/* The reduce into a channel-first gradient [B,G,N,T]: per token, VW states summed over the
 * blocks' partials ([tokens][N] each, read contiguously) in block order as the token-major pass
 * does, then scattered to their rows of tokens. */
static void reduce_channel_first(const ssm1_bwd_plan *pl, float *grad, const float *partial,
                                 int64_t t0, int64_t t1)
{
    const int64_t N = pl->p->N, G = pl->G, T = pl->p->T, bpg = pl->blocks_per_group;
    const size_t block_stride = (size_t)pl->n_tokens * (size_t)N;
    float sums[VW];
    for (int64_t grp = 0; grp < G; grp++) {
        const float *first = partial + (size_t)(grp * bpg) * block_stride;
        for (int64_t tok = t0; tok < t1; tok++) {
            float *dst = grad + (((tok / T) * G + grp) * N) * T + tok % T;
            for (int64_t n = 0; n < N; n += VW) {
                const float *row = first + (size_t)(tok * N + n);
                vf sum = vf_load_part(row, N - n);
                for (int64_t j = 1; j < bpg; j++)
                    sum = vf_add(sum, vf_load_part(row + (size_t)j * block_stride, N - n));
                vf_store(sums, sum);
                for (int64_t i = 0; i < VW && n + i < N; i++) dst[(n + i) * T] = sums[i];
            }
        }
    }
}

void LS_ISA_FN(ls_ssm1_bwd_reduce_item)(void *ctx, int64_t item, int thread)
{
    (void)thread;
    const ssm1_bwd_plan *pl = ctx;
    const int64_t N = pl->p->N, G = pl->G, bpg = pl->blocks_per_group;
    const int64_t t0 = item * SSM1_REDUCE_TOKENS;
    const int64_t t1 =
        t0 + SSM1_REDUCE_TOKENS < pl->n_tokens ? t0 + SSM1_REDUCE_TOKENS : pl->n_tokens;
    const size_t block_stride = (size_t)pl->n_tokens * (size_t)N;
    float *grads[2] = {pl->grads->dB_proj, pl->grads->dC_proj};
    const float *partials[2] = {pl->dB_partial, pl->dC_partial};
    for (int which = 0; which < 2; which++) {
        if (!grads[which]) continue;
        if (pl->p->channel_first) {
            reduce_channel_first(pl, grads[which], partials[which], t0, t1);
            continue;
        }
        for (int64_t tok = t0; tok < t1; tok++)
            for (int64_t grp = 0; grp < G; grp++) {
                float *dst = grads[which] + (tok * G + grp) * N;
                const float *first =
                    partials[which] + (size_t)(grp * bpg) * block_stride + (size_t)(tok * N);
                for (int64_t n = 0; n < N; n += VW) {
                    vf sum = vf_load_part(first + n, N - n);
                    for (int64_t j = 1; j < bpg; j++)
                        sum =
                            vf_add(sum, vf_load_part(first + (size_t)j * block_stride + n, N - n));
                    vf_store_part(dst + n, sum, N - n);
                }
            }
    }
}
