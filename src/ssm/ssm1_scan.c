/* The fast SSM1 forward: float32 state, time-outer scan over blocks of channels.
 *
 * A work item is (sequence, block of SSM_LANES channels). Its state tile h[n][lane] (and A,
 * transposed the same way) is state-major, so each state row n is contiguous over the block's
 * channels: the update of one row is a loop over channels with no reduction, which gcc
 * vectorises (except the expf, which stays scalar until the SIMD layer supplies a vector exp).
 * Every item runs the same arithmetic whichever thread takes it, so the result does not depend
 * on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

/* One thread's buffers. */
typedef struct scan_tile {
    float *h;        /* [N][SSM_LANES] the state of the block                                 */
    float *rate;     /* [N][SSM_LANES] A of the block, transposed                             */
    float *B_lanes;  /* [N][SSM_LANES] B_t of each channel's group (blocks spanning groups)   */
    float *C_lanes;  /* [N][SSM_LANES] C_t likewise                                           */
    float *dt;       /* [SSM_LANES] the step after softplus                                   */
    float *dtx;      /* [SSM_LANES] dt * x                                                    */
    float *decay;    /* [SSM_LANES] exp(A dt) of one state row                                */
    float *out;      /* [SSM_LANES] sum_n h C                                                 */
} scan_tile;

typedef struct scan_plan {
    const linseq_ssm1_problem *p;
    int64_t G, channels_per_group, n_blocks;
    linseq_activation gate_act;
    float *y, *hT;
    float *workspace;
    size_t thread_floats;
} scan_plan;

static scan_tile tile_of_thread(const scan_plan *pl, int thread)
{
    const size_t rows = (size_t)pl->p->N * SSM_LANES;
    float *w = pl->workspace + (size_t)thread * pl->thread_floats;
    scan_tile tl;
    tl.h = w;
    tl.rate = w + rows;
    tl.B_lanes = w + 2 * rows;
    tl.C_lanes = w + 3 * rows;
    w += 4 * rows;
    tl.dt = w;
    tl.dtx = w + SSM_LANES;
    tl.decay = w + 2 * SSM_LANES;
    tl.out = w + 3 * SSM_LANES;
    return tl;
}

/* Called with lanes == SSM_LANES (a literal) for full blocks, so that after inlining the last
 * loop has a constant trip count and is vectorised at -O2. */
static inline void update_state_row(int64_t lanes, float *restrict h, const float *restrict rate,
                                    const float *restrict dt, const float *restrict dtx,
                                    float *restrict decay, float *restrict out, float b, float c)
{
    for (int64_t l = 0; l < lanes; l++) decay[l] = expf(rate[l] * dt[l]);
    for (int64_t l = 0; l < lanes; l++) {
        h[l] = decay[l] * h[l] + dtx[l] * b;
        out[l] += h[l] * c;
    }
}

/* The same with B_t and C_t given per channel. */
static inline void update_state_row_lanes(int64_t lanes, float *restrict h,
                                          const float *restrict rate, const float *restrict dt,
                                          const float *restrict dtx, float *restrict decay,
                                          float *restrict out, const float *restrict b,
                                          const float *restrict c)
{
    for (int64_t l = 0; l < lanes; l++) decay[l] = expf(rate[l] * dt[l]);
    for (int64_t l = 0; l < lanes; l++) {
        h[l] = decay[l] * h[l] + dtx[l] * b[l];
        out[l] += h[l] * c[l];
    }
}

/* B_lanes[n][l], C_lanes[n][l] <- B_t, C_t of the group of channel d0 + l. */
static void spread_groups(const scan_plan *pl, int64_t tok, int64_t d0, int64_t lanes,
                          const scan_tile *tl)
{
    const int64_t N = pl->p->N, cpg = pl->channels_per_group;
    for (int64_t l = 0; l < lanes;) {
        const int64_t g = (d0 + l) / cpg;
        const int64_t end = (g + 1) * cpg - d0 < lanes ? (g + 1) * cpg - d0 : lanes;
        const float *B_g = pl->p->B_proj + (tok * pl->G + g) * N;
        const float *C_g = pl->p->C_proj + (tok * pl->G + g) * N;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = l; k < end; k++) {
                tl->B_lanes[n * SSM_LANES + k] = B_g[n];
                tl->C_lanes[n * SSM_LANES + k] = C_g[n];
            }
        }
        l = end;
    }
}

static void scan_item(void *ctx, int64_t item, int thread)
{
    const scan_plan *pl = ctx;
    const linseq_ssm1_problem *p = pl->p;
    const int64_t D = p->D, N = p->N;
    const int64_t seq = item / pl->n_blocks;
    const int64_t d0 = item % pl->n_blocks * SSM_LANES;
    const int64_t lanes = D - d0 < SSM_LANES ? D - d0 : SSM_LANES;
    const bool full = lanes == SSM_LANES;
    const bool one_group = d0 / pl->channels_per_group == (d0 + lanes - 1) / pl->channels_per_group;
    const int64_t group = d0 / pl->channels_per_group;
    const scan_tile tl = tile_of_thread(pl, thread);

    for (int64_t l = 0; l < lanes; l++) {
        const float *A_row = p->A + (d0 + l) * N;
        const float *h0_row = p->h0 ? p->h0 + (seq * D + d0 + l) * N : NULL;
        for (int64_t n = 0; n < N; n++) {
            tl.rate[n * SSM_LANES + l] = A_row[n];
            tl.h[n * SSM_LANES + l] = h0_row ? h0_row[n] : 0.0f;
        }
    }

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    for (int64_t tok = start; tok < start + len; tok++) {
        const float *x_t = p->x + tok * D + d0;
        const float *dt_t = p->dt + tok * D + d0;
        for (int64_t l = 0; l < lanes; l++) {
            float dt = dt_t[l];
            if (p->dt_softplus) dt = ls_softplusf(dt + (p->dt_bias ? p->dt_bias[d0 + l] : 0.0f));
            tl.dt[l] = dt;
            tl.dtx[l] = dt * x_t[l];
            tl.out[l] = 0.0f;
        }

        if (one_group) {
            const float *B_t = p->B_proj + (tok * pl->G + group) * N;
            const float *C_t = p->C_proj + (tok * pl->G + group) * N;
            for (int64_t n = 0; n < N; n++) {
                float *h = tl.h + n * SSM_LANES;
                const float *rate = tl.rate + n * SSM_LANES;
                if (full)
                    update_state_row(SSM_LANES, h, rate, tl.dt, tl.dtx, tl.decay, tl.out, B_t[n],
                                     C_t[n]);
                else
                    update_state_row(lanes, h, rate, tl.dt, tl.dtx, tl.decay, tl.out, B_t[n],
                                     C_t[n]);
            }
        } else {
            spread_groups(pl, tok, d0, lanes, &tl);
            for (int64_t n = 0; n < N; n++) {
                float *h = tl.h + n * SSM_LANES;
                const float *rate = tl.rate + n * SSM_LANES;
                const float *b = tl.B_lanes + n * SSM_LANES, *c = tl.C_lanes + n * SSM_LANES;
                if (full)
                    update_state_row_lanes(SSM_LANES, h, rate, tl.dt, tl.dtx, tl.decay, tl.out, b,
                                           c);
                else
                    update_state_row_lanes(lanes, h, rate, tl.dt, tl.dtx, tl.decay, tl.out, b, c);
            }
        }

        float *y_t = pl->y + tok * D + d0;
        for (int64_t l = 0; l < lanes; l++) {
            float v = tl.out[l];
            if (p->D_skip) v += p->D_skip[d0 + l] * x_t[l];
            if (p->gate) v *= ls_activate(pl->gate_act, p->gate[tok * D + d0 + l]);
            y_t[l] = v;
        }
    }

    /* The rows of h0 this item read are its own, so writing hT over them (hT == h0) is safe. */
    if (pl->hT) {
        for (int64_t l = 0; l < lanes; l++) {
            float *hT_row = pl->hT + (seq * D + d0 + l) * N;
            for (int64_t n = 0; n < N; n++) hT_row[n] = tl.h[n * SSM_LANES + l];
        }
    }
}

linseq_status ls_ssm1_scan(const linseq_ssm1_problem *p, const linseq_exec *exec, float *y,
                           float *hT)
{
    scan_plan pl = {.p = p, .y = y, .hT = hT};
    pl.G = p->G ? p->G : 1;
    pl.channels_per_group = p->D / pl.G;
    pl.n_blocks = (p->D + SSM_LANES - 1) / SSM_LANES;
    pl.gate_act = ssm1_gate_activation(p);
    const int64_t n_items = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B) * pl.n_blocks;
    const int n_threads = ls_resolve_threads(exec, n_items, 16.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->N);

    /* Per thread: four [N][SSM_LANES] tiles and four lane vectors, rounded up to 64 bytes so
     * that threads never share a cache line. A size this cannot represent could not be
     * allocated either. */
    int64_t tile_floats, total_bytes;
    if (!ls_mul_ok(&tile_floats, 2, p->N, (int64_t)(4 * SSM_LANES)) || tile_floats > INT64_MAX / 2)
        return LINSEQ_ERR_OUT_OF_MEMORY;
    const int64_t thread_floats = (tile_floats + 4 * SSM_LANES + 15) / 16 * 16;
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(n_items, n_threads, scan_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}
