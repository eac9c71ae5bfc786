/* The CUDA KDA backward (linseq_kda_backward on LINSEQ_DEVICE_CUDA) against the CPU path of
 * the same library on host copies of the same inputs: random shapes (odd K and V, K = V =
 * 128, K beyond the register path), T = 1 .. 300, chunk sizes 16/32/64/128 and recurrent
 * mode, every option (decay none / per head / per channel, l2norm, beta logits, V-first
 * states, the in-kernel gate with both forms, GVA, varlen with empty sequences, h0 and d_ht
 * present or not, some gradients not requested), float32 and bf16, outputs poisoned before
 * the call, repeated runs bitwise identical, and log decays of -1000 staying finite.
 *
 * Tolerances, as max|gpu - cpu| / max|cpu| per gradient:
 *   - float32, recurrent mode: 1e-5. Both sides run the same token-by-token formulas in
 *     float32 and differ only in summation order.
 *   - float32, chunked mode: the device runs the same token-recurrent form (see
 *     src/cuda/kda_backward.cu), so it is held to 1e-5 against the CPU's recurrent mode, and
 *     to 4e-5 against the CPU's chunked mode: tests/test_kda_grad.c bounds each of the CPU's
 *     modes by 2e-5 against the float64 reference, so two float32 algorithms differ by at
 *     most the sum.
 *   - dA_log and ddt_bias (sums over every token, which cancel): 1e-4 against the same mode,
 *     2e-4 across modes (tests/test_kda_grad.c's TOL_GRAD_SUMMED = 1e-4 per side).
 *   - bf16: the CPU is fed the bf16-rounded inputs, so both sides see the same numbers; the
 *     device rounds each per-token gradient once to bf16 (8 significant bits, round to
 *     nearest even: relative error <= 2^-8 of the element, hence <= 2^-8 max|ref|), on top
 *     of the float32 bound: 2^-8 (1 + 4e-5) + 4e-5 < 4e-3, checked at 4e-3 (measured up to
 *     3.5e-3). The float32 gradients (dh0, dA_log, ddt_bias) keep the float32 bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_testutil.h"

typedef struct {
    int64_t B, T, H, HV, K, V;
    linseq_decay decay;
    bool l2, logit, v_first, gate, h0, dht, extreme;
    float lower_bound, scale;
    int64_t n_seqs; /* > 0: varlen (B = 1), offsets in cu */
    const int64_t *cu;
    linseq_mode mode; /* LINSEQ_MODE_RECURRENT or LINSEQ_MODE_CHUNKED */
    int chunk;
    int bf16;
    bool partial; /* only dv, dg and dh0 requested */
    uint64_t seed;
} tcase;

enum { G_DQ, G_DK, G_DV, G_DBETA, G_DG, G_DH0, G_DALOG, G_DDTB, N_GRADS };
static const char *grad_name[N_GRADS] = {"dq", "dk",  "dv",     "dbeta",
                                         "dg", "dh0", "dA_log", "ddt_bias"};
/* per-token tensors (bf16 on the device with bf16) */
static const bool grad_per_token[N_GRADS] = {true, true, true, true, true, false, false, false};

typedef struct {
    float *g[N_GRADS];
    size_t n[N_GRADS];
} host_grads;

static linseq_kda_grads as_grads(float *const *g)
{
    linseq_kda_grads r = {0};
    r.dq = g[G_DQ];
    r.dk = g[G_DK];
    r.dv = g[G_DV];
    r.dbeta = g[G_DBETA];
    r.dg = g[G_DG];
    r.dh0 = g[G_DH0];
    r.dA_log = g[G_DALOG];
    r.ddt_bias = g[G_DDTB];
    return r;
}

static void describe(const tcase *c, char *buf, size_t n)
{
    snprintf(buf, n,
             "B%lld T%lld H%lld HV%lld K%lld V%lld decay%d l2%d logit%d vfirst%d gate%d lb%g h0%d "
             "dht%d ext%d seqs%lld %s%d %s%s",
             (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->HV, (long long)c->K,
             (long long)c->V, (int)c->decay, c->l2, c->logit, c->v_first, c->gate,
             (double)c->lower_bound, c->h0, c->dht, c->extreme, (long long)c->n_seqs,
             c->mode == LINSEQ_MODE_RECURRENT ? "rec" : "chunk", c->chunk, c->bf16 ? "bf16" : "f32",
             c->partial ? " partial" : "");
}

static double worst[2][N_GRADS]; /* [bf16][grad]: the largest error seen, for the summary */

static void run_case(const tcase *c)
{
    char what[256];
    describe(c, what, sizeof what);
    ct_case("backward", what);
    tu_rng r = {c->seed};
    const int64_t B = c->B, T = c->T, H = c->H, HV = c->HV, K = c->K, V = c->V;
    const int64_t BT = B * T, rows = c->n_seqs ? c->n_seqs : B;
    const int64_t gK = c->decay == LINSEQ_DECAY_PER_CHANNEL ? K : 1;
    const bool decay = c->decay != LINSEQ_DECAY_NONE, gate = decay && c->gate;
    const size_t n_qk = (size_t)(BT * H * K), n_v = (size_t)(BT * HV * V);
    const size_t n_beta = (size_t)(BT * HV), n_g = decay ? (size_t)(BT * HV * gK) : 0;
    const size_t n_state = (size_t)(rows * HV * K * V);

    float *q = tu_alloc(n_qk), *k = tu_alloc(n_qk), *v = tu_alloc(n_v), *beta = tu_alloc(n_beta);
    float *g = n_g ? tu_alloc(n_g) : NULL, *h0 = c->h0 ? tu_alloc(n_state) : NULL;
    float *d_o = tu_alloc(n_v), *d_ht = c->dht ? tu_alloc(n_state) : NULL;
    float *A_log = gate ? tu_alloc((size_t)HV) : NULL,
          *dt_bias = gate ? tu_alloc((size_t)(HV * gK)) : NULL;
    tu_fill_normal(&r, q, n_qk, 1.0);
    tu_fill_normal(&r, k, n_qk, 1.0);
    if (!c->l2) /* unnormalised keys with |k| in U(0.6, 1.2): beta |k|^2 < 2 keeps it stable */
        for (size_t row = 0; row < n_qk / (size_t)K; row++) {
            double nn = 0.0;
            for (int64_t i = 0; i < K; i++) nn += (double)k[row * K + i] * k[row * K + i];
            const double want = tu_uniform(&r, 0.6, 1.2) / sqrt(nn + 1e-30);
            for (int64_t i = 0; i < K; i++) k[row * K + i] = (float)(k[row * K + i] * want);
        }
    tu_fill_normal(&r, v, n_v, 1.0);
    if (c->logit)
        tu_fill_normal(&r, beta, n_beta, 1.5);
    else
        tu_fill_uniform(&r, beta, n_beta, 0.05, 0.95);
    for (size_t i = 0; i < n_g; i++) {
        if (gate) {
            g[i] = (float)tu_normal(&r);
        } else {
            g[i] = (float)(-0.3 * tu_uniform(&r, 0.0, 2.0));
            if (c->extreme && tu_uniform(&r, 0.0, 1.0) < 0.1) g[i] = -1000.0f;
        }
    }
    if (gate) {
        tu_fill_uniform(&r, A_log, (size_t)HV, -1.0, 0.5);
        tu_fill_normal(&r, dt_bias, (size_t)(HV * gK), 0.5);
    }
    if (h0) tu_fill_normal(&r, h0, n_state, 0.5);
    tu_fill_normal(&r, d_o, n_v, 1.0);
    if (d_ht) tu_fill_normal(&r, d_ht, n_state, 1.0);
    if (c->bf16) { /* what the device reads; the CPU gets the same numbers */
        ct_round_bf16_array(q, n_qk);
        ct_round_bf16_array(k, n_qk);
        ct_round_bf16_array(v, n_v);
        ct_round_bf16_array(beta, n_beta);
        if (g) ct_round_bf16_array(g, n_g);
        ct_round_bf16_array(d_o, n_v);
    }

    linseq_kda_problem p = {0};
    p.B = B;
    p.T = T;
    p.H = H;
    p.HV = HV;
    p.K = K;
    p.V = V;
    p.cu_seqlens = c->n_seqs ? c->cu : NULL;
    p.n_seqs = c->n_seqs;
    p.q = q;
    p.k = k;
    p.v = v;
    p.beta = beta;
    p.g = g;
    p.h0 = h0;
    p.decay = c->decay;
    p.scale = c->scale;
    p.qk_l2norm = c->l2;
    p.beta_is_logit = c->logit;
    p.state_v_first = c->v_first;
    p.gate_in_kernel = gate;
    p.A_log = A_log;
    p.dt_bias = dt_bias;
    p.lower_bound = gate ? c->lower_bound : 0.0f;

    size_t n[N_GRADS] = {
        n_qk, n_qk, n_v, n_beta, n_g, n_state, gate ? (size_t)HV : 0, gate ? (size_t)(HV * gK) : 0};
    bool want[N_GRADS];
    for (int i = 0; i < N_GRADS; i++) want[i] = n[i] > 0;
    if (c->partial) want[G_DQ] = want[G_DK] = want[G_DBETA] = want[G_DALOG] = false;

    /* the CPU in the same mode, and in recurrent mode (the device's algorithm) */
    float *ref[2][N_GRADS] = {{0}};
    const int n_ref = c->mode == LINSEQ_MODE_CHUNKED ? 2 : 1;
    for (int m = 0; m < n_ref; m++) {
        for (int i = 0; i < N_GRADS; i++) ref[m][i] = want[i] ? tu_alloc_poisoned(n[i]) : NULL;
        linseq_exec cpu = {0};
        cpu.mode = m == 0 ? c->mode : LINSEQ_MODE_RECURRENT;
        cpu.chunk_size = c->chunk;
        const linseq_kda_grads gr = as_grads(ref[m]);
        CHECK_OK(linseq_kda_backward(&p, &cpu, d_o, d_ht, &gr));
    }

    /* the device, twice */
    linseq_kda_problem dp = p;
    void *dq_ = ct_upload(q, n_qk, c->bf16), *dk_ = ct_upload(k, n_qk, c->bf16);
    void *dv_ = ct_upload(v, n_v, c->bf16), *db_ = ct_upload(beta, n_beta, c->bf16);
    void *dg_ = g ? ct_upload(g, n_g, c->bf16) : NULL;
    void *dh0_ = h0 ? ct_upload(h0, n_state, 0) : NULL;
    void *ddo = ct_upload(d_o, n_v, c->bf16), *ddht = d_ht ? ct_upload(d_ht, n_state, 0) : NULL;
    void *dal = A_log ? ct_upload(A_log, (size_t)HV, 0) : NULL;
    void *ddtb = dt_bias ? ct_upload(dt_bias, (size_t)(HV * gK), 0) : NULL;
    void *dcu = c->n_seqs ? ct_upload_i64(c->cu, (size_t)c->n_seqs + 1) : NULL;
    dp.q = dq_;
    dp.k = dk_;
    dp.v = dv_;
    dp.beta = db_;
    dp.g = dg_;
    dp.h0 = dh0_;
    dp.A_log = dal;
    dp.dt_bias = ddtb;
    dp.cu_seqlens = dcu;
    const linseq_exec ex = ct_exec(c->mode, c->chunk, c->bf16);
    float *out[2][N_GRADS] = {{0}};
    float *dev[2][N_GRADS] = {{0}};
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < N_GRADS; i++)
            dev[run][i] =
                want[i] ? (float *)ct_alloc_poisoned(n[i], c->bf16 && grad_per_token[i]) : NULL;
        const linseq_kda_grads gr = as_grads(dev[run]);
        CHECK_OK(linseq_kda_backward(&dp, &ex, ddo, ddht, &gr));
        for (int i = 0; i < N_GRADS; i++) {
            if (!want[i]) continue;
            out[run][i] = tu_alloc(n[i]);
            ct_download(out[run][i], dev[run][i], n[i], c->bf16 && grad_per_token[i]);
        }
    }

    for (int i = 0; i < N_GRADS; i++) {
        if (!want[i]) continue;
        const bool summed = i == G_DALOG || i == G_DDTB;
        const bool rounded = c->bf16 && grad_per_token[i]; /* stored as bf16 */
        for (int m = 0; m < n_ref; m++) {
            /* m == 0: the CPU's same mode; m == 1: its recurrent mode (chunked cases only) */
            const bool same_algorithm = c->mode == LINSEQ_MODE_RECURRENT || m == 1;
            double tol = summed ? (same_algorithm ? 1e-4 : 2e-4) : (same_algorithm ? 1e-5 : 4e-5);
            if (rounded) tol = 4e-3;
            const double e = tu_rel_err(out[0][i], ref[m][i], n[i]);
            if (m == 0 && e > worst[c->bf16][i]) worst[c->bf16][i] = e;
            CHECK(e <= tol, "%s: %s vs CPU %s: err %.3g (tol %.2g)", what, grad_name[i],
                  m == 0 ? "same mode" : "recurrent", e, tol);
        }
        bool finite = true;
        for (size_t j = 0; j < n[i]; j++) finite = finite && isfinite(out[0][i][j]);
        CHECK(finite, "%s: %s has a non-finite value", what, grad_name[i]);
        CHECK(tu_same_bits(out[0][i], out[1][i], n[i]), "%s: %s differs between two runs", what,
              grad_name[i]);
    }

    for (int run = 0; run < 2; run++)
        for (int i = 0; i < N_GRADS; i++) {
            ct_free(dev[run][i]);
            free(out[run][i]);
        }
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < N_GRADS; i++) free(ref[m][i]);
    ct_free(dq_), ct_free(dk_), ct_free(dv_), ct_free(db_), ct_free(dg_), ct_free(dh0_);
    ct_free(ddo), ct_free(ddht), ct_free(dal), ct_free(ddtb), ct_free(dcu);
    free(q), free(k), free(v), free(beta), free(g), free(h0), free(d_o), free(d_ht);
    free(A_log), free(dt_bias);
}

static const int64_t cu_a[] = {0, 0, 7, 7, 71, 300};     /* empty first and middle sequences */
static const int64_t cu_b[] = {0, 65, 65, 66, 130, 130}; /* empty last sequence */

static tcase base(int64_t T, int64_t K, int64_t V, linseq_mode mode, int chunk, uint64_t seed)
{
    tcase c = {0};
    c.B = 2;
    c.T = T;
    c.H = 2;
    c.HV = 2;
    c.K = K;
    c.V = V;
    c.decay = LINSEQ_DECAY_PER_CHANNEL;
    c.l2 = true;
    c.h0 = true;
    c.dht = true;
    c.mode = mode;
    c.chunk = chunk;
    c.seed = seed;
    return c;
}

int main(void)
{
    ct_require_device("test_kda_backward_cuda");
    static const int chunks[] = {16, 32, 64, 128};
    static const int64_t Ts[] = {1, 7, 64, 65, 300};
    static const int64_t KVs[][2] = {{17, 33}, {33, 100}, {100, 17}, {128, 128}};
    uint64_t seed = 1000;

    for (int bf16 = 0; bf16 < 2; bf16++) {
        /* shapes x modes, per-channel decay with l2norm */
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (size_t si = 0; si < sizeof KVs / sizeof KVs[0]; si++) {
                const int mi = (int)((ti + si) % 5); /* recurrent, then the four chunk sizes */
                tcase c = base(Ts[ti], KVs[si][0], KVs[si][1],
                               mi == 0 ? LINSEQ_MODE_RECURRENT : LINSEQ_MODE_CHUNKED,
                               mi == 0 ? 0 : chunks[mi - 1], seed++);
                c.bf16 = bf16;
                run_case(&c);
            }
        /* every option, on a middle shape, in every mode */
        for (int mi = 0; mi < 5; mi++) {
            const linseq_mode mode = mi == 0 ? LINSEQ_MODE_RECURRENT : LINSEQ_MODE_CHUNKED;
            const int chunk = mi == 0 ? 0 : chunks[mi - 1];
            for (int opt = 0; opt < 10; opt++) {
                tcase c = base(65 + 40 * (opt % 3), 33, 40, mode, chunk, seed++);
                c.bf16 = bf16;
                switch (opt) {
                case 0:
                    c.decay = LINSEQ_DECAY_NONE;
                    c.l2 = false;
                    break;
                case 1:
                    c.decay = LINSEQ_DECAY_PER_HEAD;
                    c.logit = true;
                    break;
                case 2:
                    c.gate = true;
                    c.v_first = true;
                    break;
                case 3:
                    c.gate = true;
                    c.lower_bound = -5.0f;
                    c.decay = LINSEQ_DECAY_PER_HEAD;
                    break;
                case 4:
                    c.H = 2;
                    c.HV = 6;
                    c.scale = 0.7f;
                    c.h0 = false;
                    break; /* GVA, dh0 at 0 */
                case 5:
                    c.dht = false;
                    c.extreme = true;
                    break; /* g = -1000 */
                case 6:
                    c.B = 1;
                    c.T = 300;
                    c.n_seqs = 5;
                    c.cu = cu_a;
                    c.gate = true;
                    break;
                case 7:
                    c.B = 1;
                    c.T = 130;
                    c.n_seqs = 5;
                    c.cu = cu_b;
                    c.HV = 4;
                    c.v_first = true;
                    break;
                case 8:
                    c.partial = true;
                    c.gate = true;
                    c.logit = true;
                    break;
                case 9:
                    c.decay = LINSEQ_DECAY_PER_HEAD;
                    c.extreme = true;
                    c.l2 = false;
                    c.HV = 4;
                    break;
                }
                run_case(&c);
            }
        }
        /* K beyond the register rows (the walk's global-scratch path), and K = 256 */
        {
            tcase c = base(70, 300, 40, LINSEQ_MODE_RECURRENT, 0, seed++);
            c.bf16 = bf16;
            run_case(&c);
            c = base(70, 256, 64, LINSEQ_MODE_CHUNKED, 64, seed++);
            c.bf16 = bf16;
            c.gate = true;
            run_case(&c);
        }
    }
    for (int b = 0; b < 2; b++) {
        printf("  %s worst error vs the CPU's same mode:", b ? "bf16" : "f32 ");
        for (int i = 0; i < N_GRADS; i++) printf(" %s %.2g", grad_name[i], worst[b][i]);
        printf("\n");
    }
    return tu_finish("test_kda_backward_cuda");
}
