/* Internal: the small dense products of the chunked kernels (row-major float32, explicit
 * leading dimensions). Readable loops ordered so the compiler vectorises the innermost one;
 * the CPU-speed work replaces their bodies, not their contracts. */
#ifndef LS_CORE_MATMUL_H
#define LS_CORE_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

/* C[M,N] = (accumulate ? C : 0) + A[M,Kd] B[Kd,N] */
void ls_gemm_nn(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* C[M,N] = (accumulate ? C : 0) + A[Kd,M]^T B[Kd,N] */
void ls_gemm_tn(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* C[M,N] = (accumulate ? C : 0) + A[M,Kd] B[N,Kd]^T, each entry one ls_dot. */
void ls_gemm_nt(int64_t M, int64_t N, int64_t Kd, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* x[0..n) . y[0..n), summed in eight interleaved partial sums (fixed order). */
float ls_dot(int64_t n, const float *x, const float *y);

#endif
