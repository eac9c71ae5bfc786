/* The bad-input table of the KDA entry points: every way an argument can be wrong returns its
 * specific status, the message names the argument, and no output byte changes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { B = 2, T = 5, H = 2, HV = 4, K = 8, V = 6 };

static float q[B * T * H * K], k[B * T * H * K], v[B * T * HV * V], beta[B * T * HV],
    g[B * T * HV * K], h0[B * HV * K * V], A_log[HV], dt_bias[HV * K];
static float o[B * T * HV * V], ht[B * HV * K * V];
static int64_t cu[3] = {0, 4, 10};

static linseq_kda_problem valid(void)
{
    linseq_kda_problem p = {.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V,
                            .q = q, .k = k, .v = v, .beta = beta, .g = g, .h0 = h0,
                            .decay = LINSEQ_DECAY_PER_CHANNEL, .qk_l2norm = true};
    return p;
}

/* Runs one bad call and checks status, message and the untouched outputs. */
static void expect(const char *label, linseq_status got, linseq_status want, const char *needle,
                   const void *out1, size_t n1, const void *out2, size_t n2)
{
    CHECK(got == want, "%s: status %s, expected %s (%s)", label, linseq_status_string(got),
          linseq_status_string(want), linseq_last_error());
    CHECK(strstr(linseq_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'",
          label, linseq_last_error(), needle);
    CHECK(!out1 || tu_is_poisoned(out1, n1), "%s: an output byte changed", label);
    CHECK(!out2 || tu_is_poisoned(out2, n2), "%s: a second output byte changed", label);
}

static void forward_case(const char *label, linseq_kda_problem p, const linseq_exec *ex,
                         float *out, float *state_out, linseq_status want, const char *needle)
{
    tu_poison(o, sizeof o);
    tu_poison(ht, sizeof ht);
    linseq_status st = linseq_kda_forward(&p, ex, out, state_out);
    expect(label, st, want, needle, o, sizeof o, ht, sizeof ht);
}

static void test_forward_table(void)
{
    linseq_kda_problem p;
    tu_poison(o, sizeof o);
    tu_poison(ht, sizeof ht);
    expect("problem NULL", linseq_kda_forward(NULL, NULL, o, ht), LINSEQ_ERR_NULL_POINTER,
           "problem", o, sizeof o, ht, sizeof ht);

#define BAD(label, field, value, want, needle)                                           \
    p = valid();                                                                          \
    p.field = value;                                                                      \
    forward_case(label, p, NULL, o, ht, want, needle)

    BAD("q NULL", q, NULL, LINSEQ_ERR_NULL_POINTER, "'q'");
    BAD("k NULL", k, NULL, LINSEQ_ERR_NULL_POINTER, "'k'");
    BAD("v NULL", v, NULL, LINSEQ_ERR_NULL_POINTER, "'v'");
    BAD("beta NULL", beta, NULL, LINSEQ_ERR_NULL_POINTER, "'beta'");
    BAD("g NULL", g, NULL, LINSEQ_ERR_NULL_POINTER, "'g'");
    BAD("B 0", B, 0, LINSEQ_ERR_INVALID_SIZE, "B");
    BAD("T negative", T, -3, LINSEQ_ERR_INVALID_SIZE, "T");
    BAD("H 0", H, 0, LINSEQ_ERR_INVALID_SIZE, "H");
    BAD("HV negative", HV, -4, LINSEQ_ERR_INVALID_SIZE, "HV");
    BAD("K 0", K, 0, LINSEQ_ERR_INVALID_SIZE, "K");
    BAD("V 0", V, 0, LINSEQ_ERR_INVALID_SIZE, "V");
    BAD("HV not multiple of H", HV, 3, LINSEQ_ERR_SHAPE_MISMATCH, "HV");
    BAD("decay enum", decay, (linseq_decay)7, LINSEQ_ERR_INVALID_ENUM, "decay");
    BAD("decay negative enum", decay, (linseq_decay)-1, LINSEQ_ERR_INVALID_ENUM, "decay");
    BAD("g with no decay", decay, LINSEQ_DECAY_NONE, LINSEQ_ERR_INVALID_VALUE, "'g'");
    BAD("scale NaN", scale, NAN, LINSEQ_ERR_INVALID_VALUE, "scale");
    BAD("scale inf", scale, INFINITY, LINSEQ_ERR_INVALID_VALUE, "scale");
    BAD("A_log without gate", A_log, A_log, LINSEQ_ERR_INVALID_VALUE, "A_log");
    BAD("lower_bound without gate", lower_bound, -5.0f, LINSEQ_ERR_INVALID_VALUE, "lower_bound");
    BAD("size overflow", T, (int64_t)1 << 60, LINSEQ_ERR_SIZE_OVERFLOW, "'q'");

    p = valid();
    p.gate_in_kernel = true;
    p.lower_bound = 1.0f;
    forward_case("lower_bound positive", p, NULL, o, ht, LINSEQ_ERR_INVALID_VALUE, "lower_bound");
    p.lower_bound = NAN;
    forward_case("lower_bound NaN", p, NULL, o, ht, LINSEQ_ERR_INVALID_VALUE, "lower_bound");
    p = valid();
    p.decay = LINSEQ_DECAY_NONE;
    p.g = NULL;
    p.gate_in_kernel = true;
    forward_case("gate without decay", p, NULL, o, ht, LINSEQ_ERR_INVALID_VALUE, "gate_in_kernel");

    /* a working state too large to allocate, even with no h0 / ht to describe it */
    p = valid();
    p.B = p.T = p.H = 1;
    p.HV = 0;
    p.K = p.V = (int64_t)1 << 31;
    p.h0 = NULL;
    forward_case("K*V overflow", p, NULL, o, NULL, LINSEQ_ERR_SIZE_OVERFLOW, "K*V");

    p = valid();
    forward_case("o NULL", p, NULL, NULL, ht, LINSEQ_ERR_NULL_POINTER, "'o'");
    forward_case("o aliases q", p, NULL, q, ht, LINSEQ_ERR_ALIASING, "'o'");
    forward_case("ht overlaps o", p, NULL, o, o + 8, LINSEQ_ERR_ALIASING, "'ht'");
    /* separate heap blocks, so that each overlap can only be with the intended input */
    float *h0_heap = tu_alloc(sizeof h0 / 4), *v_heap = tu_alloc(sizeof ht / 4);
    p.h0 = h0_heap;
    forward_case("ht shifted over h0", p, NULL, o, h0_heap + 1, LINSEQ_ERR_ALIASING, "'h0'");
    p = valid();
    p.v = v_heap;
    forward_case("ht aliases v", p, NULL, o, v_heap, LINSEQ_ERR_ALIASING, "'v'");
    free(h0_heap);
    free(v_heap);
    p = valid();

    linseq_exec ex = {.mode = (linseq_mode)9};
    forward_case("mode enum", valid(), &ex, o, ht, LINSEQ_ERR_INVALID_ENUM, "mode");
    ex = (linseq_exec){.chunk_size = 48};
    forward_case("chunk size", valid(), &ex, o, ht, LINSEQ_ERR_INVALID_VALUE, "chunk_size");
    ex = (linseq_exec){.threads = -1};
    forward_case("threads", valid(), &ex, o, ht, LINSEQ_ERR_INVALID_VALUE, "threads");

    /* varlen: B must be 1, offsets 0 .. T and non-decreasing */
    p = valid();
    p.cu_seqlens = cu;
    p.n_seqs = 2;
    forward_case("cu_seqlens with B 2", p, NULL, o, ht, LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1");
    p.B = 1;
    p.T = 10;
    p.h0 = NULL;
    int64_t bad0[3] = {1, 4, 10}, dec[3] = {0, 6, 4}, end[3] = {0, 4, 9};
    p.cu_seqlens = bad0;
    forward_case("cu_seqlens[0] != 0", p, NULL, o, ht, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0]");
    p.cu_seqlens = dec;
    forward_case("cu_seqlens decreasing", p, NULL, o, ht, LINSEQ_ERR_INVALID_CU_SEQLENS, "decreases");
    p.cu_seqlens = end;
    forward_case("cu_seqlens end != T", p, NULL, o, ht, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T");
    p.cu_seqlens = cu;
    p.n_seqs = 0;
    forward_case("n_seqs 0", p, NULL, o, ht, LINSEQ_ERR_INVALID_SIZE, "n_seqs");
    p.n_seqs = 2;
    tu_poison(o, sizeof o);
    CHECK_OK(linseq_kda_forward(&p, NULL, o, ht)); /* the corrected call runs */
#undef BAD
}

static void test_decode_table(void)
{
    static float pool[5 * HV * K * V], pool_copy[5 * HV * K * V], od[B * HV * V];
    tu_rng r = {5};
    tu_fill_normal(&r, pool, sizeof pool / 4, 1.0);
    memcpy(pool_copy, pool, sizeof pool);
    linseq_kda_problem p = valid();
    p.T = 1;
    p.h0 = NULL;
    int64_t rows_dup[B] = {3, 3}, rows_big[B] = {0, 5};

#define DECODE(label, prob, st_ptr, n_rows, rows, out, want, needle)                        \
    do {                                                                                   \
        tu_poison(od, sizeof od);                                                          \
        linseq_kda_problem pp_ = (prob);                                                   \
        linseq_status s_ = linseq_kda_decode(&pp_, NULL, st_ptr, n_rows, rows, out);       \
        expect(label, s_, want, needle, od, sizeof od, NULL, 0);                           \
        CHECK(memcmp(pool, pool_copy, sizeof pool) == 0, "%s: the state pool changed", label); \
    } while (0)

    linseq_kda_problem bad = p;
    bad.T = 2;
    DECODE("T 2", bad, pool, 5, NULL, od, LINSEQ_ERR_INVALID_SIZE, "T = 2");
    bad = p;
    bad.h0 = h0;
    DECODE("h0 given", bad, pool, 5, NULL, od, LINSEQ_ERR_INVALID_VALUE, "h0");
    DECODE("state NULL", p, NULL, 5, NULL, od, LINSEQ_ERR_NULL_POINTER, "'state'");
    DECODE("o NULL", p, pool, 5, NULL, NULL, LINSEQ_ERR_NULL_POINTER, "'o'");
    DECODE("no rows", p, pool, 0, NULL, od, LINSEQ_ERR_INVALID_SIZE, "n_state_rows");
    DECODE("pool too small", p, pool, 1, NULL, od, LINSEQ_ERR_SHAPE_MISMATCH, "n_state_rows");
    DECODE("row out of range", p, pool, 5, rows_big, od, LINSEQ_ERR_INVALID_VALUE, "state_rows[1]");
    DECODE("row twice", p, pool, 5, rows_dup, od, LINSEQ_ERR_INVALID_VALUE, "twice");
    DECODE("o inside the pool", p, pool, 5, NULL, pool + 3, LINSEQ_ERR_ALIASING, "'o'");
    bad = p;
    bad.q = pool;
    DECODE("state aliases q", bad, pool, 5, NULL, od, LINSEQ_ERR_ALIASING, "'state'");
#undef DECODE
}

static void test_gate_table(void)
{
    static float graw[B * T * H * K], gout[B * T * H * K];
    const linseq_kda_gate_problem ok = {.B = B, .T = T, .H = H, .K = K,
                                        .decay = LINSEQ_DECAY_PER_CHANNEL, .g_raw = graw,
                                        .A_log = A_log, .dt_bias = dt_bias};
    linseq_kda_gate_problem p;
#define GATE(label, field, value, out, want, needle)                                      \
    p = ok;                                                                               \
    p.field = value;                                                                      \
    tu_poison(gout, sizeof gout);                                                         \
    expect(label, linseq_kda_gate_forward(&p, NULL, out), want, needle, gout, sizeof gout, \
           NULL, 0)
    GATE("g_raw NULL", g_raw, NULL, gout, LINSEQ_ERR_NULL_POINTER, "'g_raw'");
    GATE("g NULL", B, B, NULL, LINSEQ_ERR_NULL_POINTER, "'g'");
    GATE("decay none", decay, LINSEQ_DECAY_NONE, gout, LINSEQ_ERR_INVALID_ENUM, "decay");
    GATE("decay 5", decay, (linseq_decay)5, gout, LINSEQ_ERR_INVALID_ENUM, "decay");
    GATE("B 0", B, 0, gout, LINSEQ_ERR_INVALID_SIZE, "B");
    GATE("K 0", K, 0, gout, LINSEQ_ERR_INVALID_SIZE, "K");
    GATE("lower bound > 0", lower_bound, 0.5f, gout, LINSEQ_ERR_INVALID_VALUE, "lower_bound");
    GATE("g aliases g_raw", g_raw, gout, gout, LINSEQ_ERR_ALIASING, "'g'");
    GATE("overflow", T, (int64_t)1 << 61, gout, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'");
#undef GATE
    tu_poison(gout, sizeof gout);
    expect("gate problem NULL", linseq_kda_gate_forward(NULL, NULL, gout),
           LINSEQ_ERR_NULL_POINTER, "problem", gout, sizeof gout, NULL, 0);
}

static void test_backward_table(void)
{
    static float d_o[B * T * HV * V], d_ht[B * HV * K * V];
    static float dq[B * T * H * K], dk[B * T * H * K], dv[B * T * HV * V], dbeta[B * T * HV],
        dg[B * T * HV * K], dh0[B * HV * K * V], dA[HV], ddt[HV * K];
    float *outs[] = {dq, dk, dv, dbeta, dg, dh0, dA, ddt};
    const size_t sizes[] = {sizeof dq, sizeof dk, sizeof dv, sizeof dbeta,
                            sizeof dg, sizeof dh0, sizeof dA, sizeof ddt};
    const linseq_kda_grads all = {.dq = dq, .dk = dk, .dv = dv, .dbeta = dbeta, .dg = dg, .dh0 = dh0};
    linseq_kda_problem p;
    linseq_kda_grads gr;

#define BWD(label, prob, dout, dstate, grads, want, needle)                                 \
    do {                                                                                   \
        for (int i_ = 0; i_ < 8; i_++) tu_poison(outs[i_], sizes[i_]);                     \
        linseq_kda_problem pp_ = (prob);                                                   \
        linseq_status s_ = linseq_kda_backward(&pp_, NULL, dout, dstate, grads);           \
        expect(label, s_, want, needle, NULL, 0, NULL, 0);                                 \
        bool intact_ = true;                                                               \
        for (int i_ = 0; i_ < 8; i_++) intact_ &= tu_is_poisoned(outs[i_], sizes[i_]);     \
        CHECK(intact_, "%s: a gradient byte changed", label);                             \
    } while (0)

    BWD("grads NULL", valid(), d_o, d_ht, NULL, LINSEQ_ERR_NULL_POINTER, "grads");
    BWD("d_o NULL", valid(), NULL, d_ht, &all, LINSEQ_ERR_NULL_POINTER, "'d_o'");
    p = valid();
    p.K = 0;
    BWD("K 0", p, d_o, d_ht, &all, LINSEQ_ERR_INVALID_SIZE, "K");
    p = valid();
    p.decay = LINSEQ_DECAY_NONE;
    p.g = NULL;
    BWD("dg without decay", p, d_o, d_ht, &all, LINSEQ_ERR_INVALID_VALUE, "dg");
    gr = all;
    gr.dA_log = dA;
    BWD("dA_log without gate", valid(), d_o, d_ht, &gr, LINSEQ_ERR_INVALID_VALUE, "dA_log");
    gr = all;
    gr.dq = (float *)q;
    BWD("dq aliases q", valid(), d_o, d_ht, &gr, LINSEQ_ERR_ALIASING, "'dq'");
    gr = all;
    gr.dk = dq;
    BWD("dk aliases dq", valid(), d_o, d_ht, &gr, LINSEQ_ERR_ALIASING, "'dk'");
    gr = all;
    gr.dh0 = d_ht;
    BWD("dh0 aliases d_ht", valid(), d_o, d_ht, &gr, LINSEQ_ERR_ALIASING, "'dh0'");
    p = valid();
    p.T = (int64_t)1 << 60;
    BWD("overflow", p, d_o, d_ht, &all, LINSEQ_ERR_SIZE_OVERFLOW, "'q'");
    p = valid();
    p.B = 1;
    p.T = 10;
    p.h0 = NULL;
    p.cu_seqlens = cu;
    p.n_seqs = 2;
    int64_t bad_end[3] = {0, 4, 11};
    p.cu_seqlens = bad_end;
    BWD("cu_seqlens end", p, d_o, NULL, &all, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T");
#undef BWD
    /* the corrected call runs and writes */
    for (int i = 0; i < 6; i++) tu_poison(outs[i], sizes[i]);
    p = valid();
    CHECK_OK(linseq_kda_backward(&p, NULL, d_o, d_ht, &all));
    CHECK(!tu_is_poisoned(dq, sizeof dq) && !tu_is_poisoned(dh0, sizeof dh0),
          "a valid backward left its outputs unwritten");

    /* the gate's backward */
    static float graw[B * T * H * K], dgate[B * T * H * K], dgraw[B * T * H * K];
    const linseq_kda_gate_problem gp = {.B = B, .T = T, .H = H, .K = K,
                                        .decay = LINSEQ_DECAY_PER_CHANNEL, .g_raw = graw};
    linseq_kda_gate_grads gg = {.dg_raw = dgraw};
    tu_poison(dgraw, sizeof dgraw);
    expect("gate grads NULL", linseq_kda_gate_backward(&gp, NULL, dgate, NULL),
           LINSEQ_ERR_NULL_POINTER, "grads", dgraw, sizeof dgraw, NULL, 0);
    expect("gate d_g NULL", linseq_kda_gate_backward(&gp, NULL, NULL, &gg),
           LINSEQ_ERR_NULL_POINTER, "'d_g'", dgraw, sizeof dgraw, NULL, 0);
    gg.dg_raw = dgate;
    expect("dg_raw aliases d_g", linseq_kda_gate_backward(&gp, NULL, dgate, &gg),
           LINSEQ_ERR_ALIASING, "'dg_raw'", dgraw, sizeof dgraw, NULL, 0);
}

static void test_threads_setting(void)
{
    CHECK(linseq_set_num_threads(-2) == LINSEQ_ERR_INVALID_VALUE, "negative thread count accepted");
    CHECK(strstr(linseq_last_error(), "n = -2") != NULL, "thread message: %s", linseq_last_error());
    CHECK_OK(linseq_set_num_threads(3));
    CHECK(linseq_get_num_threads() == 3, "thread count not kept");
    CHECK_OK(linseq_set_num_threads(0));
    CHECK(linseq_get_num_threads() >= 1, "default thread count < 1");
    CHECK(strcmp(linseq_last_error(), "") == 0, "a success leaves a stale message");
}

int main(void)
{
    tu_rng r = {1};
    tu_fill_normal(&r, q, sizeof q / 4, 1.0);
    tu_fill_normal(&r, k, sizeof k / 4, 1.0);
    tu_fill_normal(&r, v, sizeof v / 4, 1.0);
    tu_fill_uniform(&r, beta, sizeof beta / 4, 0.1, 0.9);
    tu_fill_uniform(&r, g, sizeof g / 4, -1.0, 0.0);
    test_forward_table();
    test_decode_table();
    test_gate_table();
    test_backward_table();
    test_threads_setting();
    return tu_finish("test_kda_errors");
}
