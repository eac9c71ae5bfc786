/* The SSD kernels (ssd.h), compiled once per ISA. One item is one (sequence, head): its state
 * S [P,N] is held N-first (St [N,P], rows of P channels) so that every update and read runs
 * along P in vectors, and the chunk's products are ls_gemm calls over row-major blocks.
 *
 * Chunked form, per chunk of n <= pl->chunk tokens with a_i = dt_i A and lam_i = a_0 + ... +
 * a_i (summed in token order, within the chunk only, so no partial sum outgrows one chunk):
 *     Y   = diag(exp(lam)) (C St) + M U,   M[i,j] = (C_i . B_j) exp(lam_i - lam_j), j <= i
 *     St' = exp(lam_{n-1}) St + B^T W,     W_j = exp(lam_{n-1} - lam_j) U_j,  U_j = dt_j x_j
 * Each exponent is a difference of partial sums taken directly (never exp(lam_i) exp(-lam_j),
 * which overflows under hard decay). The recurrent form (and decode) updates the state token by
 * token in the layout it is stored in: St [N,P] for N-first states, S [P,N] (mamba's) for the
 * default, each row of S along N in vectors, so that a decode step reads and writes the pool's
 * row where it lies, with no transposition.
 * Without y (pl->y NULL: the segment summary's R) only the state is carried.
 * With bf16 products (pl->bf16_products) the products that only Y reads, C B^T, C St and M U
 * between 16-token blocks, take bf16 operands (simd/gemm_bf16.h); the state update B^T W, its
 * operands and the recurrence across chunks stay float32, so the state is bit for bit the
 * float32 products'.
 * An item's arithmetic does not depend on the thread that runs it. */
#include <math.h>
#include <string.h>

#include "simd/state_rows.h"
#include "ssd/ssd_kernel.h"
#include "ssd/ssd_pn_token.h"

/* ---- recurrent: one token at a time ----------------------------------------------------- */

static void recurrent_item(const ssd_plan *pl, const ssd_item *it, float *St, float *ys)
{
    const int64_t P = pl->P, N = pl->N;
    const float A = pl->A[it->h];
    for (int64_t t = 0; t < it->n_tokens; t++) {
        const float d = step_dt(pl, it, t), decay = expf(d * A);
        const float *x = pl->x + at_hp(pl, it, t);
        const float *Bt = pl->Bp + at_gn(pl, it, t), *Ct = pl->Cp + at_gn(pl, it, t);
        for (int64_t p = 0; p < P; p += VW) {
            const int64_t m = P - p < VW ? P - p : VW;
            const vf u = vf_mul(vf_set1(d), vf_load_n(x + p, m)), e = vf_set1(decay);
            vf acc = vf_zero();
            for (int64_t n = 0; n < N; n++) {
                float *row = St + n * P + p;
                const vf s = vf_fmadd(e, vf_load_n(row, m), vf_mul(vf_set1(Bt[n]), u));
                vf_store_n(row, s, m);
                acc = vf_fmadd(vf_set1(Ct[n]), s, acc);
            }
            vf_store_n(ys + p, acc, m);
        }
        if (pl->y) finish_token(pl, it, t, ys);
    }
}

static void recurrent_item_pn(const ssd_plan *pl, const ssd_item *it, float *S, float *ys)
{
    for (int64_t t = 0; t < it->n_tokens; t++) pn_token(pl, it, t, S, S, false, ys);
}

/* The recurrent item in mamba's [P,N] layout: on the state row itself when the call updates
 * it in place (decode, or hT == h0), else on a copy. */
static void recurrent_item_in_place(const ssd_plan *pl, const ssd_item *it, float *scratch)
{
    const int64_t size = pl->P * pl->N, at = (it->row * pl->H + it->h) * size;
    float *ys = scratch + ssd_round16(size);
    if (pl->s0 && pl->s0 == pl->sT) {
        recurrent_item_pn(pl, it, pl->sT + at, ys);
        return;
    }
    if (pl->s0)
        memcpy(scratch, pl->s0 + at, (size_t)size * sizeof *scratch);
    else
        memset(scratch, 0, (size_t)size * sizeof *scratch);
    recurrent_item_pn(pl, it, scratch, ys);
    if (pl->sT) memcpy(pl->sT + at, scratch, (size_t)size * sizeof *scratch);
}

/* A decode step over a serving engine's rows (pl->by_row). In mamba's [P,N] layout a float32
 * or bfloat16 head is stepped from its source row into its destination row where they lie
 * (pn_token); otherwise (N-first rows, half pools) the head goes from its source row
 * (widened) into scratch, takes the step there, then goes to its destination row (rounded
 * once). */
static void by_row_item(const ssd_plan *pl, const ssd_item *it, float *scratch)
{
    const ls_state_rows *r = pl->by_row;
    const int64_t size = pl->P * pl->N, at = it->h * size, dst = r->dst[it->s];
    float *ys = scratch + ssd_round16(size);
    if (!pl->n_first && it->n_tokens == 1 && r->dtype != LINSEQ_POOL_F16) {
        const void *from = ls_state_row_at(r->from, r, it->row, at);
        void *to = ls_state_row_at(r->to, r, dst, at);
        if (r->dtype == LINSEQ_POOL_BF16 && pl->round_by_instruction)
            LS_ISA_FN(ls_ssd_decode_bf16_row)(pl, it, from, to, ys);
        else if (r->dtype == LINSEQ_POOL_BF16)
            pn_token(pl, it, 0, from, to, true, ys);
        else
            pn_token(pl, it, 0, from, to, false, ys);
        return;
    }
    LS_ISA_FN(ls_state_widen_isa)
    (r->dtype, ls_state_row_at(r->from, r, it->row, at), scratch, size);
    if (pl->n_first)
        recurrent_item(pl, it, scratch, ys);
    else
        recurrent_item_pn(pl, it, scratch, ys);
    LS_ISA_FN(ls_state_narrow_isa)(r->dtype, scratch, ls_state_row_at(r->to, r, dst, at), size);
}

/* ---- chunked ------------------------------------------------------------------------------ */

/* Y = diag(exp(lam)) (C St) + M U with bf16 operands (the float32 order of chunk_scores,
 * C St and chunk_outputs): M = (C B^T) o decays, C St, and M U between 16-token blocks on
 * operands rounded once each (M after its decays, U = dt x after dt); each block's own
 * triangle of M U in float32, as without them, so that no product visits a later token. */
static void chunk_outputs_bf16(const ssd_plan *pl, int64_t n, chunk_bufs *c, const chunk_words *w)
{
    ssd_scores_bf16(pl, n, c, w);
    ssd_read_bf16(pl, n, c, w, c->Y);
    ssd_outputs_bf16(pl, n, c, w, c->Y);
}

static void chunk_step(const ssd_plan *pl, const ssd_item *it, int64_t c0, int64_t n, chunk_bufs *c,
                       const chunk_words *words)
{
    const int64_t P = pl->P, N = pl->N, L = pl->chunk;
    chunk_decays(pl, it, c0, n, c);
    chunk_gather(pl, it, c0, n, c);
    if (pl->y && pl->bf16_products) {
        chunk_outputs_bf16(pl, n, c, words);
    } else if (pl->y) { /* Y = diag(exp(lam)) (C St) + M U (no y: the state alone) */
        chunk_scores(n, N, L, c);
        ls_gemm(n, P, N, c->Cc, N, 1, c->St, P, c->Y, P, false);
        chunk_outputs(n, P, L, c, c->Y);
    }
    /* St = exp(lam_{n-1}) St + B^T W */
    for (int64_t i = 0; i < n; i++) {
        const vf w = vf_set1(c->wdec[i]);
        for (int64_t p = 0; p < P; p += VW) {
            const int64_t m = P - p < VW ? P - p : VW;
            vf_store_n(c->W + i * P + p, vf_mul(w, vf_load_n(c->U + i * P + p, m)), m);
        }
    }
    for (int64_t k = 0; k < N; k++) c->nscale[k] = c->elam[n - 1];
    ls_gemm_scaled(N, P, n, c->Bt, L, 1, c->W, P, c->St, P, true, c->nscale);
    for (int64_t i = 0; pl->y && i < n; i++) finish_token(pl, it, c0 + i, c->Y + i * P);
}

void LS_ISA_FN(ls_ssd_item)(void *ctx, int64_t item, int thread)
{
    const ssd_plan *pl = ctx;
    const ssd_item it = locate(pl, item);
    if (it.row < 0) { /* padding: no state is touched */
        for (int64_t t = 0; pl->y && t < it.n_tokens; t++)
            memset(pl->y + at_hp(pl, &it, t), 0, (size_t)pl->P * sizeof(float));
        return;
    }
    float *scratch = pl->scratch + (int64_t)thread * pl->scratch_floats;
    if (pl->by_row) {
        by_row_item(pl, &it, scratch);
    } else if (pl->chunked) {
        const int64_t L = pl->chunk;
        chunk_bufs c = carve(scratch, pl->P, pl->N, L);
        float *const words = scratch + ssd_scratch_floats(pl->P, pl->N, true, L);
        const chunk_words w = pl->bf16_products
                                  ? carve_words((uint32_t *)(void *)words, pl->P, pl->N, L)
                                  : (chunk_words){.C = NULL};
        load_state(pl, &it, c.St);
        for (int64_t c0 = 0; c0 < it.n_tokens; c0 += L)
            chunk_step(pl, &it, c0, it.n_tokens - c0 < L ? it.n_tokens - c0 : L, &c, &w);
        if (pl->sT) store_state(pl, &it, c.St);
    } else if (!pl->n_first) {
        recurrent_item_in_place(pl, &it, scratch);
    } else {
        float *St = scratch, *ys = scratch + ssd_round16(pl->N * pl->P);
        load_state(pl, &it, St);
        recurrent_item(pl, &it, St, ys);
        if (pl->sT) store_state(pl, &it, St);
    }
}
