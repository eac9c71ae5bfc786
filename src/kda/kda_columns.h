/* Internal: the column blocks of KDA's recurrent step on a [K,V]-first state (include from
 * *_simd.c files only: every function is static inline): kda_recurrent_simd.c's forward and
 * decode, and kda_decode_bf16_simd.c's decode over bf16 rows on AVX512-BF16.
 *
 * A bf16 state is widened as loaded and rounded once as stored, by KDA_STORE_BF16 (a vector)
 * and KDA_STORE_BF16_PAIR (an even/odd pair, full blocks on AVX-512 and AVX2): simd/bf16.h's
 * integer rounding unless the including file defines them otherwise. */
#ifndef LS_KDA_COLUMNS_H
#define LS_KDA_COLUMNS_H

#include "kda/kda_simd.h"

#ifndef KDA_STORE_BF16
#define KDA_STORE_BF16 vf_store_bf16
#endif
#if LS_HAVE_BF16_PAIR && !defined(KDA_STORE_BF16_PAIR)
#define KDA_STORE_BF16_PAIR vf_store_bf16_pair
#endif

enum { COLS = 4 }; /* vectors per column block */

/* The state's vectors at element `at`: float32, or bf16 widened as loaded and rounded once as
 * stored (half known at compile time wherever these are inlined). */
static inline __attribute__((always_inline)) vf state_load(const void *S, int64_t at, int64_t w,
                                                           bool half)
{
    if (half)
        return w == VW ? vf_load_bf16((const uint16_t *)S + at)
                       : vf_load_bf16_n((const uint16_t *)S + at, w);
    return w == VW ? vf_load((const float *)S + at) : vf_load_n((const float *)S + at, w);
}

static inline __attribute__((always_inline)) void state_store(void *S, int64_t at, vf x, int64_t w,
                                                              bool half)
{
    if (half && w == VW)
        KDA_STORE_BF16((uint16_t *)S + at, x);
    else if (half)
        vf_store_bf16_n((uint16_t *)S + at, x, w);
    else if (w == VW)
        vf_store((float *)S + at, x);
    else
        vf_store_n((float *)S + at, x, w);
}

/* One token's terms as column_block reads them (token_factors). */
typedef struct {
    const float *a, *ak, *aq, *ks;
    float qk, beta;
    bool delta;
} token_terms;

/* One column block of n vectors (n <= COLS; the last one w lanes wide), read from `from` and
 * written to `to` (the same state in place, or a serving engine's other row). Always
 * inlined, so that the full-block call below compiles to a body with constant trip counts and
 * its sums in registers (called with run-time sizes it ran 1.6x slower). */
static inline __attribute__((always_inline)) void
column_block(int64_t K, int64_t V, const void *from, void *to, bool half, int64_t j0, int nv,
             int64_t w_last, const token_terms *t, const float *v, float *out)
{
    vf acc_p[COLS], acc_o[COLS], u[COLS];
    for (int c = 0; c < COLS; c++) acc_p[c] = acc_o[c] = vf_zero();
    const bool full = nv == COLS && w_last == VW;
    for (int64_t i = 0; i < K; i++) {
        const int64_t row = i * V + j0;
        const vf vak = vf_set1(t->ak[i]), vaq = vf_set1(t->aq[i]);
        if (full) {
#pragma GCC unroll 4
            for (int c = 0; c < COLS; c++) {
                const vf s = state_load(from, row + c * VW, VW, half);
                acc_p[c] = vf_fmadd(vak, s, acc_p[c]);
                acc_o[c] = vf_fmadd(vaq, s, acc_o[c]);
            }
        } else {
            for (int c = 0; c < nv; c++) {
                const vf s = state_load(from, row + c * VW, c == nv - 1 ? w_last : VW, half);
                acc_p[c] = vf_fmadd(vak, s, acc_p[c]);
                acc_o[c] = vf_fmadd(vaq, s, acc_o[c]);
            }
        }
    }
    const vf vb = vf_set1(t->beta), vqk = vf_set1(t->qk);
    for (int c = 0; c < nv; c++) {
        const int64_t w = c == nv - 1 ? w_last : VW;
        const vf vin = w == VW ? vf_load(v + j0 + c * VW) : vf_load_n(v + j0 + c * VW, w);
        u[c] = t->delta ? vf_mul(vb, vf_sub(vin, acc_p[c])) : vin;
        if (out) {
            const vf o = vf_fmadd(vqk, u[c], acc_o[c]);
            if (w == VW)
                vf_store(out + j0 + c * VW, o);
            else
                vf_store_n(out + j0 + c * VW, o, w);
        }
    }
    for (int64_t i = 0; i < K; i++) {
        const int64_t row = i * V + j0;
        const vf va = vf_set1(t->a[i]), vk = vf_set1(t->ks[i]);
        if (full) {
#pragma GCC unroll 4
            for (int c = 0; c < COLS; c++) {
                const vf s = state_load(from, row + c * VW, VW, half);
                state_store(to, row + c * VW, vf_fmadd(vk, u[c], vf_mul(va, s)), VW, half);
            }
        } else {
            for (int c = 0; c < nv; c++) {
                const int64_t w = c == nv - 1 ? w_last : VW;
                const vf s = state_load(from, row + c * VW, w, half);
                state_store(to, row + c * VW, vf_fmadd(vk, u[c], vf_mul(va, s)), w, half);
            }
        }
    }
}

#if LS_HAVE_BF16_PAIR
/* column_block on a full block of bf16 state with its columns in even/odd order
 * (vf_load_bf16_pair, AVX-512 and AVX2): vectors 2q and 2q + 1 hold the even and odd columns
 * of the block's q-th 2 VW. Per 2 VW state elements the two passes widen with 2 + 2
 * operations and round with one store, where column_block takes 4 + 4 (a zero extension and
 * a shift a vector) and packs and stores twice. Each column's arithmetic is column_block's,
 * in the same order: the bits are the same. */
static inline __attribute__((always_inline)) void
column_block_bf16_pairs(int64_t K, int64_t V, const uint16_t *from, uint16_t *to, int64_t j0,
                        const token_terms *t, const float *v, float *out)
{
    vf acc_p[COLS], acc_o[COLS], u[COLS], s[COLS];
    for (int c = 0; c < COLS; c++) acc_p[c] = acc_o[c] = vf_zero();
    for (int64_t i = 0; i < K; i++) {
        const uint16_t *row = from + i * V + j0;
        const vf vak = vf_set1(t->ak[i]), vaq = vf_set1(t->aq[i]);
        vf_load_bf16_pair(row, &s[0], &s[1]);
        vf_load_bf16_pair(row + 2 * VW, &s[2], &s[3]);
#pragma GCC unroll 4
        for (int c = 0; c < COLS; c++) {
            acc_p[c] = vf_fmadd(vak, s[c], acc_p[c]);
            acc_o[c] = vf_fmadd(vaq, s[c], acc_o[c]);
        }
    }
    const vf vb = vf_set1(t->beta), vqk = vf_set1(t->qk);
#pragma GCC unroll 2
    for (int c = 0; c < COLS; c += 2) {
        vf vin[2], o[2];
        vf_load_pair(v + j0 + c * VW, &vin[0], &vin[1]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            u[c + h] = t->delta ? vf_mul(vb, vf_sub(vin[h], acc_p[c + h])) : vin[h];
            o[h] = vf_fmadd(vqk, u[c + h], acc_o[c + h]);
        }
        if (out) vf_store_pair(out + j0 + c * VW, o[0], o[1]);
    }
    for (int64_t i = 0; i < K; i++) {
        const int64_t row = i * V + j0;
        const vf va = vf_set1(t->a[i]), vk = vf_set1(t->ks[i]);
        vf_load_bf16_pair(from + row, &s[0], &s[1]);
        vf_load_bf16_pair(from + row + 2 * VW, &s[2], &s[3]);
#pragma GCC unroll 4
        for (int c = 0; c < COLS; c++) s[c] = vf_fmadd(vk, u[c], vf_mul(va, s[c]));
        KDA_STORE_BF16_PAIR(to + row, s[0], s[1]);
        KDA_STORE_BF16_PAIR(to + row + 2 * VW, s[2], s[3]);
    }
}
#endif

/* Columns [j0, j1) of one token's step, in blocks of COLS vectors. */
static inline __attribute__((always_inline)) void
token_columns(int64_t K, int64_t V, const void *from, void *to, bool half, int64_t j0, int64_t j1,
              const token_terms *t, const float *v, float *out)
{
    const int64_t block = COLS * VW;
    for (int64_t jb = j0; jb < j1; jb += block) {
        const int64_t w = j1 - jb < block ? j1 - jb : block;
#if LS_HAVE_BF16_PAIR
        if (half && w == block) {
            column_block_bf16_pairs(K, V, from, to, jb, t, v, out);
            continue;
        }
#endif
        if (w == block) {
            column_block(K, V, from, to, half, jb, COLS, VW, t, v, out);
        } else {
            const int nv = (int)((w + VW - 1) / VW);
            column_block(K, V, from, to, half, jb, nv, w - (int64_t)(nv - 1) * VW, t, v, out);
        }
    }
}

/* One token's factors in scratch [6K]: qs, ks, g, the decays a = e^g, a*ks and a*qs; and
 * beta and qs . ks. */
static inline void token_factors(const kda_plan *pl, int64_t tok, int64_t hv, float *scratch,
                                 float *beta, float *qk)
{
    const int64_t K = pl->p->K;
    float *qs = scratch, *ks = qs + K, *g = ks + K, *a = g + K, *ak = a + K, *aq = ak + K;
    kda_load_token_v(pl, tok, hv, qs, ks, beta, g);
    kda_row_decays(pl, g, a);
    kda_vmul(K, a, ks, ak);
    kda_vmul(K, a, qs, aq);
    *qk = ls_vdot(K, qs, ks);
}

static inline token_terms token_terms_of(const kda_plan *pl, int64_t tok, int64_t hv,
                                         float *scratch)
{
    const int64_t K = pl->p->K;
    token_terms t = {.ks = scratch + K, .a = scratch + 3 * K, .delta = pl->delta};
    t.ak = t.a + K;
    t.aq = t.ak + K;
    token_factors(pl, tok, hv, scratch, &t.beta, &t.qk);
    return t;
}

/* One decode token (request tok) on a [K,V]-first state from `from` to `to`, float32 or
 * bf16 (kda_decode_rows_item). */
static inline __attribute__((always_inline)) void decode_rows_token(const kda_plan *pl, int64_t tok,
                                                                    int64_t hv, const void *from,
                                                                    void *to, bool half, float *o,
                                                                    float *scratch)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, at = (tok * pl->HV + hv) * V;
    float *v_row = scratch + 6 * K, *o_row = v_row + V;
    const token_terms t = token_terms_of(pl, tok, hv, scratch);
    const float *v = kda_token_span(pl, p->v, at, V, v_row);
    float *out = pl->bf16 ? o_row : o + at;
    if (half)
        token_columns(K, V, from, to, true, 0, V, &t, v, out);
    else
        token_columns(K, V, from, to, false, 0, V, &t, v, out);
    if (pl->bf16) kda_token_store_bf16(o, at, V, o_row);
}

#endif
