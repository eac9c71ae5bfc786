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

/* The step inputs of tokens [tok0, tok0 + count) of a block: dt after softplus, dt x and
 * act(gate), [count][SSM_LANES] each. The sequence ends at token `end`. */
static inline void scan_inputs(const ssm1_scan_plan *pl, int64_t tok0, int64_t count, int64_t end,
                               int64_t d0, int64_t lanes, float *dt_rows, float *dtx_rows,
                               float *gact_rows)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D;
    for (int64_t k = 0; k < count; k++) {
        const int64_t row = (tok0 + k) * D + d0;
        /* The rows of the next chunk, which the next call reads (see ls_prefetch_floats). */
        if (tok0 + k + SSM1_SCAN_CHUNK < end) {
            const int64_t ahead = row + SSM1_SCAN_CHUNK * D;
            ls_prefetch_floats(p->dt + ahead, lanes);
            ls_prefetch_floats(p->x + ahead, lanes);
            if (p->gate) ls_prefetch_floats(p->gate + ahead, lanes);
            ls_prefetch_floats_for_write(pl->y + ahead, lanes);
        }
        for (int64_t s = 0; s < STRIPS; s++) {
            const int64_t valid = lanes - s * VW, o = k * SSM_LANES + s * VW;
            const vf dt = ssm1_step_dt(p, p->dt + row + s * VW, d0 + s * VW, valid);
            vf_store(dt_rows + o, dt);
            vf_store(dtx_rows + o, vf_mul(dt, vf_load_part(p->x + row + s * VW, valid)));
            if (p->gate)
                vf_store(gact_rows + o,
                         vf_act(pl->gate_act, vf_load_part(p->gate + row + s * VW, valid)));
        }
    }
}

/* y of one token from out = sum_n h C: the skip term, then the gate. */
LS_INLINE void scan_output(const ssm1_scan_plan *pl, int64_t tok, int64_t d0, int64_t lanes,
                           const vf out[STRIPS], const float *gact_row)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D;
    float *y_t = pl->y + tok * D + d0;
    const float *x_t = p->x + tok * D + d0;
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

/* A sequence of one token (decode): the update runs on the [channel][N] rows of h0, A and B_t
 * as they lie in memory, lanes = states, writing hT (or `rows`) directly; only the new state is
 * transposed, into the tile h, for the sum over n, which then runs exactly as in scan_token.
 * Each state is the same bits as scan_token's (the same operations on the same values). So a
 * decode step moves one [64][N] block through registers instead of three (A, h0, hT). */
static void scan_single_token(const ssm1_scan_plan *pl, int64_t seq, int64_t tok, int64_t d0,
                              int64_t lanes, int64_t group, float *h, float *rows, float *B_lanes,
                              float *C_lanes, const float *dt_row, const float *dtx_row,
                              const float *gact_row)
{
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N, cpg = pl->channels_per_group;
    /* Locals, not fields: the vector stores may alias anything, and would force reloads. */
    const float *A_rows = p->A + d0 * N;
    const float *h0_rows = p->h0 ? p->h0 + (seq * D + d0) * N : NULL;
    const float *B_tok = p->B_proj + tok * pl->G * N;
    float *new_rows = pl->hT ? pl->hT + (seq * D + d0) * N : rows;
    /* Columns n .. n+VW-1 of every row, channels inner (so the loop holds no masks and the
     * constants stay in registers). Each vector is read before it is written: hT == h0 is
     * safe. */
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
                                                   vf_load(B_tok + g * N + n)));
            }
        } else {
            for (int64_t l = 0; l < lanes; l++) {
                if (l == next_group) g++, next_group += cpg;
                const int64_t o = l * N + n;
                const vf decay = ssm1_decay(vf_load_n(A_rows + o, valid), vf_set1(dt_row[l]));
                const vf h_prev = h0_rows ? vf_load_n(h0_rows + o, valid) : vf_zero();
                vf_store_n(new_rows + o,
                           ssm1_update(decay, h_prev, vf_set1(dtx_row[l]),
                                       vf_load_n(B_tok + g * N + n, valid)),
                           valid);
            }
        }
    }
    ls_transpose_copy(h, SSM_LANES, new_rows, N, lanes, N);

    vf out[STRIPS];
    LS_UNROLL_STRIPS
    for (int64_t s = 0; s < STRIPS; s++) out[s] = vf_zero();
    if (group >= 0) {
        const float *C_t = p->C_proj + (tok * pl->G + group) * N;
        for (int64_t n = 0; n < N; n++) {
            const vf c = vf_set1(C_t[n]);
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++)
                out[s] = vf_fmadd(vf_load(h + n * SSM_LANES + s * VW), c, out[s]);
        }
    } else {
        ssm1_spread_groups(p, pl->G, cpg, tok, d0, lanes, B_lanes, C_lanes);
        for (int64_t n = 0; n < N; n++) {
            LS_UNROLL_STRIPS
            for (int64_t s = 0; s < STRIPS; s++)
                out[s] = vf_fmadd(vf_load(h + n * SSM_LANES + s * VW),
                                  vf_load(C_lanes + n * SSM_LANES + s * VW), out[s]);
        }
    }
    scan_output(pl, tok, d0, lanes, out, gact_row);
}

/* One token of a block: the tile update and y. A ragged block computes its whole width too
 * (its lanes past D read zeros and store nothing), so that every strip loop has the constant
 * trip count STRIPS and the per-strip values stay in registers. */
static inline void scan_token(const ssm1_scan_plan *pl, int64_t tok, int64_t d0, int64_t lanes,
                              int64_t group, float *h, const float *rate, float *B_lanes,
                              float *C_lanes, const float *dt_row, const float *dtx_row,
                              const float *gact_row)
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
        const float *B_t = p->B_proj + (tok * pl->G + group) * N;
        const float *C_t = p->C_proj + (tok * pl->G + group) * N;
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
        ssm1_spread_groups(p, pl->G, pl->channels_per_group, tok, d0, lanes, B_lanes, C_lanes);
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

    scan_output(pl, tok, d0, lanes, out, gact_row);
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
    /* Lanes past a ragged block stay zero: rate 0 gives decay 1 and the state stays 0. */
    if (lanes < SSM_LANES) memset(h, 0, 4 * rows * sizeof(float));

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    if (len == 1) {
        scan_inputs(pl, start, 1, start + 1, d0, lanes, dt_rows, dtx_rows, gact_rows);
        scan_single_token(pl, seq, start, d0, lanes, group, h, rate, B_lanes, C_lanes, dt_rows,
                          dtx_rows, gact_rows);
        return;
    }

    ls_transpose_copy(rate, SSM_LANES, p->A + d0 * N, N, lanes, N);
    if (p->h0)
        ls_transpose_copy(h, SSM_LANES, p->h0 + (seq * D + d0) * N, N, lanes, N);
    else if (lanes == SSM_LANES)
        memset(h, 0, rows * sizeof(float));
    for (int64_t c0 = start; c0 < start + len; c0 += SSM1_SCAN_CHUNK) {
        const int64_t count =
            start + len - c0 < SSM1_SCAN_CHUNK ? start + len - c0 : SSM1_SCAN_CHUNK;
        scan_inputs(pl, c0, count, start + len, d0, lanes, dt_rows, dtx_rows, gact_rows);
        for (int64_t k = 0; k < count; k++)
            scan_token(pl, c0 + k, d0, lanes, group, h, rate, B_lanes, C_lanes,
                       dt_rows + k * SSM_LANES, dtx_rows + k * SSM_LANES,
                       gact_rows + k * SSM_LANES);
    }

    /* The rows of h0 this item read are its own, so writing hT over them (hT == h0) is safe. */
    if (pl->hT) ls_transpose_copy(pl->hT + (seq * D + d0) * N, N, h, SSM_LANES, N, lanes);
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
