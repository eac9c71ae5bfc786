/* The SSM1 forward kernel, compiled once per ISA: one work item is (sequence, block of
 * SSM_LANES channels).
 *
 * Per token, each state row n of the block's tile is updated as STRIPS whole vectors: the
 * decay exp(A dt), the update and the C_t product are fused in registers, and the sum over n
 * accumulates in one register per strip, so the state tile is read and written once per token
 * and nothing else touches memory but the token's inputs and y. The step inputs (softplus,
 * the gate's activation) are computed for SSM1_SCAN_CHUNK tokens at a time before their
 * updates, off the updates' dependency chains. A, h0 and hT are [channel][N]
 * in memory; they are moved to and from the state-major tiles with register transposes. */
#include <string.h>

#include "ssm/ssm1_simd.h"
#include "ssm/ssm_kernels.h"
#include "ssm/ssm_layout.h"

/* The rows of one chunk of tokens of a block: in place, or the thread's tiles (ssm_layout.h). */
typedef struct chunk_rows {
    ssm_rows x, dt, gate;
    ssm_proj_rows B, C;
    ssm_out_rows y;
} chunk_rows;

/* The rows of tokens [tok0, tok0 + count) (at most SSM1_SCAN_PACK) of a block, in the thread's
 * tiles after the step-input rows: x, dt, gate, y, then B and C. */
static chunk_rows chunk_rows_of(const ssm1_scan_plan *pl, float *tiles, int64_t tok0, int64_t count,
                                ssm_prefetch ahead, int64_t d0, int64_t lanes)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t T = p->T, N = p->N, cpg = pl->channels_per_group;
    const int64_t rows = SSM1_SCAN_PACK * SSM_LANES;
    const int64_t g0 = d0 / cpg, ng = (d0 + lanes - 1) / cpg - g0 + 1;
    float *bc = tiles + 4 * rows;
    chunk_rows cr;
    cr.x = ssm_rows_in(&pl->x, T, tok0, count, ahead, d0, lanes, tiles);
    cr.dt = ssm_rows_in(&pl->dt, T, tok0, count, ahead, d0, lanes, tiles + rows);
    cr.gate = p->gate ? ssm_rows_in(&pl->gate, T, tok0, count, ahead, d0, lanes, tiles + 2 * rows)
                      : (ssm_rows){NULL, 0, false};
    cr.y = ssm_rows_out(pl->y, p->channel_first, T, p->D, tok0, count, d0, lanes, tiles + 3 * rows);
    cr.B = ssm_proj_in(&pl->B, T, N, tok0, count, ahead, g0, ng, bc);
    cr.C = ssm_proj_in(&pl->C, T, N, tok0, count, ahead, g0, ng,
                       bc + SSM1_SCAN_PACK * pl->bc_groups * N);
    return cr;
}

/* The same rows from token k0 of them on. */
static chunk_rows chunk_rows_from(const chunk_rows *cr, int64_t k0)
{
    chunk_rows r = *cr;
    r.x.p += k0 * r.x.stride;
    r.dt.p += k0 * r.dt.stride;
    if (r.gate.p) r.gate.p += k0 * r.gate.stride;
    r.y.p += k0 * r.y.stride;
    r.B.p += k0 * r.B.token;
    r.C.p += k0 * r.C.token;
    return r;
}

/* The step inputs of the `count` tokens of a chunk: dt after softplus, dt x and act(gate),
 * [count][SSM_LANES] each. The sequence has `left` tokens from the chunk's first on. */
static inline void scan_inputs(const ssm1_scan_plan *pl, const chunk_rows *cr, int64_t count,
                               int64_t left, int64_t d0, int64_t lanes, float *dt_rows,
                               float *dtx_rows, float *gact_rows)
{
    const linseq_ssm1_problem *p = pl->p;
    for (int64_t k = 0; k < count; k++) {
        const float *dt_t = cr->dt.p + k * cr->dt.stride, *x_t = cr->x.p + k * cr->x.stride;
        const float *g_t = p->gate ? cr->gate.p + k * cr->gate.stride : NULL;
        /* The rows of the next chunk, which the next call reads (see ls_prefetch_floats). */
        if (k + SSM1_SCAN_CHUNK < left) {
            if (cr->dt.in_place) ls_prefetch_floats(dt_t + SSM1_SCAN_CHUNK * cr->dt.stride, lanes);
            if (cr->x.in_place) ls_prefetch_floats(x_t + SSM1_SCAN_CHUNK * cr->x.stride, lanes);
            if (g_t && cr->gate.in_place)
                ls_prefetch_floats(g_t + SSM1_SCAN_CHUNK * cr->gate.stride, lanes);
            if (!cr->y.dst)
                ls_prefetch_floats_for_write(cr->y.p + (k + SSM1_SCAN_CHUNK) * cr->y.stride, lanes);
        }
        for (int64_t s = 0; s < STRIPS; s++) {
            const int64_t valid = lanes - s * VW, o = k * SSM_LANES + s * VW;
            const vf dt = ssm1_step_dt(p, dt_t + s * VW, d0 + s * VW, valid);
            vf_store(dt_rows + o, dt);
            vf_store(dtx_rows + o, vf_mul(dt, vf_load_part(x_t + s * VW, valid)));
            if (g_t)
                vf_store(gact_rows + o, vf_act(pl->gate_act, vf_load_part(g_t + s * VW, valid)));
        }
    }
}

/* y of token k of the chunk from out = sum_n h C: the skip term, then the gate. */
LS_INLINE void scan_output(const ssm1_scan_plan *pl, const chunk_rows *cr, int64_t k, int64_t d0,
                           int64_t lanes, const vf out[STRIPS], const float *gact_row)
{
    const linseq_ssm1_problem *p = pl->p;
    float *y_t = cr->y.p + k * cr->y.stride;
    const float *x_t = cr->x.p + k * cr->x.stride;
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) {
        const int64_t valid = lanes - s * VW;
        vf v = out[s];
        if (p->D_skip)
            v = ssm1_skip(v, p->D_skip + d0 + s * VW, vf_load_part(x_t + s * VW, valid), valid);
        if (p->gate) v = vf_mul(v, vf_load(gact_row + s * VW));
        vf_store_part(y_t + s * VW, v, valid);
    }
}

/* B_lanes[n][l], C_lanes[n][l] <- B_t, C_t of the group of channel d0 + l (token k of the
 * chunk), for a block whose channels span groups; lanes past the block stay as they are
 * (zero). */
static inline void spread_groups(const ssm1_scan_plan *pl, const chunk_rows *cr, int64_t k,
                                 int64_t d0, int64_t lanes, float *B_lanes, float *C_lanes)
{
    const int64_t N = pl->p->N, cpg = pl->channels_per_group;
    for (int64_t l = 0; l < lanes;) {
        const int64_t g = (d0 + l) / cpg;
        const int64_t end = (g + 1) * cpg - d0 < lanes ? (g + 1) * cpg - d0 : lanes;
        const float *B_g = ssm_proj_at(&cr->B, k, g), *C_g = ssm_proj_at(&cr->C, k, g);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t j = l; j < end; j++) {
                B_lanes[n * SSM_LANES + j] = B_g[n];
                C_lanes[n * SSM_LANES + j] = C_g[n];
            }
        }
        l = end;
    }
}

/* A sequence of one token (decode): the update runs on the [channel][N] rows of the old state,
 * A and B_t as they lie in memory, lanes = states, writing new_rows (hT, the pool row, or the
 * scratch `rows`) directly; only the new state is transposed, into the tile h, for the sum over
 * n, which then runs exactly as in scan_token. Each state is the same bits as scan_token's (the
 * same operations on the same values). So a decode step moves one [64][N] block through
 * registers instead of three (A, h0, hT). */
static void scan_single_token(const ssm1_scan_plan *pl, const chunk_rows *cr, int64_t d0,
                              int64_t lanes, int64_t group, const float *h0_rows, float *new_rows,
                              float *h, float *B_lanes, float *C_lanes, const float *dt_row,
                              const float *dtx_row, const float *gact_row)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t N = p->N, cpg = pl->channels_per_group;
    /* Locals, not fields: the vector stores may alias anything, and would force reloads. */
    const float *A_rows = p->A + d0 * N;
    /* Columns n .. n+VW-1 of every row, channels inner (so the loop holds no masks and the
     * constants stay in registers). Each vector is read before it is written: new_rows ==
     * h0_rows is safe. */
    for (int64_t n = 0; n < N; n += VW) {
        const int64_t valid = N - n;
        /* The group of channel d0 + l, stepped at group boundaries (no division per channel). */
        int64_t g = d0 / cpg, next_group = (g + 1) * cpg - d0;
        if (valid >= VW) {
            for (int64_t l = 0; l < lanes; l++) {
                if (l == next_group) g++, next_group += cpg;
                const int64_t o = l * N + n;
                const vf decay = ssm1_decay(vf_load(A_rows + o), vf_set1(dt_row[l]));
                const vf h_prev = h0_rows ? vf_load(h0_rows + o) : vf_zero();
                vf_store(new_rows + o, ssm1_update(decay, h_prev, vf_set1(dtx_row[l]),
                                                   vf_load(ssm_proj_at(&cr->B, 0, g) + n)));
            }
        } else {
            for (int64_t l = 0; l < lanes; l++) {
                if (l == next_group) g++, next_group += cpg;
                const int64_t o = l * N + n;
                const vf decay = ssm1_decay(vf_load_n(A_rows + o, valid), vf_set1(dt_row[l]));
                const vf h_prev = h0_rows ? vf_load_n(h0_rows + o, valid) : vf_zero();
                vf_store_n(new_rows + o,
                           ssm1_update(decay, h_prev, vf_set1(dtx_row[l]),
                                       vf_load_n(ssm_proj_at(&cr->B, 0, g) + n, valid)),
                           valid);
            }
        }
    }
    ls_transpose_copy(h, SSM_LANES, new_rows, N, lanes, N);

    vf out[STRIPS];
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) out[s] = vf_zero();
    if (group >= 0) {
        const float *C_t = ssm_proj_at(&cr->C, 0, group);
        for (int64_t n = 0; n < N; n++) {
            const vf c = vf_set1(C_t[n]);
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++)
                out[s] = vf_fmadd(vf_load(h + n * SSM_LANES + s * VW), c, out[s]);
        }
    } else {
        spread_groups(pl, cr, 0, d0, lanes, B_lanes, C_lanes);
        for (int64_t n = 0; n < N; n++) {
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++)
                out[s] = vf_fmadd(vf_load(h + n * SSM_LANES + s * VW),
                                  vf_load(C_lanes + n * SSM_LANES + s * VW), out[s]);
        }
    }
    scan_output(pl, cr, 0, d0, lanes, out, gact_row);
}

/* Token k of a chunk of a block: the tile update and y. A ragged block computes its whole
 * width too (its lanes past D read zeros and store nothing), so that every strip loop has the
 * constant trip count STRIPS and the per-strip values stay in registers. */
static inline void scan_token(const ssm1_scan_plan *pl, const chunk_rows *cr, int64_t k, int64_t d0,
                              int64_t lanes, int64_t group, float *h, const float *rate,
                              float *B_lanes, float *C_lanes, const float *dt_row,
                              const float *dtx_row, const float *gact_row)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t N = p->N;
    vf dt[STRIPS], dtx[STRIPS], out[STRIPS];
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) {
        dt[s] = vf_load(dt_row + s * VW);
        dtx[s] = vf_load(dtx_row + s * VW);
        out[s] = vf_zero();
    }

    if (group >= 0) {
        const float *B_t = ssm_proj_at(&cr->B, k, group), *C_t = ssm_proj_at(&cr->C, k, group);
        for (int64_t n = 0; n < N; n++) {
            const vf b = vf_set1(B_t[n]), c = vf_set1(C_t[n]);
            float *h_row = h + n * SSM_LANES;
            const float *rate_row = rate + n * SSM_LANES;
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++) {
                const vf decay = ssm1_decay(vf_load(rate_row + s * VW), dt[s]);
                const vf hv = ssm1_update(decay, vf_load(h_row + s * VW), dtx[s], b);
                vf_store(h_row + s * VW, hv);
                out[s] = vf_fmadd(hv, c, out[s]);
            }
        }
    } else {
        spread_groups(pl, cr, k, d0, lanes, B_lanes, C_lanes);
        for (int64_t n = 0; n < N; n++) {
            float *h_row = h + n * SSM_LANES;
            const float *rate_row = rate + n * SSM_LANES;
            const float *b_row = B_lanes + n * SSM_LANES, *c_row = C_lanes + n * SSM_LANES;
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++) {
                const vf decay = ssm1_decay(vf_load(rate_row + s * VW), dt[s]);
                const vf hv =
                    ssm1_update(decay, vf_load(h_row + s * VW), dtx[s], vf_load(b_row + s * VW));
                vf_store(h_row + s * VW, hv);
                out[s] = vf_fmadd(hv, vf_load(c_row + s * VW), out[s]);
            }
        }
    }

    scan_output(pl, cr, k, d0, lanes, out, gact_row);
}

/* The state rows of sequence seq from channel d0: where the old state is read (NULL: zeros)
 * and the new one written (NULL: nowhere). false: a padding request of a pool decode. */
static bool state_rows_of(const ssm1_scan_plan *pl, int64_t seq, int64_t d0, const float **h0_rows,
                          float **hT_rows)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N;
    if (pl->pool) {
        const int64_t row = pl->pool_rows ? pl->pool_rows[seq] : seq;
        if (row < 0) return false;
        *hT_rows = pl->pool + (row * D + d0) * N;
        *h0_rows = *hT_rows;
        return true;
    }
    *h0_rows = p->h0 ? p->h0 + (seq * D + d0) * N : NULL;
    *hT_rows = pl->hT ? pl->hT + (seq * D + d0) * N : NULL;
    return true;
}

/* y of a padding request's token (a pool decode): zeros. */
static void zero_output(const ssm1_scan_plan *pl, float *tiles, int64_t tok, int64_t d0,
                        int64_t lanes)
{
    ssm_out_rows y = ssm_rows_out(pl->y, pl->p->channel_first, pl->p->T, pl->p->D, tok, 1, d0,
                                  lanes, tiles + 3 * SSM1_SCAN_PACK * SSM_LANES);
    memset(y.p, 0, (size_t)lanes * sizeof(float));
    ssm_rows_flush(&y, (ssm_prefetch){0, 0});
}

/* Training: the state before token `done` of sequence seq (a multiple of SSM_BWD_SEGMENT),
 * the tile h, into its checkpoint of the saved block: row n of the tile to row n of the
 * state-major [N][D] checkpoint, this block's lanes. */
_Static_assert(SSM_BWD_SEGMENT % SSM1_SCAN_CHUNK == 0 && SSM1_SCAN_PACK % SSM1_SCAN_CHUNK == 0,
               "checkpoints fall on the first token of a chunk");
static void save_checkpoint(const ssm1_scan_plan *pl, int64_t seq, int64_t done, int64_t d0,
                            int64_t lanes, const float *h)
{
    const int64_t N = pl->p->N, D = pl->p->D;
    const int64_t c = pl->saved_first[seq] + done / SSM_BWD_SEGMENT;
    float *dst = pl->saved + (size_t)c * (size_t)N * (size_t)D + (size_t)d0;
    for (int64_t n = 0; n < N; n++)
        memcpy(dst + (size_t)n * (size_t)D, h + n * SSM_LANES, (size_t)lanes * sizeof(float));
}

/* Sequence seq, the block of channels from d0. */
static void scan_block(const ssm1_scan_plan *pl, int64_t seq, int64_t d0, int thread)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N;
    const int64_t lanes = D - d0 < SSM_LANES ? D - d0 : SSM_LANES;
    const int64_t cpg = pl->channels_per_group;
    /* The block's group, or -1 when its channels span groups (B_t, C_t then per lane). */
    const int64_t group = d0 / cpg == (d0 + lanes - 1) / cpg ? d0 / cpg : -1;

    const size_t rows = (size_t)N * SSM_LANES;
    float *h = pl->workspace + (size_t)thread * pl->thread_floats;
    float *rate = h + rows, *B_lanes = h + 2 * rows, *C_lanes = h + 3 * rows;
    float *dt_rows = h + 4 * rows, *dtx_rows = dt_rows + SSM1_SCAN_CHUNK * SSM_LANES;
    float *gact_rows = dtx_rows + SSM1_SCAN_CHUNK * SSM_LANES;
    float *tiles = gact_rows + SSM1_SCAN_CHUNK * SSM_LANES;
    /* Lanes past a ragged block stay zero: rate 0 gives decay 1 and the state stays 0. */
    if (lanes < SSM_LANES) memset(h, 0, 4 * rows * sizeof(float));

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    const float *h0_rows;
    float *hT_rows;
    if (!state_rows_of(pl, seq, d0, &h0_rows, &hT_rows)) {
        zero_output(pl, tiles, start, d0, lanes);
        return;
    }
    /* (training runs the general path, whose first checkpoint is the tile h0 fills) */
    if (len == 1 && !pl->saved) {
        chunk_rows cr = chunk_rows_of(pl, tiles, start, 1, (ssm_prefetch){0, 0}, d0, lanes);
        scan_inputs(pl, &cr, 1, 1, d0, lanes, dt_rows, dtx_rows, gact_rows);
        scan_single_token(pl, &cr, d0, lanes, group, h0_rows, hT_rows ? hT_rows : rate, h, B_lanes,
                          C_lanes, dt_rows, dtx_rows, gact_rows);
        ssm_rows_flush(&cr.y, (ssm_prefetch){0, 0});
        return;
    }

    ls_transpose_copy(rate, SSM_LANES, p->A + d0 * N, N, lanes, N);
    if (h0_rows)
        ls_transpose_copy(h, SSM_LANES, h0_rows, N, lanes, N);
    else if (lanes == SSM_LANES)
        memset(h, 0, rows * sizeof(float));
    for (int64_t p0 = start; p0 < start + len; p0 += SSM1_SCAN_PACK) {
        const int64_t packed =
            start + len - p0 < SSM1_SCAN_PACK ? start + len - p0 : SSM1_SCAN_PACK;
        const int64_t rest = start + len - p0 - packed;
        const ssm_prefetch ahead = {packed, rest < SSM1_SCAN_PACK ? rest : SSM1_SCAN_PACK};
        const chunk_rows pack = chunk_rows_of(pl, tiles, p0, packed, ahead, d0, lanes);
        for (int64_t k0 = 0; k0 < packed; k0 += SSM1_SCAN_CHUNK) {
            const int64_t count = packed - k0 < SSM1_SCAN_CHUNK ? packed - k0 : SSM1_SCAN_CHUNK;
            const chunk_rows cr = chunk_rows_from(&pack, k0);
            if (pl->saved && (p0 - start + k0) % SSM_BWD_SEGMENT == 0)
                save_checkpoint(pl, seq, p0 - start + k0, d0, lanes, h);
            scan_inputs(pl, &cr, count, start + len - p0 - k0, d0, lanes, dt_rows, dtx_rows,
                        gact_rows);
            for (int64_t k = 0; k < count; k++)
                scan_token(pl, &cr, k, d0, lanes, group, h, rate, B_lanes, C_lanes,
                           dt_rows + k * SSM_LANES, dtx_rows + k * SSM_LANES,
                           gact_rows + k * SSM_LANES);
        }
        ssm_rows_flush(&pack.y, ahead);
    }

    /* The rows of h0 this item read are its own, so writing hT over them (hT == h0) is safe. */
    if (hT_rows) ls_transpose_copy(hT_rows, N, h, SSM_LANES, N, lanes);
}

void LS_ISA_FN(ls_ssm1_scan_item)(void *ctx, int64_t item, int thread)
{
    const ssm1_scan_plan *pl = ctx;
    const int64_t items_per_seq = (pl->n_blocks + pl->blocks_per_item - 1) / pl->blocks_per_item;
    const int64_t seq = item / items_per_seq;
    const int64_t b0 = item % items_per_seq * pl->blocks_per_item;
    const int64_t b1 =
        b0 + pl->blocks_per_item < pl->n_blocks ? b0 + pl->blocks_per_item : pl->n_blocks;
    for (int64_t b = b0; b < b1; b++) scan_block(pl, seq, b * SSM_LANES, thread);
}
