/* KDA's decode over a serving engine's rows (ls_kda_decode_rows_isa, which
 * linseq_op_decode_pool calls for every pool but a dense float32 one updated in place): rows
 * a stride apart with gaps, float32, bf16 and half elements, requests writing their own row
 * or another, a padding request. The property: the new state of each request is the plain
 * float32 decode's (ls_kda_decode_isa on the widened rows, in place) rounded once to the
 * pool's type, written to the request's destination row only; the outputs are that decode's
 * bit for bit; every other byte of the pool (other rows, the gaps) is unchanged. On every
 * ISA, both state layouts, per-channel and per-head decay, the gate in the kernel or not,
 * 1 and 3 threads, odd K and V (vector tails).
 *
 * And through linseq_op_decode_pool: a pool whose requests write the rows others read (a
 * rotation) must still give every request the state of its source row as it was before the
 * call, which the per-request path cannot do in place; the pool layer takes the gathered
 * path there.
 *
 * And the recurrent forward of one token from h0 into ht, which runs as such a decode step:
 * the general forward's bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_float.h"
#include "kda/kda_kernels.h"
#include "kda/kda_op.h"
#include "kda_fixture.h"
#include "rows_pool.h"
#include "simd/isa.h"
#include "testutil.h"

enum { N_ROWS = 6, GAP = 5 };

typedef struct {
    const char *name;
    int64_t K, V;
    linseq_decay decay;
    bool v_first, gate_in_kernel;
} rows_case;

static kda_fixture make_case(const rows_case *rc, int64_t B)
{
    const kda_spec s = {.B = B,
                        .T = 1,
                        .H = 2,
                        .HV = 4,
                        .K = rc->K,
                        .V = rc->V,
                        .l2norm = true,
                        .decay = rc->decay,
                        .regime = GATE_RAND,
                        .gmag = 0.3,
                        .v_first = rc->v_first,
                        .seed = 2024};
    kda_fixture f;
    kda_fixture_make(&f, &s);
    f.p.h0 = NULL;
    if (rc->gate_in_kernel) { /* g holds raw gate inputs: any sign */
        f.p.gate_in_kernel = true;
        for (size_t i = 0; i < f.n_g; i++) f.g[i] = f.g[i] * -4.0f + 0.5f;
    }
    return f;
}

/* One case on one ISA and pool type: src/dst rows with a padding request, one request in
 * place and the others moved to rows nobody reads. */
static void check_rows(const rows_case *rc, ls_isa isa, linseq_pool_dtype dtype, int threads)
{
    enum { B = 4 };
    kda_fixture f = make_case(rc, B);
    float *A_log = NULL, *dt_bias = NULL;
    if (rc->gate_in_kernel) {
        const int64_t nb = rc->decay == LINSEQ_DECAY_PER_CHANNEL ? 4 * rc->K : 4;
        A_log = tu_alloc(4), dt_bias = tu_alloc((size_t)nb);
        tu_rng r = {7};
        tu_fill_uniform(&r, A_log, 4, 0.0, 2.0);
        tu_fill_normal(&r, dt_bias, (size_t)nb, 0.5);
        f.p.A_log = A_log, f.p.dt_bias = dt_bias;
    }
    static const int64_t src[B] = {2, -1, 0, 4}, dst[B] = {3, -1, 0, 5};
    rows_pool pool;
    rows_pool_make(&pool, dtype, N_ROWS, 4 * rc->K * rc->V, GAP, 11);
    /* the reference: the plain decode on the widened rows, dense, in place */
    float *o_ref = tu_alloc(f.n_v), *o = tu_alloc_poisoned(f.n_v);
    const linseq_exec ex = {.threads = threads};
    CHECK_OK(ls_kda_decode_isa(&f.p, &ex, pool.dense, N_ROWS, src, o_ref, isa));
    const ls_state_rows rows = rows_pool_rows(&pool, src, dst);
    CHECK_OK(ls_kda_decode_rows_isa(&f.p, &ex, &rows, N_ROWS, o, isa));
    const bool states = rows_pool_holds(&pool, pool.dense, src, dst, B);
    const bool outputs = tu_same_bits(o, o_ref, f.n_v);
    static const char *const names[] = {"f32", "bf16", "f16"};
    CHECK(states && outputs, "%s %s %s pool, %d threads: pool %s, outputs %s", rc->name,
          ls_isa_name(isa), names[dtype], threads,
          states ? "as the float32 decode's rounded" : "DIFFERS", outputs ? "equal" : "DIFFER");
    free(o), free(o_ref);
    rows_pool_free(&pool);
    free(A_log), free(dt_bias);
    kda_fixture_free(&f);
}

/* bf16 rows whose states hold subnormal, infinite and NaN values: the new states' rounding
 * (AVX512-BF16's instruction where the CPU has it, else integer arithmetic) gives
 * ls_f32_to_bf16's bits of the float32 decode's on every ISA. States and values of about
 * 1e-39 are subnormal; the kernels read them as zero (core/fp_mode.h), the float32 decode
 * as well. One head of one request gets an inf and a NaN. */
static void check_extreme_rows(ls_isa isa)
{
    /* V = 80: a full column block (the AVX-512 even/odd kernel's) and a tail */
    const rows_case rc = {"extreme values", 16, 80, LINSEQ_DECAY_PER_HEAD, false, false};
    enum { B = 2 };
    kda_fixture f = make_case(&rc, B);
    for (size_t i = 0; i < f.n_g; i++) f.g[i] = 0.0f;
    for (size_t i = 0; i < f.n_v; i++) f.v[i] *= 1e-39f;
    static const int64_t src[B] = {0, 2}, dst[B] = {1, 2};
    rows_pool pool;
    const int64_t row = 4 * rc.K * rc.V;
    rows_pool_make(&pool, LINSEQ_POOL_BF16, 3, row, 0, 23);
    uint16_t *h = (uint16_t *)(void *)pool.data, *before = (uint16_t *)(void *)pool.before;
    for (int64_t i = 0; i < 3 * row; i++) {
        h[i] = ls_f32_to_bf16(ls_bf16_to_f32(h[i]) * 1e-39f);
        if (i == 2 * row + 5) h[i] = 0x7f80;  /* +inf */
        if (i == 2 * row + 77) h[i] = 0xffc1; /* a NaN */
        before[i] = h[i];
        pool.dense[i] = ls_bf16_to_f32(h[i]);
    }
    float *o_ref = tu_alloc(f.n_v), *o = tu_alloc_poisoned(f.n_v);
    const linseq_exec ex = {.threads = 1};
    int subnormal = 0;
    for (int64_t i = 0; i < row; i++) subnormal += fpclassify(pool.dense[i]) == FP_SUBNORMAL;
    CHECK_OK(ls_kda_decode_isa(&f.p, &ex, pool.dense, 3, src, o_ref, isa));
    const ls_state_rows rows = rows_pool_rows(&pool, src, dst);
    CHECK_OK(ls_kda_decode_rows_isa(&f.p, &ex, &rows, 3, o, isa));
    CHECK(subnormal > 100 && rows_pool_holds(&pool, pool.dense, src, dst, B) &&
              tu_same_bits(o, o_ref, f.n_v),
          "%s: bf16 rows with subnormal (%d), inf and NaN states differ from the float32 "
          "decode rounded once",
          ls_isa_name(isa), subnormal);
    free(o_ref), free(o);
    rows_pool_free(&pool);
    kda_fixture_free(&f);
}

/* Requests 0, 1, 2 read rows 0, 1, 2 and write rows 1, 2, 0: each writes the row the next one
 * reads. Through the public pool entry, bf16: each request must start from its row as it was
 * before the call. */
static void check_rotation(void)
{
    const rows_case rc = {"rotation", 16, 24, LINSEQ_DECAY_PER_CHANNEL, false, false};
    enum { B = 3 };
    kda_fixture f = make_case(&rc, B);
    static const int64_t src[B] = {0, 1, 2}, dst[B] = {1, 2, 0};
    rows_pool pool;
    rows_pool_make(&pool, LINSEQ_POOL_BF16, B, 4 * 16 * 24, 0, 5);
    float *o_ref = tu_alloc(f.n_v), *o = tu_alloc(f.n_v);
    CHECK_OK(linseq_kda_decode(&f.p, NULL, pool.dense, B, src, o_ref));
    const linseq_state_pool p = {.data = pool.data,
                                 .n_rows = B,
                                 .dtype = LINSEQ_POOL_BF16,
                                 .src_rows = src,
                                 .dst_rows = dst};
    float *out[] = {o};
    CHECK_OK(linseq_op_decode_pool("kda", &f.p, &(linseq_exec){.threads = 1}, &p, out));
    CHECK(tu_same_bits(o, o_ref, f.n_v) && rows_pool_holds(&pool, pool.dense, src, dst, B),
          "rotation through linseq_op_decode_pool: a request read a row another had written");
    free(o_ref), free(o);
    rows_pool_free(&pool);
    kda_fixture_free(&f);
}

/* A recurrent forward of one token per sequence from h0 into ht (which linseq_kda_forward runs
 * as a decode step from h0's rows into ht's) against the training forward of the same call,
 * which takes the forward's general path: o and ht bit for bit, with ht a new state or h0
 * itself; h0 unchanged in the first case. */
static void check_one_step_forward(const rows_case *rc, bool delta, ls_isa isa, int threads)
{
    enum { B = 3 };
    kda_fixture f = make_case(rc, B);
    if (!delta) f.p.beta = NULL;
    float *A_log = tu_alloc(4), *dt_bias = tu_alloc(4 * (size_t)rc->K);
    if (rc->gate_in_kernel) {
        tu_rng r = {9};
        tu_fill_uniform(&r, A_log, 4, 0.0, 2.0);
        tu_fill_normal(&r, dt_bias, 4 * (size_t)rc->K, 0.5);
        f.p.A_log = A_log, f.p.dt_bias = dt_bias;
    }
    const size_t n_state = (size_t)(B * 4 * rc->K * rc->V);
    float *h0 = tu_alloc(n_state), *h0_before = tu_alloc(n_state);
    tu_rng r = {31};
    tu_fill_normal(&r, h0, n_state, 0.5);
    memcpy(h0_before, h0, n_state * sizeof *h0);
    f.p.h0 = h0;
    const linseq_exec ex = {.mode = LINSEQ_MODE_RECURRENT, .threads = threads};
    size_t saved_bytes = 0;
    CHECK_OK(linseq_kda_saved_size(&f.p, &ex, &saved_bytes));
    void *saved = malloc(saved_bytes);
    float *o_ref = tu_alloc(f.n_v), *ht_ref = tu_alloc(n_state);
    float *o = tu_alloc_poisoned(f.n_v), *ht = tu_alloc_poisoned(n_state);
    CHECK_OK(ls_kda_forward_train_isa(&f.p, &ex, o_ref, ht_ref, saved, saved_bytes, isa));
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o, ht, isa));
    const bool moved = tu_same_bits(o, o_ref, f.n_v) && tu_same_bits(ht, ht_ref, n_state) &&
                       tu_same_bits(h0, h0_before, n_state);
    CHECK_OK(ls_kda_forward_isa(&f.p, &ex, o, h0, isa));
    const bool in_place = tu_same_bits(o, o_ref, f.n_v) && tu_same_bits(h0, ht_ref, n_state);
    CHECK(moved && in_place,
          "%s%s %s, %d threads: the one-token forward into %s differs from the general path's",
          rc->name, delta ? "" : " without beta", ls_isa_name(isa), threads,
          moved ? "h0 itself" : "a new state");
    free(saved), free(o_ref), free(ht_ref), free(o), free(ht), free(h0), free(h0_before);
    free(A_log), free(dt_bias);
    kda_fixture_free(&f);
}

int main(void)
{
    static const rows_case cases[] = {
        {"K-first per-channel", 24, 19, LINSEQ_DECAY_PER_CHANNEL, false, false},
        {"K-first per-head gated", 16, 64, LINSEQ_DECAY_PER_HEAD, false, true},
        {"K-first per-channel gated", 13, 40, LINSEQ_DECAY_PER_CHANNEL, false, true},
        {"V-first per-head", 24, 19, LINSEQ_DECAY_PER_HEAD, true, false},
    };
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int dtype = 0; dtype < 3; dtype++)
                for (int threads = 1; threads <= 3; threads += 2)
                    check_rows(&cases[c], (ls_isa)isa, (linseq_pool_dtype)dtype, threads);
        check_extreme_rows((ls_isa)isa);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int threads = 1; threads <= 3; threads += 2) {
                check_one_step_forward(&cases[c], true, (ls_isa)isa, threads);
                check_one_step_forward(&cases[c], false, (ls_isa)isa, threads);
            }
    }
    check_rotation();
    return tu_finish("test_kda_decode_rows");
}
