/* linseq_op_decode_pool, the state pools of serving engines, for every op with a decode step
 * (the op_jobs catalog): int32 indices, strided rows, destination rows apart from the source
 * rows, a pad value, bfloat16 and half pools; each against the plain in-place decode of the
 * same requests (bitwise: the pool layer moves and rounds states, it computes nothing), and
 * every refusal leaves every byte of the pool as it was. Also the half-float conversions
 * themselves: exact widening, and narrowing to nearest even at every midpoint. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "op_jobs.h"
#include "optable/state_pool.h"
#include "testutil.h"

/* One decode job's reference: the in-place step on its contiguous float32 pool. */
typedef struct {
    const job *j;
    int64_t B, n_rows, row;
    const int64_t *rows;
    float *out[JOB_MAX_OUT]; /* job_run's: out[0] the pool after */
    int n_out;
} reference;

static void reference_make(reference *r, const job *j)
{
    memset(r, 0, sizeof *r);
    r->j = j;
    r->B = job_requests(j);
    r->n_rows = job_pool_rows(j);
    r->rows = job_rows(j);
    r->n_out = job_outputs(j);
    r->row = (int64_t)job_output_len(j, 0) / r->n_rows;
    for (int k = 0; k < r->n_out; k++) r->out[k] = tu_alloc(job_output_len(j, k));
    CHECK_OK(job_run(j, 2, r->out));
}

static void reference_free(reference *r)
{
    for (int k = 0; k < r->n_out; k++) free(r->out[k]);
}

static float **outputs_alloc(const reference *r)
{
    float **o = calloc(JOB_MAX_OUT, sizeof *o);
    for (int k = 1; k < r->n_out; k++) o[k - 1] = tu_alloc_poisoned(job_output_len(r->j, k));
    return o;
}

static bool outputs_equal(const reference *r, float **o)
{
    bool same = true;
    for (int k = 1; k < r->n_out; k++)
        same &= tu_same_bits(o[k - 1], r->out[k], job_output_len(r->j, k));
    for (int k = 1; k < r->n_out; k++) free(o[k - 1]);
    free(o);
    return same;
}

static int32_t *rows32(const reference *r)
{
    int32_t *x = malloc((size_t)r->B * sizeof *x);
    for (int64_t b = 0; b < r->B; b++) x[b] = (int32_t)(r->rows ? r->rows[b] : b);
    return x;
}

/* int32 indices over rows `stride` floats apart, every gap holding a sentinel: the rows
 * come out as the reference's, the gaps untouched. */
static void check_strided(const reference *r, int64_t stride, const char *what)
{
    const int64_t n = r->n_rows * stride;
    float *data = tu_alloc((size_t)n);
    for (int64_t i = 0; i < n; i++) data[i] = -777.0f;
    for (int64_t q = 0; q < r->n_rows; q++)
        memcpy(data + q * stride, job_pool0(r->j) + q * r->row, (size_t)r->row * sizeof(float));
    int32_t *idx = rows32(r);
    linseq_state_pool pool = {
        .data = data, .n_rows = r->n_rows, .row_stride = stride, .src_rows = idx, .index_bits = 32};
    float **o = outputs_alloc(r);
    CHECK_OK(job_run_decode_pool(r->j, 3, &pool, o));
    bool rows_ok = true, gaps_ok = true;
    for (int64_t q = 0; q < r->n_rows; q++) {
        rows_ok &= tu_same_bits(data + q * stride, r->out[0] + q * r->row, (size_t)r->row);
        for (int64_t i = r->row; i < stride; i++) gaps_ok &= data[q * stride + i] == -777.0f;
    }
    CHECK(outputs_equal(r, o) && rows_ok && gaps_ok, "%s %s: outputs %s, rows %s, gaps %s",
          job_name(r->j), what, "compared", rows_ok ? "equal" : "DIFFER",
          gaps_ok ? "untouched" : "WRITTEN");
    free(idx);
    free(data);
}

/* Each live request writes row src + n_rows of a pool twice as tall: the lower half stays
 * as it was, the upper half receives the reference's new states. */
static void check_destinations(const reference *r)
{
    const int64_t n_rows = 2 * r->n_rows, half = r->n_rows * r->row;
    float *data = tu_alloc((size_t)(2 * half));
    memcpy(data, job_pool0(r->j), (size_t)half * sizeof(float));
    memcpy(data + half, job_pool0(r->j), (size_t)half * sizeof(float));
    int64_t *src = malloc((size_t)r->B * sizeof *src), *dst = malloc((size_t)r->B * sizeof *dst);
    for (int64_t b = 0; b < r->B; b++) {
        src[b] = r->rows ? r->rows[b] : b;
        dst[b] = src[b] < 0 ? -5 : src[b] + r->n_rows; /* a padding request's dst is not read */
    }
    linseq_state_pool pool = {.data = data, .n_rows = n_rows, .src_rows = src, .dst_rows = dst};
    float **o = outputs_alloc(r);
    CHECK_OK(job_run_decode_pool(r->j, 2, &pool, o));
    const bool same_out = outputs_equal(r, o);
    bool ok = tu_same_bits(data, job_pool0(r->j), (size_t)half);
    for (int64_t b = 0; b < r->B; b++)
        if (src[b] >= 0)
            ok &= tu_same_bits(data + dst[b] * r->row, r->out[0] + src[b] * r->row, (size_t)r->row);
    CHECK(same_out && ok, "%s: separate destination rows: outputs %s, pool %s", job_name(r->j),
          same_out ? "equal" : "DIFFER", ok ? "as expected" : "WRONG");
    free(src);
    free(dst);
    free(data);
}

/* pad_value marks request 0 as padding: as if its row were negative. */
static void check_pad_value(const reference *r)
{
    const int64_t n = r->n_rows * r->row;
    float *a = tu_alloc((size_t)n), *b = tu_alloc((size_t)n);
    memcpy(a, job_pool0(r->j), (size_t)n * sizeof(float));
    memcpy(b, a, (size_t)n * sizeof(float));
    int64_t *by_value = malloc((size_t)r->B * sizeof *by_value);
    int64_t *negative = malloc((size_t)r->B * sizeof *negative);
    for (int64_t q = 0; q < r->B; q++) by_value[q] = negative[q] = r->rows ? r->rows[q] : q;
    negative[0] = -1;
    linseq_state_pool pa = {.data = a,
                            .n_rows = r->n_rows,
                            .src_rows = by_value,
                            .has_pad_value = true,
                            .pad_value = by_value[0]};
    linseq_state_pool pb = {.data = b, .n_rows = r->n_rows, .src_rows = negative};
    float **oa = outputs_alloc(r), **ob = outputs_alloc(r);
    CHECK_OK(job_run_decode_pool(r->j, 2, &pa, oa));
    CHECK_OK(job_run_decode_pool(r->j, 2, &pb, ob));
    bool same = tu_same_bits(a, b, (size_t)n);
    for (int k = 1; k < r->n_out; k++) {
        same &= tu_same_bits(oa[k - 1], ob[k - 1], job_output_len(r->j, k));
        free(oa[k - 1]);
        free(ob[k - 1]);
    }
    free(oa);
    free(ob);
    CHECK(same, "%s: pad_value differs from a negative row", job_name(r->j));
    free(by_value);
    free(negative);
    free(a);
    free(b);
}

/* A half-precision pool is the float32 step on its widened values, rounded once on write. */
static void check_half_pool(const reference *r, linseq_pool_dtype dtype)
{
    const int64_t n = r->n_rows * r->row;
    uint16_t *h = malloc((size_t)n * sizeof *h);
    float *wide = tu_alloc((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const float x = job_pool0(r->j)[i];
        h[i] = dtype == LINSEQ_POOL_BF16 ? ls_f32_to_bf16(x) : ls_f32_to_f16(x);
        wide[i] = dtype == LINSEQ_POOL_BF16 ? ls_bf16_to_f32(h[i]) : ls_f16_to_f32(h[i]);
    }
    linseq_state_pool pw = {.data = wide, .n_rows = r->n_rows, .src_rows = r->rows};
    linseq_state_pool ph = {.data = h, .n_rows = r->n_rows, .src_rows = r->rows, .dtype = dtype};
    float **ow = outputs_alloc(r), **oh = outputs_alloc(r);
    CHECK_OK(job_run_decode_pool(r->j, 2, &pw, ow));
    CHECK_OK(job_run_decode_pool(r->j, 1, &ph, oh));
    bool same = true;
    for (int k = 1; k < r->n_out; k++) {
        same &= tu_same_bits(ow[k - 1], oh[k - 1], job_output_len(r->j, k));
        free(ow[k - 1]);
        free(oh[k - 1]);
    }
    free(ow);
    free(oh);
    for (int64_t i = 0; i < n; i++)
        same &=
            h[i] == (dtype == LINSEQ_POOL_BF16 ? ls_f32_to_bf16(wide[i]) : ls_f32_to_f16(wide[i]));
    CHECK(same, "%s: %s pool differs from the float32 step rounded once", job_name(r->j),
          dtype == LINSEQ_POOL_BF16 ? "bf16" : "f16");
    free(h);
    free(wide);
}

/* A refused call names what it refuses and leaves the pool's bytes as they were. */
static void expect_refusal(const reference *r, linseq_state_pool pool, size_t bytes,
                           const char *needle, const char *what)
{
    unsigned char *before = malloc(bytes);
    memcpy(before, pool.data, bytes);
    float **o = outputs_alloc(r);
    const linseq_status st = job_run_decode_pool(r->j, 2, &pool, o);
    for (int k = 1; k < r->n_out; k++) free(o[k - 1]);
    free(o);
    CHECK(st != LINSEQ_OK && strstr(linseq_last_error(), needle),
          "%s %s: status %d, message '%s' (expected to name '%s')", job_name(r->j), what, (int)st,
          linseq_last_error(), needle);
    CHECK(memcmp(before, pool.data, bytes) == 0, "%s %s: the pool was written", job_name(r->j),
          what);
    free(before);
}

static void check_refusals(const reference *r)
{
    const int64_t n = 2 * r->n_rows * r->row;
    float *data = tu_alloc((size_t)n);
    memcpy(data, job_pool0(r->j), (size_t)(n / 2) * sizeof(float));
    memcpy(data + n / 2, job_pool0(r->j), (size_t)(n / 2) * sizeof(float));
    int64_t *src = malloc((size_t)r->B * sizeof *src), *dst = malloc((size_t)r->B * sizeof *dst);
    int64_t live = 0, first = -1, second = -1;
    for (int64_t b = 0; b < r->B; b++) {
        src[b] = dst[b] = r->rows ? r->rows[b] : b;
        if (src[b] < 0) continue;
        live++;
        if (first < 0)
            first = b;
        else if (second < 0)
            second = b;
    }
    const size_t bytes = (size_t)n * sizeof(float);
    const linseq_state_pool ok = {.data = data,
                                  .n_rows = 2 * r->n_rows,
                                  .src_rows = src,
                                  .dst_rows = dst,
                                  .dtype = LINSEQ_POOL_F32};
    linseq_state_pool p = ok;
    if (live >= 2) {
        dst[second] = dst[first] + r->n_rows; /* gathered form: a real destination */
        dst[first] = dst[second];
        expect_refusal(r, p, bytes, "both write pool row", "two requests, one row");
        dst[first] = src[first];
        dst[second] = src[second];
    }
    src[first] = 2 * r->n_rows;
    expect_refusal(r, p, bytes, "pool->src_rows", "a row past the pool");
    src[first] = dst[first];
    dst[first] = -3;
    expect_refusal(r, p, bytes, "pool->dst_rows", "a padding destination for a live request");
    dst[first] = src[first];
    p.row_stride = r->row - 1;
    expect_refusal(r, p, bytes, "pool->row_stride", "rows overlapping each other");
    p = ok;
    p.index_bits = 16;
    expect_refusal(r, p, bytes, "pool->index_bits", "16-bit indices");
    p = ok;
    p.dtype = (linseq_pool_dtype)9;
    expect_refusal(r, p, bytes, "pool->dtype", "an unknown element type");
    free(src);
    free(dst);
    free(data);
}

static void test_every_decode_op(void)
{
    job *list;
    const int n = jobs_make(&list);
    int covered = 0;
    for (int i = 0; i < n; i++) {
        const job *j = job_at(list, i);
        if (!job_is_decode(j)) continue;
        reference r;
        reference_make(&r, j);
        check_strided(&r, r.row, "int32, contiguous (in place)");
        check_strided(&r, r.row + 5, "int32, rows 5 floats apart");
        check_destinations(&r);
        check_pad_value(&r);
        check_half_pool(&r, LINSEQ_POOL_BF16);
        check_half_pool(&r, LINSEQ_POOL_F16);
        check_refusals(&r);
        reference_free(&r);
        covered++;
    }
    CHECK(covered >= 4, "only %d decode jobs in the catalog", covered);
    jobs_free(list, n);
}

/* Widening is exact and narrowing rounds to nearest even: every half (and bfloat16 with the
 * same exponent bits) survives the round trip, and the float32 midpoint between two
 * neighbours goes to the one whose last bit is 0. */
static void test_half_conversions(void)
{
    int bad_trip = 0, bad_mid = 0;
    for (uint32_t h = 0; h < 0x7c00u; h++) { /* every finite non-negative half */
        for (int neg = 0; neg < 2; neg++) {
            const uint16_t x = (uint16_t)(h | (neg ? 0x8000u : 0));
            bad_trip += ls_f32_to_f16(ls_f16_to_f32(x)) != x;
            bad_trip += ls_f32_to_bf16(ls_bf16_to_f32(x)) != x;
        }
        if (h + 1 < 0x7c00u) {
            const double lo = ls_f16_to_f32((uint16_t)h), hi = ls_f16_to_f32((uint16_t)(h + 1));
            const uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
            bad_mid += ls_f32_to_f16((float)((lo + hi) / 2)) != even;
        }
    }
    CHECK(bad_trip == 0 && bad_mid == 0, "half conversions: %d round trips, %d midpoints wrong",
          bad_trip, bad_mid);
    CHECK(ls_f32_to_f16(65519.0f) == 0x7bffu && ls_f32_to_f16(65520.0f) == 0x7c00u &&
              ls_f32_to_f16(-INFINITY) == 0xfc00u && isnan(ls_f16_to_f32(ls_f32_to_f16(NAN))),
          "half conversions: overflow to infinity at 65520, NaN kept");
    CHECK(ls_f16_to_f32(0x0001u) == 0x1p-24f && ls_f32_to_f16(0x1p-25f) == 0 &&
              ls_f32_to_f16(0x1.8p-25f) == 1,
          "half conversions: the smallest subnormal and its rounding");
}

/* The prefill over a pool (EMA: a state of D floats per sequence): rows 3 floats apart in a
 * half-precision pool, int32 indices, a sequence without an initial state, another that is
 * padding, destinations apart from the sources; against linseq_ema_forward from the gathered
 * states. Then a refusal that leaves every byte. */
static void test_prefill_pool(void)
{
    enum { B = 3, T = 9, D = 5, ROWS = 6, STRIDE = D + 3 };
    tu_rng rng = {77};
    float x[B * T * D], a[D], h0[B * D] = {0}, y_want[B * T * D], h_want[B * D];
    float y[B * T * D];
    tu_fill_normal(&rng, x, B * T * D, 1.0);
    tu_fill_uniform(&rng, a, D, 0.5, 0.95);
    uint16_t data[ROWS * STRIDE], before[ROWS * STRIDE];
    for (int i = 0; i < ROWS * STRIDE; i++) data[i] = ls_f32_to_f16((float)tu_normal(&rng));
    memcpy(before, data, sizeof data);
    const int32_t src[B] = {4, 1, -1}, dst[B] = {2, 5, 0};
    const bool has[B] = {true, false, true};
    for (int d = 0; d < D; d++) h0[d] = ls_f16_to_f32(data[4 * STRIDE + d]);
    linseq_ema_problem p = {.B = B, .T = T, .D = D, .x = x, .a = a, .h0 = h0};
    CHECK_OK(linseq_ema_forward(&p, NULL, y_want, h_want));
    p.h0 = NULL;
    linseq_state_pool pool = {.data = data,
                              .n_rows = ROWS,
                              .row_stride = STRIDE,
                              .dtype = LINSEQ_POOL_F16,
                              .src_rows = src,
                              .dst_rows = dst,
                              .index_bits = 32};
    float *out[2] = {y, NULL};
    CHECK_OK(linseq_op_forward_pool("ema", &p, NULL, &pool, has, out));
    bool ok = tu_same_bits(y, y_want, B * T * D);
    for (int d = 0; d < D; d++) {
        ok &= data[2 * STRIDE + d] == ls_f32_to_f16(h_want[d]);
        ok &= data[5 * STRIDE + d] == ls_f32_to_f16(h_want[D + d]);
    }
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < STRIDE; i++)
            if (r != 2 && r != 5) ok &= data[r * STRIDE + i] == before[r * STRIDE + i];
    CHECK(ok, "prefill over a half pool: outputs or rows differ from the gathered forward");
    memcpy(before, data, sizeof data);
    const int32_t clash[B] = {2, 2, 0};
    pool.dst_rows = clash;
    CHECK_FAILS(linseq_op_forward_pool("ema", &p, NULL, &pool, has, out), LINSEQ_ERR_INVALID_VALUE,
                "both write pool row");
    CHECK(memcmp(before, data, sizeof data) == 0, "a refused prefill wrote the pool");
    p.h0 = h0;
    pool.dst_rows = dst;
    CHECK_FAILS(linseq_op_forward_pool("ema", &p, NULL, &pool, has, out), LINSEQ_ERR_INVALID_VALUE,
                "problem->h0 must be NULL");
}

/* Several tokens per request (EMA, T = 3): each token's state in its own row of a bf16
 * pool, equal to the forward over that prefix rounded once; padding touches nothing. */
static void test_several_tokens(void)
{
    enum { B = 2, T = 3, D = 4, ROWS = 8 };
    tu_rng rng = {78};
    float x[B * T * D], a[D], y[B * T * D];
    tu_fill_normal(&rng, x, B * T * D, 1.0);
    tu_fill_uniform(&rng, a, D, 0.5, 0.95);
    uint16_t data[ROWS * D], before[ROWS * D];
    for (int i = 0; i < ROWS * D; i++) data[i] = ls_f32_to_bf16((float)tu_normal(&rng));
    memcpy(before, data, sizeof data);
    const int64_t src[B] = {6, -1}, dst[B * T] = {1, 2, 3, 6, 6, 6};
    linseq_ema_problem p = {.B = B, .T = T, .D = D, .x = x, .a = a};
    linseq_state_pool pool = {
        .data = data, .n_rows = ROWS, .dtype = LINSEQ_POOL_BF16, .src_rows = src, .dst_rows = dst};
    float *out[2] = {y, NULL};
    CHECK_OK(linseq_op_decode_tokens_pool("ema", &p, NULL, &pool, out));
    float h0[D], hT[D], y1[T * D];
    for (int d = 0; d < D; d++) h0[d] = ls_bf16_to_f32(before[6 * D + d]);
    bool ok = true;
    for (int t = 1; t <= T; t++) {
        linseq_ema_problem prefix = {.B = 1, .T = t, .D = D, .x = x, .a = a, .h0 = h0};
        CHECK_OK(linseq_ema_forward(&prefix, NULL, y1, hT));
        for (int d = 0; d < D; d++) ok &= data[dst[t - 1] * D + d] == ls_f32_to_bf16(hT[d]);
        if (t == T) ok &= tu_same_bits(y, y1, T * D);
    }
    for (int i = 0; i < T * D; i++) ok &= y[T * D + i] == 0.0f; /* the padding request */
    for (int r = 0; r < ROWS; r++)
        if (r != 1 && r != 2 && r != 3)
            ok &= memcmp(data + r * D, before + r * D, D * sizeof(uint16_t)) == 0;
    CHECK(ok, "several tokens: a state, an output or an untouched row differs");
    const int64_t clash[B * T] = {1, 2, 1, 6, 6, 6};
    pool.dst_rows = clash;
    memcpy(before, data, sizeof data);
    CHECK_FAILS(linseq_op_decode_tokens_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_INVALID_VALUE,
                "both write pool row");
    CHECK(memcmp(before, data, sizeof data) == 0, "a refused call wrote the pool");
}

/* Rows so many and so large that the pool's byte span overflows int64 (found by
 * fuzz_state_pool): refused as an overflow, the span computed without overflowing itself
 * (the sum of the last row's start and its size overflowed: undefined, which the sanitizer
 * build of this test reports). */
static void test_pool_span_overflow(void)
{
    float x[1] = {0}, a[1] = {0.5f}, y[1], data[4] = {0};
    const linseq_ema_problem p = {.B = 1, .T = 1, .D = (int64_t)1 << 59, .x = x, .a = a};
    const linseq_state_pool pool = {.data = data, .n_rows = (int64_t)1 << 62};
    float *out[2] = {y, NULL};
    CHECK_FAILS(linseq_op_decode_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_SIZE_OVERFLOW,
                "overflow the address range");
    CHECK(data[0] == 0.0f && data[3] == 0.0f, "a pool too large to address was written");
}

/* An output whose sizes' product overflows while every input's fits (the conv's final states
 * [B, D, W-1] with B and W both 2^32 + 1; found by fuzz_state_pool): refused before the pool
 * layer sizes its index work from B, which it tried to allocate (128 GiB) first. */
static void test_output_size_overflow(void)
{
    float x[3] = {0}, w[3] = {0}, y[3], data[4] = {0};
    const int64_t big = ((int64_t)1 << 32) + 1;
    const linseq_conv1d_problem p = {.B = big, .T = 1, .D = 3, .W = big, .x = x, .weight = w};
    const linseq_state_pool pool = {.data = data, .n_rows = 1};
    float *out[2] = {y, NULL};
    CHECK_FAILS(linseq_op_decode_pool("causal_conv1d", &p, NULL, &pool, out),
                LINSEQ_ERR_SIZE_OVERFLOW, "conv_state_out");
    CHECK_FAILS(linseq_op_forward_pool("causal_conv1d", &p, NULL, &pool, NULL, out),
                LINSEQ_ERR_SIZE_OVERFLOW, "conv_state_out");
    CHECK(data[0] == 0.0f && data[3] == 0.0f, "a refused call wrote the pool");
}

/* So many requests (or sequences) that the pool layer's own index work overflows although
 * every tensor's bytes fit (found by fuzz_state_pool): refused as an overflow before that
 * work is sized, for both calls (the prefill's wrapped to a few bytes, then read past). */
static void test_pool_index_count_overflow(void)
{
    float x[1] = {0}, a[1] = {0.5f}, y[1], data[1] = {0};
    const linseq_ema_problem p = {.B = (int64_t)1 << 59, .T = 1, .D = 1, .x = x, .a = a};
    const linseq_state_pool pool = {.data = data, .n_rows = 1};
    float *out[2] = {y, NULL};
    CHECK_FAILS(linseq_op_decode_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_SIZE_OVERFLOW,
                "indices overflow");
    CHECK_FAILS(linseq_op_forward_pool("ema", &p, NULL, &pool, NULL, out), LINSEQ_ERR_SIZE_OVERFLOW,
                "indices overflow");
    CHECK_FAILS(linseq_op_decode_tokens_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_SIZE_OVERFLOW,
                "indices overflow");
    CHECK(data[0] == 0.0f, "a refused call wrote the pool");
}

/* A negative size (found by fuzz_state_pool) makes the state's size negative: refused by the
 * op's own size check, naming the size, before the pool layer sizes any block by it; in the
 * gathered decode (rows apart) and in the prefill. */
static void test_pool_negative_size(void)
{
    float x[1] = {0}, a[1] = {0.5f}, y[1], data[2] = {0};
    const linseq_ema_problem p = {.B = 1, .T = 1, .D = -4, .x = x, .a = a};
    const linseq_state_pool pool = {.data = data, .n_rows = 1, .row_stride = 2};
    float *out[2] = {y, NULL};
    CHECK_FAILS(linseq_op_decode_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_INVALID_SIZE,
                "D = -4");
    CHECK_FAILS(linseq_op_forward_pool("ema", &p, NULL, &pool, NULL, out), LINSEQ_ERR_INVALID_SIZE,
                "D = -4");
    CHECK_FAILS(linseq_op_decode_tokens_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_INVALID_SIZE,
                "D = -4");
}

/* B and D whose input x overflows (found by fuzz_state_pool): refused as the op refuses x,
 * before the pool layer allocates the indices of B requests. */
static void test_pool_inputs_checked_first(void)
{
    float x[1] = {0}, a[1] = {0.5f}, y[1], data[4] = {0};
    const int64_t big = ((int64_t)1 << 32) + 1;
    const linseq_ema_problem p = {.B = big, .T = 1, .D = big, .x = x, .a = a};
    const linseq_state_pool pool = {.data = data, .n_rows = 4};
    float *out[2] = {y, NULL};
    CHECK_FAILS(linseq_op_decode_pool("ema", &p, NULL, &pool, out), LINSEQ_ERR_SIZE_OVERFLOW,
                "'x'");
}

/* The pool's bfloat16 rows are widened and rounded in blocks (ls_state_widen, ls_state_narrow):
 * element for element the scalar conversions', at every length around a block's edge and for
 * every bfloat16 value, and for floats at and around every rounding midpoint, infinities and
 * NaNs (quiet and signalling payloads) included. */
static void test_pool_bf16_blocks(void)
{
    const int64_t n = 65536 + 21; /* every bf16 bit pattern, then a tail past a whole block */
    uint16_t *h = malloc((size_t)n * sizeof *h), *back = malloc((size_t)n * sizeof *back);
    float *wide = tu_alloc((size_t)n), *probe = tu_alloc((size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)(i * 7919);
    for (int64_t i = 0; i < n; i++) { /* midpoints, one below, one above, and NaN payloads */
        uint32_t u =
            (uint32_t)(i & 0xffffu) << 16 | (uint32_t[]){0x8000u, 0x7fffu, 0x8001u, 0x0001u}[i % 4];
        memcpy(&probe[i], &u, sizeof u);
    }
    int bad = 0;
    const int64_t lengths[] = {1, 15, 16, 17, 31, 32, 33, n};
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
        const int64_t len = lengths[l];
        ls_state_widen(LINSEQ_POOL_BF16, h + 3, wide, len - (len == n ? 3 : 0));
        for (int64_t i = 0; i < len - (len == n ? 3 : 0); i++)
            bad += !tu_same_bits(&wide[i], &(float){ls_bf16_to_f32(h[i + 3])}, 1);
        ls_state_narrow(LINSEQ_POOL_BF16, probe, back, len);
        for (int64_t i = 0; i < len; i++) bad += back[i] != ls_f32_to_bf16(probe[i]);
    }
    CHECK(bad == 0, "bf16 pool rows: %d elements differ from the scalar conversions", bad);
    free(h);
    free(back);
    free(wide);
    free(probe);
}

/* linseq_state_pool_row_stride: the row stride of a strided pool whose rows are C-contiguous
 * (vLLM's pages, a transposed view, a size-1 dimension with any stride), and a refusal naming
 * the dimension for any other layout. */
static void test_row_stride_rule(void)
{
    struct {
        int n;
        int64_t sizes[4], strides[4];
        int64_t want;     /* the row stride, or -1 for a refusal */
        const char *name; /* what the refusal names */
    } cases[] = {
        {4, {5, 2, 3, 4}, {24, 12, 4, 1}, 24, NULL},   /* dense */
        {4, {5, 2, 3, 4}, {100, 12, 4, 1}, 100, NULL}, /* rows within larger pages */
        {4, {1, 2, 3, 4}, {7, 12, 4, 1}, 24, NULL},    /* one row: its size */
        {4, {5, 1, 3, 4}, {24, 999, 4, 1}, 24, NULL},  /* a size-1 dim, any stride */
        {1, {6}, {1}, 1, NULL},                        /* scalar states */
        {3, {5, 3, 4}, {12, 1, 3}, -1, "strides[2]"},  /* a transposed row */
        {3, {5, 3, 4}, {12, 8, 1}, -1, "strides[1]"},  /* a gap inside a row */
        {3, {5, 3, 4}, {11, 4, 1}, -1, "strides[0]"},  /* rows overlap */
        {3, {5, 3, 4}, {-12, 4, 1}, -1, "strides[0]"}, /* rows backwards */
        {3, {5, 0, 4}, {12, 4, 1}, -1, "sizes[1]"},    /* an empty dimension */
        {0, {5}, {1}, -1, "n_dims"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t got = -7;
        const linseq_status st =
            linseq_state_pool_row_stride(cases[c].n, cases[c].sizes, cases[c].strides, &got);
        if (cases[c].want >= 0) {
            CHECK(st == LINSEQ_OK && got == cases[c].want, "case %zu: %s, row stride %lld", c,
                  linseq_status_string(st), (long long)got);
        } else {
            CHECK(st != LINSEQ_OK && strstr(linseq_last_error(), cases[c].name) && got == -7,
                  "case %zu: %s (%s); expected a refusal naming %s, nothing written", c,
                  linseq_status_string(st), linseq_last_error(), cases[c].name);
        }
    }
    int64_t out;
    CHECK_FAILS(linseq_state_pool_row_stride(2, NULL, cases[0].strides, &out),
                LINSEQ_ERR_NULL_POINTER, "sizes");
    const int64_t huge[3] = {2, INT64_MAX / 2, 4}, dense[3] = {0, 4, 1};
    CHECK_FAILS(linseq_state_pool_row_stride(3, huge, dense, &out), LINSEQ_ERR_SIZE_OVERFLOW,
                "overflows");
}

int main(void)
{
    test_row_stride_rule();
    test_pool_inputs_checked_first();
    test_pool_negative_size();
    test_pool_span_overflow();
    test_pool_index_count_overflow();
    test_output_size_overflow();
    test_half_conversions();
    test_pool_bf16_blocks();
    test_prefill_pool();
    test_several_tokens();
    test_every_decode_op();
    return tu_finish("test_state_pool");
}
