/* The CUDA KDA forward, decode and standalone gate (linseq_kda_forward / _decode /
 * linseq_kda_gate_forward / _backward on LINSEQ_DEVICE_CUDA) against the CPU path of the same
 * library on host copies of the same inputs.
 *
 * Coverage: odd K and V (1, 17, 33, 100) and K = V = 64, 128, 256; T = 1, 7, 63, 64, 65, 300;
 * chunk sizes 16, 32, 64, 128 and recurrent mode; decay none / per head / per channel; the
 * default and a custom scale; qk_l2norm; beta_is_logit; state_v_first; gate_in_kernel with
 * and without A_log and dt_bias, default and lower-bound forms; GVA (HV = 2H, 3H); varlen with
 * an empty sequence; h0 absent, given, and updated in place (ht == h0); g = -1000 tokens (and
 * channels) inside chunks; decode over a state pool with a row map, padding requests and
 * both layouts. Every output is poisoned (NaN) before each call, so an element a kernel never
 * writes fails the comparison; every call runs twice and must give the same bits; chunked
 * and recurrent modes must agree on the GPU as they do on the CPU.
 *
 * Tolerances, as max|gpu - cpu| / max|cpu| per output:
 *   - float32: 1e-5. Both sides compute the same chunk algebra (or the same recurrence) in
 *     float32 from the same inputs and differ only in summation order (warp butterflies,
 *     4-way split sums), in the association of the decay products (the GPU forms the chunk's
 *     e^{G} from per-sub-chunk products) and in the chunk solve (the GPU applies an explicit
 *     inverse (I + diag(beta) Akk)^{-1}, the CPU substitutes rows). Each is a few ulp of the
 *     largest term of a sum; with unit-norm keys and beta <= 1 the inverse is well
 *     conditioned (its entries stay O(1)), so the difference stays ~1e-6 of max|o|. A wrong
 *     term of any kind (a missing decay factor, a token off by one) is >= 1e-3.
 *   - bf16, recurrent mode and chunk sizes 16/32/128: the CPU gets the bf16-rounded inputs
 *     (ct_round_bf16_array), so both sides compute with identical numbers; these GPU paths
 *     keep every intermediate (Aqk, Tinv, qg, kbg, kd, the state) in float32 and multiply in
 *     float32 FFMA, then round each o element once to bf16. Round to nearest even is off by
 *     at most half an ulp, 2^-8 of the element (bf16 keeps 8 significant bits), hence at most
 *     2^-8 max|cpu| = 3.9e-3 of the max, plus the float32 differences above: 4.5e-3. ht is
 *     float32 from unrounded values: 1e-5.
 *   - bf16, chunk 64 (tensor cores): the five state products take bf16 operands (the chunk
 *     matrices, the state, R and the deltas are rounded to bf16, each off by <= 2^-9
 *     relative) with float32 accumulation. A product term a*b is then off by <= 2^-8
 *     relative; the roundings are independent, so a sum of n terms drifts by ~2^-9 sqrt(n)
 *     of its typical term, i.e. ~2^-9 = 2e-3 of the sum when it does not cancel, and a
 *     few times that where it does (Tinv R and the delta u = beta v - kbg S are differences).
 *     o adds its final rounding (3.9e-3): checked at 2e-2 (7.4e-3 seen in a host emulation
 *     of the kernel). The state compounds one rounded product per chunk, damped by the
 *     decay: the drift grows with the number of chunks the decay keeps (5.6e-3 at T = 300
 *     with the in-kernel gate's slow decays, emulated): checked at 2e-2. fla's bf16 chunk is
 *     held to 5e-3 in RMS ratio, a weaker norm than this max.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_testutil.h"

#define TOL_F32 1e-5
#define TOL_BF16 4.5e-3
#define TOL_BF16_MMA 2e-2
#define TOL_BF16_MMA_STATE 2e-2
#define TOL_MODES 3e-5 /* chunked vs recurrent on the GPU (each within 1e-5 of the CPU) */

/* the worst errors seen, printed at the end (to watch the margins) */
static double worst_f32, worst_bf16, worst_mma_o, worst_mma_ht;
static void note(double *worst, double e)
{
    if (e > *worst) *worst = e;
}

typedef struct {
    int64_t B, T, H, HV, K, V;
    linseq_decay decay;
    bool l2norm, logit, v_first, h0, inplace, gate, a_log, dt_bias, extreme;
    float lower_bound, scale;
    const int64_t *cu;
    int64_t n_seqs;
} tcase;

typedef struct {
    float *q, *k, *v, *beta, *g, *h0, *A_log, *dt_bias;
    size_t n_qk, n_v, n_beta, n_g, n_state, n_rows;
    int64_t HV, gK;
} host_data;

static void describe(const tcase *c, const char *mode, int bf16, char *buf, size_t n)
{
    snprintf(buf, n,
             "B%lld T%lld H%lld HV%lld K%lld V%lld decay%d l2%d logit%d vfirst%d h0%d%s gate%d"
             "(alog%d bias%d lb%g) extreme%d scale%g seqs%lld %s %s",
             (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->HV, (long long)c->K,
             (long long)c->V, (int)c->decay, c->l2norm, c->logit, c->v_first, c->h0,
             c->inplace ? "(in place)" : "", c->gate, c->a_log, c->dt_bias, (double)c->lower_bound,
             c->extreme, (double)c->scale, (long long)(c->cu ? c->n_seqs : 0), mode,
             bf16 ? "bf16" : "f32");
}

/* Inputs: keys of about unit norm (raw normals with the l2 norm, normals / sqrt(K) without)
 * so the delta rule is stable; beta in (0,1) or logits; g = -U(0,2) or the raw gate input;
 * with `extreme` some tokens (and channels) get g = -1000 and some g = 0. */
static void make_inputs(const tcase *c, tu_rng *rng, int bf16, host_data *h)
{
    memset(h, 0, sizeof *h);
    h->HV = c->HV;
    h->gK = c->decay == LINSEQ_DECAY_PER_CHANNEL ? c->K : 1;
    const int64_t BT = c->B * c->T;
    h->n_qk = (size_t)(BT * c->H * c->K);
    h->n_v = (size_t)(BT * c->HV * c->V);
    h->n_beta = (size_t)(BT * c->HV);
    h->n_g = c->decay == LINSEQ_DECAY_NONE ? 0 : (size_t)(BT * c->HV * h->gK);
    h->n_rows = (size_t)(c->cu ? c->n_seqs : c->B);
    h->n_state = h->n_rows * (size_t)(c->HV * c->K * c->V);
    h->q = tu_alloc(h->n_qk);
    h->k = tu_alloc(h->n_qk);
    h->v = tu_alloc(h->n_v);
    h->beta = tu_alloc(h->n_beta);
    tu_fill_normal(rng, h->q, h->n_qk, 1.0);
    tu_fill_normal(rng, h->k, h->n_qk, c->l2norm ? 1.0 : 1.0 / sqrt((double)c->K));
    if (!c->l2norm) /* keep |q| moderate too */
        for (size_t i = 0; i < h->n_qk; i++) h->q[i] /= (float)sqrt((double)c->K);
    tu_fill_normal(rng, h->v, h->n_v, 1.0);
    if (c->logit)
        tu_fill_normal(rng, h->beta, h->n_beta, 2.0);
    else
        tu_fill_uniform(rng, h->beta, h->n_beta, 0.0, 1.0);
    if (h->n_g) {
        h->g = tu_alloc(h->n_g);
        if (c->gate) {
            tu_fill_normal(rng, h->g, h->n_g, 1.5);
        } else {
            tu_fill_uniform(rng, h->g, h->n_g, -2.0, 0.0);
            if (c->extreme)
                for (size_t i = 0; i < h->n_g; i++) {
                    const uint64_t r = tu_next(rng) % 16;
                    if (r == 0) h->g[i] = -1000.0f;
                    if (r == 1) h->g[i] = 0.0f;
                }
        }
    }
    if (c->gate && c->a_log) {
        h->A_log = tu_alloc((size_t)c->HV);
        tu_fill_uniform(rng, h->A_log, (size_t)c->HV, -1.0, 1.0);
    }
    if (c->gate && c->dt_bias) {
        h->dt_bias = tu_alloc((size_t)(c->HV * h->gK));
        tu_fill_normal(rng, h->dt_bias, (size_t)(c->HV * h->gK), 0.5);
    }
    if (c->h0) {
        h->h0 = tu_alloc(h->n_state);
        tu_fill_normal(rng, h->h0, h->n_state, 0.5);
    }
    if (bf16) { /* what the GPU reads; the CPU gets the same numbers */
        ct_round_bf16_array(h->q, h->n_qk);
        ct_round_bf16_array(h->k, h->n_qk);
        ct_round_bf16_array(h->v, h->n_v);
        ct_round_bf16_array(h->beta, h->n_beta);
        if (h->g) ct_round_bf16_array(h->g, h->n_g);
    }
}

static void free_inputs(host_data *h)
{
    free(h->q);
    free(h->k);
    free(h->v);
    free(h->beta);
    free(h->g);
    free(h->h0);
    free(h->A_log);
    free(h->dt_bias);
}

static linseq_kda_problem problem_of(const tcase *c, const host_data *h)
{
    linseq_kda_problem p = {0};
    p.B = c->B;
    p.T = c->T;
    p.H = c->H;
    p.HV = c->HV;
    p.K = c->K;
    p.V = c->V;
    p.cu_seqlens = c->cu;
    p.n_seqs = c->cu ? c->n_seqs : 0;
    p.q = h->q;
    p.k = h->k;
    p.v = h->v;
    p.beta = h->beta;
    p.g = h->g;
    p.h0 = h->h0;
    p.decay = c->decay;
    p.scale = c->scale;
    p.qk_l2norm = c->l2norm;
    p.beta_is_logit = c->logit;
    p.state_v_first = c->v_first;
    p.gate_in_kernel = c->gate;
    p.A_log = h->A_log;
    p.dt_bias = h->dt_bias;
    p.lower_bound = c->gate ? c->lower_bound : 0.0f;
    return p;
}

typedef struct {
    void *q, *k, *v, *beta, *g;
    float *h0, *A_log, *dt_bias;
    int64_t *cu;
} dev_data;

static void upload(const tcase *c, const host_data *h, int bf16, dev_data *d)
{
    d->q = ct_upload(h->q, h->n_qk, bf16);
    d->k = ct_upload(h->k, h->n_qk, bf16);
    d->v = ct_upload(h->v, h->n_v, bf16);
    d->beta = ct_upload(h->beta, h->n_beta, bf16);
    d->g = h->g ? ct_upload(h->g, h->n_g, bf16) : NULL;
    d->h0 = h->h0 ? ct_upload(h->h0, h->n_state, 0) : NULL;
    d->A_log = h->A_log ? ct_upload(h->A_log, (size_t)c->HV, 0) : NULL;
    d->dt_bias = h->dt_bias ? ct_upload(h->dt_bias, (size_t)(c->HV * h->gK), 0) : NULL;
    d->cu = c->cu ? ct_upload_i64(c->cu, (size_t)c->n_seqs + 1) : NULL;
}

static void free_dev(dev_data *d)
{
    ct_free(d->q);
    ct_free(d->k);
    ct_free(d->v);
    ct_free(d->beta);
    ct_free(d->g);
    ct_free(d->h0);
    ct_free(d->A_log);
    ct_free(d->dt_bias);
    ct_free(d->cu);
}

/* One GPU forward with poisoned outputs (in place: ht is a fresh copy of h0), results on the
 * host. */
static void gpu_forward(const tcase *c, const host_data *h, const dev_data *d, int bf16,
                        linseq_mode mode, int chunk, float *o, float *ht)
{
    linseq_kda_problem p = problem_of(c, h);
    p.q = d->q;
    p.k = d->k;
    p.v = d->v;
    p.beta = d->beta;
    p.g = d->g;
    p.A_log = d->A_log;
    p.dt_bias = d->dt_bias;
    p.cu_seqlens = d->cu;
    const size_t n_o = h->n_v;
    void *o_dev = ct_alloc_poisoned(n_o, bf16);
    float *h0_dev = NULL, *ht_dev;
    if (c->inplace) {
        h0_dev = ct_upload(h->h0, h->n_state, 0);
        ht_dev = h0_dev;
        p.h0 = h0_dev;
    } else {
        p.h0 = d->h0;
        ht_dev = ct_alloc_poisoned(h->n_state, 0);
    }
    const linseq_exec ex = ct_exec(mode, chunk, bf16);
    CHECK_OK(linseq_kda_forward(&p, &ex, o_dev, ht_dev));
    ct_download(o, o_dev, n_o, bf16);
    ct_download(ht, ht_dev, h->n_state, 0);
    ct_free(o_dev);
    ct_free(ht_dev);
}

static int n_cases;

static void check_case(const tcase *c, uint64_t seed)
{
    static const struct {
        linseq_mode mode;
        int chunk;
        const char *name;
    } modes[] = {{LINSEQ_MODE_RECURRENT, 0, "recurrent"},
                 {LINSEQ_MODE_CHUNKED, 16, "chunk16"},
                 {LINSEQ_MODE_CHUNKED, 32, "chunk32"},
                 {LINSEQ_MODE_CHUNKED, 64, "chunk64"},
                 {LINSEQ_MODE_CHUNKED, 128, "chunk128"}};
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        tu_rng rng = {seed};
        host_data h;
        make_inputs(c, &rng, bf16, &h);
        dev_data d;
        upload(c, &h, bf16, &d);
        const linseq_kda_problem p = problem_of(c, &h);
        float *o_cpu = tu_alloc(h.n_v), *ht_cpu = tu_alloc(h.n_state);
        float *o = tu_alloc(h.n_v), *ht = tu_alloc(h.n_state);
        float *o2 = tu_alloc(h.n_v), *ht2 = tu_alloc(h.n_state);
        float *o_rec = tu_alloc(h.n_v), *ht_rec = tu_alloc(h.n_state);
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            /* bf16 with chunk 64 runs the state products on tensor cores (see the header) */
            const bool mma = bf16 && modes[m].chunk == 64;
            const double tol_o = mma ? TOL_BF16_MMA : bf16 ? TOL_BF16 : TOL_F32;
            const double tol_h = mma ? TOL_BF16_MMA_STATE : TOL_F32;
            char what[400];
            describe(c, modes[m].name, bf16, what, sizeof what);
            ct_case("forward", what);
            linseq_exec cpu = {.mode = modes[m].mode, .chunk_size = modes[m].chunk};
            CHECK_OK(linseq_kda_forward(&p, &cpu, o_cpu, ht_cpu));
            gpu_forward(c, &h, &d, bf16, modes[m].mode, modes[m].chunk, o, ht);
            const double eo = tu_rel_err(o, o_cpu, h.n_v);
            const double eh = tu_rel_err(ht, ht_cpu, h.n_state);
            CHECK(eo <= tol_o, "%s: o err %.3g (tol %.1g)", what, eo, tol_o);
            CHECK(eh <= tol_h, "%s: ht err %.3g (tol %.1g)", what, eh, tol_h);
            if (mma) {
                note(&worst_mma_o, eo);
                note(&worst_mma_ht, eh);
            } else {
                note(bf16 ? &worst_bf16 : &worst_f32, eo);
                note(&worst_f32, eh);
            }
            /* a second run gives the same bits */
            gpu_forward(c, &h, &d, bf16, modes[m].mode, modes[m].chunk, o2, ht2);
            CHECK(tu_same_bits(o, o2, h.n_v) && tu_same_bits(ht, ht2, h.n_state),
                  "%s: two runs differ", what);
            if (m == 0) {
                memcpy(o_rec, o, h.n_v * sizeof(float));
                memcpy(ht_rec, ht, h.n_state * sizeof(float));
            } else if (!bf16) {
                const double e1 = tu_rel_err(o, o_rec, h.n_v);
                const double e2 = tu_rel_err(ht, ht_rec, h.n_state);
                CHECK(e1 <= TOL_MODES && e2 <= TOL_MODES,
                      "%s: chunked vs recurrent on the GPU: o %.3g, ht %.3g", what, e1, e2);
            }
        }
        free(o_cpu);
        free(ht_cpu);
        free(o);
        free(ht);
        free(o2);
        free(ht2);
        free(o_rec);
        free(ht_rec);
        free_dev(&d);
        free_inputs(&h);
        n_cases++;
    }
}

static tcase base_case(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V)
{
    tcase c = {0};
    c.B = B;
    c.T = T;
    c.H = H;
    c.HV = H;
    c.K = K;
    c.V = V;
    c.decay = LINSEQ_DECAY_PER_CHANNEL;
    c.l2norm = true;
    c.h0 = true;
    return c;
}

static void test_forward_shapes(void)
{
    static const int64_t dims[][2] = {{17, 33},   {33, 17},   {100, 100}, {64, 64},
                                      {128, 128}, {256, 256}, {1, 1}};
    static const int64_t lens[] = {1, 7, 63, 64, 65, 300};
    uint64_t seed = 11;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
            if (dims[d][0] >= 128 && lens[t] != 65 && lens[t] != 300) continue;
            tcase c = base_case(2, lens[t], 2, dims[d][0], dims[d][1]);
            c.decay = (linseq_decay)((d + t) % 3);
            check_case(&c, seed++);
        }
}

/* Enough (sequence, head) pairs that the tensor-core state kernel takes 64-column tiles
 * (>= 2 per SM on an H100/H200); the small cases above take its 32-column tiles. */
static void test_forward_wide(void)
{
    tcase c = base_case(8, 65, 36, 64, 64);
    check_case(&c, 601);
    c = base_case(4, 40, 36, 128, 128);
    c.decay = LINSEQ_DECAY_PER_HEAD;
    check_case(&c, 602);
}

static void test_forward_options(void)
{
    uint64_t seed = 101;
    for (int variant = 0; variant < 16; variant++) {
        tcase c = base_case(2, 70, 2, 33, 40);
        c.decay = variant % 2 ? LINSEQ_DECAY_PER_HEAD : LINSEQ_DECAY_PER_CHANNEL;
        c.l2norm = variant % 3 != 0;
        c.logit = variant % 4 >= 2;
        c.v_first = variant % 5 >= 3;
        c.h0 = variant % 7 != 0;
        c.inplace = c.h0 && variant % 3 == 1;
        c.scale = variant % 4 == 1 ? 0.7f : 0.0f;
        c.gate = variant >= 8;
        c.a_log = variant % 3 != 2;
        c.dt_bias = variant % 2 == 0 || variant >= 12;
        c.lower_bound = variant % 4 == 3 ? -5.0f : 0.0f;
        c.HV = variant % 3 == 0 ? 2 * c.H : (variant % 3 == 1 ? 3 * c.H : c.H);
        check_case(&c, seed++);
    }
    /* no decay, no h0 */
    tcase c = base_case(1, 65, 3, 17, 100);
    c.decay = LINSEQ_DECAY_NONE;
    c.h0 = false;
    check_case(&c, seed++);
}

/* g = -1000 per token and per channel: finite, exact (the CPU is exact there) */
static void test_extreme_decay(void)
{
    uint64_t seed = 201;
    for (int dk = 1; dk <= 2; dk++) {
        tcase c = base_case(2, 150, 2, 64, 64);
        c.decay = (linseq_decay)dk;
        c.extreme = true;
        check_case(&c, seed++);
    }
}

static void test_varlen(void)
{
    static const int64_t cu[] = {0, 5, 5, 70, 200, 263};
    tcase c = base_case(1, 263, 2, 33, 64);
    c.cu = cu;
    c.n_seqs = 5;
    c.HV = 4;
    check_case(&c, 301);
    c.v_first = true;
    c.inplace = true;
    c.decay = LINSEQ_DECAY_PER_HEAD;
    check_case(&c, 302);
}

/* ---------------------------------------------------------------------------------------- */
/* Decode                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void check_decode(int64_t B, int64_t H, int64_t HV, int64_t K, int64_t V, bool v_first,
                         bool use_rows, bool gate, linseq_decay decay, uint64_t seed)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        tcase c = base_case(B, 1, H, K, V);
        c.HV = HV;
        c.decay = decay;
        c.v_first = v_first;
        c.gate = gate && decay != LINSEQ_DECAY_NONE;
        c.a_log = c.dt_bias = c.gate;
        c.logit = gate;
        c.h0 = false;
        tu_rng rng = {seed};
        host_data h;
        make_inputs(&c, &rng, bf16, &h);
        const int64_t n_rows = B + 3;
        const size_t row_floats = (size_t)(HV * K * V), n_pool = (size_t)n_rows * row_floats;
        float *pool0 = tu_alloc(n_pool);
        tu_fill_normal(&rng, pool0, n_pool, 0.5);
        int64_t *rows = malloc((size_t)B * sizeof *rows);
        for (int64_t b = 0; b < B; b++) rows[b] = (n_rows - 1 - 2 * b) % n_rows; /* distinct */
        if (B > 2) rows[1] = -1;                                                 /* padding */
        if (B > 4) rows[4] = -7;

        linseq_kda_problem p = problem_of(&c, &h);
        float *pool_cpu = tu_alloc(n_pool), *o_cpu = tu_alloc(h.n_v);
        memcpy(pool_cpu, pool0, n_pool * sizeof(float));
        linseq_exec cpu = {0};
        CHECK_OK(linseq_kda_decode(&p, &cpu, pool_cpu, n_rows, use_rows ? rows : NULL, o_cpu));

        char what[200];
        snprintf(what, sizeof what,
                 "decode B%lld H%lld HV%lld K%lld V%lld vfirst%d rows%d gate%d decay%d %s",
                 (long long)B, (long long)H, (long long)HV, (long long)K, (long long)V, v_first,
                 use_rows, gate, (int)decay, bf16 ? "bf16" : "f32");
        ct_case("decode", what);
        dev_data d;
        upload(&c, &h, bf16, &d);
        int64_t *rows_dev = use_rows ? ct_upload_i64(rows, (size_t)B) : NULL;
        float *o = tu_alloc(h.n_v), *pool = tu_alloc(n_pool);
        float *o2 = tu_alloc(h.n_v), *pool2 = tu_alloc(n_pool);
        for (int run = 0; run < 2; run++) {
            linseq_kda_problem pd = p;
            pd.q = d.q;
            pd.k = d.k;
            pd.v = d.v;
            pd.beta = d.beta;
            pd.g = d.g;
            pd.A_log = d.A_log;
            pd.dt_bias = d.dt_bias;
            float *pool_dev = ct_upload(pool0, n_pool, 0);
            void *o_dev = ct_alloc_poisoned(h.n_v, bf16);
            const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
            CHECK_OK(linseq_kda_decode(&pd, &ex, pool_dev, n_rows, rows_dev, o_dev));
            ct_download(run ? o2 : o, o_dev, h.n_v, bf16);
            ct_download(run ? pool2 : pool, pool_dev, n_pool, 0);
            ct_free(pool_dev);
            ct_free(o_dev);
        }
        const double eo = tu_rel_err(o, o_cpu, h.n_v), ep = tu_rel_err(pool, pool_cpu, n_pool);
        CHECK(eo <= (bf16 ? TOL_BF16 : TOL_F32), "%s: o err %.3g", what, eo);
        CHECK(ep <= TOL_F32, "%s: state err %.3g", what, ep);
        CHECK(tu_same_bits(o, o2, h.n_v) && tu_same_bits(pool, pool2, n_pool),
              "%s: two runs differ", what);
        /* rows nobody names are untouched, padding requests have o == 0 */
        for (int64_t r = 0; r < n_rows; r++) {
            bool named = false;
            for (int64_t b = 0; b < B; b++)
                if ((use_rows ? rows[b] : b) == r) named = true;
            if (!named)
                CHECK(tu_same_bits(pool + r * row_floats, pool0 + r * row_floats, row_floats),
                      "%s: row %lld was not named but changed", what, (long long)r);
        }
        if (use_rows)
            for (int64_t b = 0; b < B; b++)
                if (rows[b] < 0)
                    for (int64_t i = 0; i < HV * V; i++)
                        CHECK(o[b * HV * V + i] == 0.0f, "%s: padding request %lld: o = %g", what,
                              (long long)b, (double)o[b * HV * V + i]);
        free(pool0);
        free(pool_cpu);
        free(o_cpu);
        free(o);
        free(pool);
        free(o2);
        free(pool2);
        free(rows);
        ct_free(rows_dev);
        free_dev(&d);
        free_inputs(&h);
        n_cases++;
    }
}

static void test_decode(void)
{
    uint64_t seed = 401;
    for (int v_first = 0; v_first <= 1; v_first++) {
        check_decode(6, 2, 4, 128, 128, v_first, true, true, LINSEQ_DECAY_PER_CHANNEL, seed++);
        check_decode(3, 1, 1, 17, 33, v_first, false, false, LINSEQ_DECAY_PER_HEAD, seed++);
        check_decode(5, 2, 2, 256, 100, v_first, true, false, LINSEQ_DECAY_PER_CHANNEL, seed++);
        check_decode(2, 3, 3, 64, 64, v_first, true, true, LINSEQ_DECAY_PER_HEAD, seed++);
        check_decode(4, 1, 2, 33, 256, v_first, false, false, LINSEQ_DECAY_NONE, seed++);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Standalone gate                                                                            */
/* ---------------------------------------------------------------------------------------- */

static void check_gate(int64_t B, int64_t T, int64_t H, int64_t K, linseq_decay decay, bool a_log,
                       bool bias, float lower_bound, uint64_t seed)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        tu_rng rng = {seed};
        const int64_t gK = decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
        const size_t n = (size_t)(B * T * H * gK), nb = (size_t)(H * gK);
        float *raw = tu_alloc(n), *dg = tu_alloc(n), *A = tu_alloc((size_t)H), *dtb = tu_alloc(nb);
        tu_fill_normal(&rng, raw, n, 3.0);
        for (size_t i = 0; i < n; i += 97) raw[i] = 25.0f; /* softplus's linear branch */
        tu_fill_normal(&rng, dg, n, 1.0);
        tu_fill_uniform(&rng, A, (size_t)H, -1.0, 1.5);
        tu_fill_normal(&rng, dtb, nb, 0.5);
        if (bf16) {
            ct_round_bf16_array(raw, n);
            ct_round_bf16_array(dg, n);
        }
        linseq_kda_gate_problem p = {.B = B,
                                     .T = T,
                                     .H = H,
                                     .K = K,
                                     .decay = decay,
                                     .g_raw = raw,
                                     .A_log = a_log ? A : NULL,
                                     .dt_bias = bias ? dtb : NULL,
                                     .lower_bound = lower_bound};
        float *g_cpu = tu_alloc(n), *draw_cpu = tu_alloc(n), *dA_cpu = tu_alloc((size_t)H);
        float *db_cpu = tu_alloc(nb);
        linseq_exec cpu = {0};
        CHECK_OK(linseq_kda_gate_forward(&p, &cpu, g_cpu));
        linseq_kda_gate_grads gc = {.dg_raw = draw_cpu, .dA_log = dA_cpu, .ddt_bias = db_cpu};
        CHECK_OK(linseq_kda_gate_backward(&p, &cpu, dg, &gc));

        char what[160];
        snprintf(what, sizeof what, "gate B%lld T%lld H%lld K%lld decay%d alog%d bias%d lb%g %s",
                 (long long)B, (long long)T, (long long)H, (long long)K, (int)decay, a_log, bias,
                 (double)lower_bound, bf16 ? "bf16" : "f32");
        ct_case("gate", what);
        void *raw_dev = ct_upload(raw, n, bf16), *dg_dev = ct_upload(dg, n, bf16);
        float *A_dev = ct_upload(A, (size_t)H, 0), *b_dev = ct_upload(dtb, nb, 0);
        linseq_kda_gate_problem pd = p;
        pd.g_raw = raw_dev;
        pd.A_log = a_log ? A_dev : NULL;
        pd.dt_bias = bias ? b_dev : NULL;
        const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
        float *g = tu_alloc(n), *draw = tu_alloc(n), *dA = tu_alloc((size_t)H), *db = tu_alloc(nb);
        float *draw2 = tu_alloc(n), *dA2 = tu_alloc((size_t)H), *db2 = tu_alloc(nb);
        void *g_dev = ct_alloc_poisoned(n, bf16);
        CHECK_OK(linseq_kda_gate_forward(&pd, &ex, g_dev));
        ct_download(g, g_dev, n, bf16);
        const double tol = bf16 ? TOL_BF16 : TOL_F32;
        const double eg = tu_rel_err(g, g_cpu, n);
        CHECK(eg <= tol, "%s: g err %.3g", what, eg);
        for (int run = 0; run < 2; run++) {
            void *draw_dev = ct_alloc_poisoned(n, bf16);
            float *dA_dev = ct_alloc_poisoned((size_t)H, 0), *db_dev = ct_alloc_poisoned(nb, 0);
            linseq_kda_gate_grads gd = {.dg_raw = draw_dev, .dA_log = dA_dev, .ddt_bias = db_dev};
            CHECK_OK(linseq_kda_gate_backward(&pd, &ex, dg_dev, &gd));
            ct_download(run ? draw2 : draw, draw_dev, n, bf16);
            ct_download(run ? dA2 : dA, dA_dev, (size_t)H, 0);
            ct_download(run ? db2 : db, db_dev, nb, 0);
            ct_free(draw_dev);
            ct_free(dA_dev);
            ct_free(db_dev);
        }
        const double e1 = tu_rel_err(draw, draw_cpu, n);
        const double e2 = tu_rel_err(dA, dA_cpu, (size_t)H), e3 = tu_rel_err(db, db_cpu, nb);
        CHECK(e1 <= tol, "%s: dg_raw err %.3g", what, e1);
        CHECK(e2 <= TOL_F32 && e3 <= TOL_F32, "%s: dA_log err %.3g, ddt_bias err %.3g", what, e2,
              e3);
        CHECK(tu_same_bits(draw, draw2, n) && tu_same_bits(dA, dA2, (size_t)H) &&
                  tu_same_bits(db, db2, nb),
              "%s: two backward runs differ", what);
        ct_free(g_dev);
        ct_free(raw_dev);
        ct_free(dg_dev);
        ct_free(A_dev);
        ct_free(b_dev);
        free(raw);
        free(dg);
        free(A);
        free(dtb);
        free(g_cpu);
        free(draw_cpu);
        free(dA_cpu);
        free(db_cpu);
        free(g);
        free(draw);
        free(dA);
        free(db);
        free(draw2);
        free(dA2);
        free(db2);
        n_cases++;
    }
}

static void test_gate(void)
{
    check_gate(2, 37, 3, 33, LINSEQ_DECAY_PER_CHANNEL, true, true, 0.0f, 501);
    check_gate(2, 37, 3, 33, LINSEQ_DECAY_PER_CHANNEL, true, true, -5.0f, 502);
    check_gate(1, 300, 2, 128, LINSEQ_DECAY_PER_CHANNEL, false, true, 0.0f, 503);
    check_gate(3, 600, 5, 0, LINSEQ_DECAY_PER_HEAD, true, false, 0.0f, 504);
    check_gate(1, 1, 1, 1, LINSEQ_DECAY_PER_CHANNEL, false, false, -1.0f, 505);
    check_gate(4, 200, 7, 0, LINSEQ_DECAY_PER_HEAD, true, true, -5.0f, 506);
}

int main(void)
{
    ct_require_device("test_kda_cuda");
    test_gate();
    test_decode();
    test_forward_options();
    test_extreme_decay();
    test_varlen();
    test_forward_shapes();
    test_forward_wide();
    printf("test_kda_cuda: %d cases; worst forward errors: f32 %.2g, bf16 (FFMA) o %.2g, "
           "bf16 (tensor cores) o %.2g ht %.2g\n",
           n_cases, worst_f32, worst_bf16, worst_mma_o, worst_mma_ht);
    return tu_finish("test_kda_cuda");
}
