/* Small dense products for the chunked kernels (see matmul.h). */
#include "core/matmul.h"

#include <string.h>

void ls_gemm_nn(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (!accumulate) memset(c, 0, (size_t)N * sizeof *c);
        const float *a = A + i * lda;
        for (int64_t p = 0; p < Kd; p++) {
            const float ap = a[p];
            const float *b = B + p * ldb;
            for (int64_t j = 0; j < N; j++) c[j] += ap * b[j];
        }
    }
}

void ls_gemm_tn(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    /* Row i of C stays in L1 while the Kd rows of B stream past it. */
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (!accumulate) memset(c, 0, (size_t)N * sizeof *c);
        for (int64_t p = 0; p < Kd; p++) {
            const float ap = A[p * lda + i];
            const float *b = B + p * ldb;
            for (int64_t j = 0; j < N; j++) c[j] += ap * b[j];
        }
    }
}

void ls_gemm_nt(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            const float d = ls_dot(Kd, A + i * lda, B + j * ldb);
            C[i * ldc + j] = accumulate ? C[i * ldc + j] + d : d;
        }
}

float ls_dot(int64_t n, const float *x, const float *y)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[i + l] * y[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i] * y[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
