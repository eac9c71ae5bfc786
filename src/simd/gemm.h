/* Internal: register-blocked small matrix products for the *_simd.c kernels (include after
 * vec.h). The chunked kernels multiply 16..128-row blocks by K x V states; these routines keep
 * an MR x (NV * VW) tile of C in registers across the whole inner dimension, stream one row
 * of B (NV vectors) and broadcast MR elements of A per step: FMA-bound when MR * NV FMAs cover
 * the NV + MR loads (8 x 2 zmm on AVX-512, 4 x 2 ymm on AVX2).
 *
 * Each element of C is accumulated over p in increasing order by one FMA chain, whatever
 * the tiling or the tail handling, so results do not depend on how a caller splits columns. */
#ifndef LS_SIMD_GEMM_H
#define LS_SIMD_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "simd/vec.h"

#if LS_ISA == 2
#define GEMM_MR 8
#define GEMM_NV 2
#elif LS_ISA == 1
#define GEMM_MR 4
#define GEMM_NV 2
#else
#define GEMM_MR 4
#define GEMM_NV 4
#endif

/* A full MR x (NV*VW) tile's accumulators as a product starts: C's (each row i scaled by
 * c_scale[i] when given) or zeros. Every tile kernel of a full tile, whatever its operands,
 * starts and ends through these two. */
static inline void gemm_tile_load(vf acc[GEMM_MR][GEMM_NV], const float *C, int64_t ldc,
                                  bool accumulate, const float *c_scale)
{
#pragma GCC unroll 8
    for (int i = 0; i < GEMM_MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < GEMM_NV; v++) {
            acc[i][v] = accumulate ? vf_load(C + i * ldc + v * VW) : vf_zero();
            if (c_scale) acc[i][v] = vf_mul(vf_set1(c_scale[i]), acc[i][v]);
        }
}

static inline void gemm_tile_store(vf acc[GEMM_MR][GEMM_NV], float *C, int64_t ldc)
{
#pragma GCC unroll 8
    for (int i = 0; i < GEMM_MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < GEMM_NV; v++) vf_store(C + i * ldc + v * VW, acc[i][v]);
}

/* A full MR x (NV*VW) tile: C(i, j0 + ...) for rows i0 .. i0+MR. */
static inline void gemm_tile_full(int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                                  const float *B, int64_t ldb, float *C, int64_t ldc,
                                  bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR][GEMM_NV];
    gemm_tile_load(acc, C, ldc, accumulate, c_scale);
    for (int64_t p = 0; p < K; p++) {
        vf b[GEMM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < GEMM_NV; v++) b[v] = vf_load(B + p * ldb + v * VW);
#pragma GCC unroll 8
        for (int i = 0; i < GEMM_MR; i++) {
            const vf a = vf_set1(A[i * a_rs + p * a_cs]);
#pragma GCC unroll 4
            for (int v = 0; v < GEMM_NV; v++) acc[i][v] = vf_fmadd(a, b[v], acc[i][v]);
        }
    }
    gemm_tile_store(acc, C, ldc);
}

/* MR full rows by one vector column of width w <= VW (masked when w < VW): the column tail
 * of a product, with its accumulators still in registers. */
static inline void gemm_tile_col(int64_t w, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                                 const float *B, int64_t ldb, float *C, int64_t ldc,
                                 bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR];
    const bool full = w == VW;
#pragma GCC unroll 8
    for (int i = 0; i < GEMM_MR; i++) {
        acc[i] = accumulate ? (full ? vf_load(C + i * ldc) : vf_load_n(C + i * ldc, w)) : vf_zero();
        if (c_scale) acc[i] = vf_mul(vf_set1(c_scale[i]), acc[i]);
    }
    for (int64_t p = 0; p < K; p++) {
        const vf b = full ? vf_load(B + p * ldb) : vf_load_n(B + p * ldb, w);
#pragma GCC unroll 8
        for (int i = 0; i < GEMM_MR; i++)
            acc[i] = vf_fmadd(vf_set1(A[i * a_rs + p * a_cs]), b, acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < GEMM_MR; i++) {
        if (full)
            vf_store(C + i * ldc, acc[i]);
        else
            vf_store_n(C + i * ldc, acc[i], w);
    }
}

/* An edge tile: mr <= MR rows, one vector column of width w <= VW (masked when w < VW). */
static inline void gemm_tile_edge(int64_t mr, int64_t w, int64_t K, const float *A, int64_t a_rs,
                                  int64_t a_cs, const float *B, int64_t ldb, float *C, int64_t ldc,
                                  bool accumulate, const float *c_scale)
{
    vf acc[GEMM_MR];
    for (int64_t i = 0; i < mr; i++) {
        acc[i] =
            accumulate ? (w == VW ? vf_load(C + i * ldc) : vf_load_n(C + i * ldc, w)) : vf_zero();
        if (c_scale) acc[i] = vf_mul(vf_set1(c_scale[i]), acc[i]);
    }
    for (int64_t p = 0; p < K; p++) {
        const vf b = w == VW ? vf_load(B + p * ldb) : vf_load_n(B + p * ldb, w);
        for (int64_t i = 0; i < mr; i++)
            acc[i] = vf_fmadd(vf_set1(A[i * a_rs + p * a_cs]), b, acc[i]);
    }
    for (int64_t i = 0; i < mr; i++) {
        if (w == VW)
            vf_store(C + i * ldc, acc[i]);
        else
            vf_store_n(C + i * ldc, acc[i], w);
    }
}

/* C[M,N] = (accumulate ? C : 0) + A B, or with c_scale (accumulate implied)
 * C = diag(c_scale) C + A B, the scaling applied where the tile is loaded so that C makes
 * one trip through the registers. A(i,p) = A[i*a_rs + p*a_cs] (a_rs = lda, a_cs = 1 for
 * row-major A; a_rs = 1, a_cs = lda for A stored transposed), B row-major. */
static inline void ls_gemm_scaled(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                                  int64_t a_cs, const float *B, int64_t ldb, float *C, int64_t ldc,
                                  bool accumulate, const float *c_scale)
{
    if (M <= 0 || N <= 0) return;
    if (c_scale) accumulate = true;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = !accumulate ? 0.0f
                                 : c_scale   ? c_scale[i] * C[i * ldc + j]
                                             : C[i * ldc + j];
        return;
    }
    const int64_t panel = GEMM_NV * VW;
    const int64_t m_full = M - M % GEMM_MR, n_full = N - N % panel;
    const float *s_edge = c_scale ? c_scale + m_full : NULL;
    /* Column panels outermost: a panel of B (K x NV*VW) stays in L1 across the row tiles. */
    for (int64_t j = 0; j < n_full; j += panel) {
        for (int64_t i = 0; i < m_full; i += GEMM_MR)
            gemm_tile_full(K, A + i * a_rs, a_rs, a_cs, B + j, ldb, C + i * ldc + j, ldc,
                           accumulate, c_scale ? c_scale + i : NULL);
        if (m_full < M)
            for (int64_t v = 0; v < GEMM_NV; v++)
                gemm_tile_edge(M - m_full, VW, K, A + m_full * a_rs, a_rs, a_cs, B + j + v * VW,
                               ldb, C + m_full * ldc + j + v * VW, ldc, accumulate, s_edge);
    }
    for (int64_t j = n_full; j < N; j += VW) {
        const int64_t w = N - j < VW ? N - j : VW;
        for (int64_t i = 0; i < m_full; i += GEMM_MR)
            gemm_tile_col(w, K, A + i * a_rs, a_rs, a_cs, B + j, ldb, C + i * ldc + j, ldc,
                          accumulate, c_scale ? c_scale + i : NULL);
        if (m_full < M)
            gemm_tile_edge(M - m_full, w, K, A + m_full * a_rs, a_rs, a_cs, B + j, ldb,
                           C + m_full * ldc + j, ldc, accumulate, s_edge);
    }
}

static inline void ls_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                           int64_t a_cs, const float *B, int64_t ldb, float *C, int64_t ldc,
                           bool accumulate)
{
    ls_gemm_scaled(M, N, K, A, a_rs, a_cs, B, ldb, C, ldc, accumulate, NULL);
}

/* dst[j][i] = src[i][j] for a rows x cols block: VW x VW register transposes, scalar edges. */
static inline void ls_transpose(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                float *dst, int64_t ldd)
{
    const int64_t rf = rows - rows % VW, cf = cols - cols % VW;
    for (int64_t i = 0; i < rf; i += VW)
        for (int64_t j = 0; j < cf; j += VW)
            vf_transpose_block(src + i * lds + j, lds, dst + j * ldd + i, ldd);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = i < rf ? cf : 0; j < cols; j++) dst[j * ldd + i] = src[i * lds + j];
}

/* x[0..n) . y[0..n): VW lanes of partial sums, then a fixed horizontal order. */
static inline float ls_vdot(int64_t n, const float *x, const float *y)
{
    vf acc0 = vf_zero(), acc1 = vf_zero();
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        acc0 = vf_fmadd(vf_load(x + i), vf_load(y + i), acc0);
        acc1 = vf_fmadd(vf_load(x + i + VW), vf_load(y + i + VW), acc1);
    }
    for (; i + VW <= n; i += VW) acc0 = vf_fmadd(vf_load(x + i), vf_load(y + i), acc0);
    if (i < n) acc1 = vf_fmadd(vf_load_n(x + i, n - i), vf_load_n(y + i, n - i), acc1);
    return vf_hsum(vf_add(acc0, acc1));
}

/* y[0..n) += a x[0..n) */
static inline void ls_vaxpy(int64_t n, float a, const float *x, float *y)
{
    const vf av = vf_set1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_fmadd(av, vf_load(x + i), vf_load(y + i)));
    if (i < n)
        vf_store_n(y + i, vf_fmadd(av, vf_load_n(x + i, n - i), vf_load_n(y + i, n - i)), n - i);
}

/* y[0..n) *= a */
static inline void ls_vscale(int64_t n, float a, float *y)
{
    const vf av = vf_set1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vf_store(y + i, vf_mul(av, vf_load(y + i)));
    if (i < n) vf_store_n(y + i, vf_mul(av, vf_load_n(y + i, n - i)), n - i);
}

#endif
