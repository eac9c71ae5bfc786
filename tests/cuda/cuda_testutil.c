#include "cuda_testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define CT_TRY(expr)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                   \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

void ct_require_device(const char *suite)
{
    if (linseq_cuda_device_count() >= 1) return;
    const char *require = getenv("LINSEQ_REQUIRE_CUDA");
    if (require && strcmp(require, "1") == 0) {
        fprintf(stderr, "FAIL %s: no CUDA device, and LINSEQ_REQUIRE_CUDA=1 requires one\n", suite);
        exit(1);
    }
    printf("%s: skipped (no CUDA device)\n", suite);
    exit(0);
}

void ct_case(const char *op, const char *label)
{
    printf("case: %s %s\n", op, label);
    fflush(stdout);
}

static uint16_t to_bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

static float from_bf16_bits(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float ct_round_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }

void ct_round_bf16_array(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = ct_round_bf16(x[i]);
}

void *ct_upload(const float *host, size_t n, int bf16)
{
    void *dev = NULL;
    size_t bytes = n * (bf16 ? 2 : 4);
    CT_TRY(cudaMalloc(&dev, bytes ? bytes : 1));
    if (!n) return dev;
    if (bf16) {
        uint16_t *tmp = malloc(n * 2);
        if (!tmp) abort();
        for (size_t i = 0; i < n; i++) tmp[i] = to_bf16_bits(host[i]);
        CT_TRY(cudaMemcpy(dev, tmp, bytes, cudaMemcpyHostToDevice));
        free(tmp);
    } else {
        CT_TRY(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    }
    return dev;
}

void *ct_upload_i64(const int64_t *host, size_t n)
{
    void *dev = NULL;
    CT_TRY(cudaMalloc(&dev, n ? n * 8 : 1));
    if (n) CT_TRY(cudaMemcpy(dev, host, n * 8, cudaMemcpyHostToDevice));
    return dev;
}

void *ct_alloc_poisoned(size_t n, int bf16)
{
    void *dev = NULL;
    size_t bytes = n * (bf16 ? 2 : 4);
    CT_TRY(cudaMalloc(&dev, bytes ? bytes : 1));
    CT_TRY(cudaMemset(dev, 0xff, bytes)); /* all-ones: NaN in float32 and in bf16 */
    return dev;
}

void ct_download(float *host, const void *dev, size_t n, int bf16)
{
    if (!n) return;
    CT_TRY(cudaDeviceSynchronize());
    if (bf16) {
        uint16_t *tmp = malloc(n * 2);
        if (!tmp) abort();
        CT_TRY(cudaMemcpy(tmp, dev, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) host[i] = from_bf16_bits(tmp[i]);
        free(tmp);
    } else {
        CT_TRY(cudaMemcpy(host, dev, n * 4, cudaMemcpyDeviceToHost));
    }
}

void ct_free(void *dev)
{
    if (dev) CT_TRY(cudaFree(dev));
}

void ct_sync(void) { CT_TRY(cudaDeviceSynchronize()); }

linseq_exec ct_exec(linseq_mode mode, int chunk_size, int bf16)
{
    linseq_exec e = {0};
    e.mode = mode;
    e.chunk_size = chunk_size;
    e.device = LINSEQ_DEVICE_CUDA;
    e.device_index = 0;
    e.stream = NULL;
    e.dtype = bf16 ? LINSEQ_DTYPE_BF16 : LINSEQ_DTYPE_F32;
    return e;
}
