/* The CUDA SSM1 scan (linseq_ssm1_forward / _backward on LINSEQ_DEVICE_CUDA) against the CPU
 * path of the same library on host copies of the same inputs: odd D and N, N from 1 to 150
 * (every states-per-thread variant and the slabs of states past 128 forward, 32 backward;
 * 4-state vector loads of B_proj/C_proj when N % 4 == 0),
 * T = 1 and T past several 64-token checkpoints, long sequences run whole and (with few
 * blocks) split into pieces, groups (one, several, a group per channel,
 * groups straddling the 32-channel tiles), varlen with an empty sequence, every gate
 * activation, D_skip, dt_softplus with and without dt_bias, h0 absent / given / updated in
 * place (hT == h0), d_hT absent or given, float32 and bf16; outputs poisoned before each
 * call, repeated runs bitwise identical, and an invalid argument on the device path.
 *
 * Tolerances, as max|gpu - cpu| / max|cpu| per output:
 *   - float32: 1e-5. Both sides evaluate the same recurrence in float32; they differ in the
 *     exp implementation (a few ulp), the order of the sums over n, over the channels of a
 *     group and over tokens (the device's partial sums), each a few ulp of the largest term.
 *     tests/test_ssm1.c holds the CPU path to 1e-5 of the float64 reference with measured
 *     errors below 1e-6, so 1e-5 leaves room while catching any wrong term.
 *   - bf16: the CPU is fed the bf16-rounded inputs (and d_y), so both sides compute with the
 *     same numbers in float32. The device then rounds each per-token output once to bf16;
 *     bf16 keeps 8 significant bits, so round to nearest even is off by at most 2^-8 of the
 *     element (unit roundoff), hence by at most 2^-8 max|cpu| = 3.9e-3 of the max, on top of
 *     the float32 differences (1e-5): checked at 4.5e-3. The float32 outputs (hT, dA, dD_skip,
 *     dh0, ddt_bias) are summed from unrounded float32 values and keep 1e-5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_testutil.h"

#define TOL_F32 1e-5
#define TOL_BF16 4.5e-3

typedef struct {
    int64_t B, T, D, N, G;
    bool gate, skip, h0, softplus, bias, dht, inplace;
    linseq_activation act;
    const int64_t *cu; /* varlen offsets (B == 1) or NULL */
    int64_t n_seqs;
} tcase;

/* Host inputs. */
typedef struct {
    float *x, *dt, *A, *Bp, *Cp, *Dk, *gate, *h0, *bias, *dy, *dhT;
    size_t n_y, n_state, n_proj, n_seqs;
} host_data;

enum { G_DX, G_DDT, G_DA, G_DB, G_DC, G_DD, G_DGATE, G_DH0, G_DDTB, N_GRADS };
static const char *grad_name[N_GRADS] = {"dx",      "ddt",   "dA",  "dB_proj", "dC_proj",
                                         "dD_skip", "dgate", "dh0", "ddt_bias"};
static const bool grad_per_token[N_GRADS] = {true,  true, false, true, true,
                                             false, true, false, false};

static void describe(const tcase *c, int bf16, char *buf, size_t n)
{
    snprintf(
        buf, n,
        "B%lld T%lld D%lld N%lld G%lld gate%d(act%d) skip%d h0%d%s sp%d bias%d dht%d seqs%lld %s",
        (long long)c->B, (long long)c->T, (long long)c->D, (long long)c->N, (long long)c->G,
        c->gate, (int)c->act, c->skip, c->h0, c->inplace ? "(in place)" : "", c->softplus, c->bias,
        c->dht, (long long)(c->cu ? c->n_seqs : 0), bf16 ? "bf16" : "f32");
}

/* Inputs in the ranges of Mamba checkpoints (as tests/test_ssm1.c): A in [-4,-0.1]; dt
 * log-uniform in [1e-3, 0.5], or with softplus a raw N(0,1) with 2% in [19,25] (across the
 * threshold 20) and dt_bias in [-6,-2]; x, B, C, gate, D_skip, d_y N(0,1); h0, d_hT N(0,0.5^2).
 * With bf16 the per-token tensors are rounded to what the device reads. */
static void make_data(host_data *h, const tcase *c, int bf16, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(h, 0, sizeof *h);
    const int64_t G = c->G ? c->G : 1;
    h->n_seqs = (size_t)(c->cu ? c->n_seqs : c->B);
    h->n_y = (size_t)(c->B * c->T * c->D);
    h->n_state = h->n_seqs * (size_t)(c->D * c->N);
    h->n_proj = (size_t)(c->B * c->T * G * c->N);
    h->x = tu_alloc(h->n_y);
    h->dt = tu_alloc(h->n_y);
    h->A = tu_alloc((size_t)(c->D * c->N));
    h->Bp = tu_alloc(h->n_proj);
    h->Cp = tu_alloc(h->n_proj);
    h->dy = tu_alloc(h->n_y);
    tu_fill_normal(&rng, h->x, h->n_y, 1.0);
    tu_fill_uniform(&rng, h->A, (size_t)(c->D * c->N), -4.0, -0.1);
    tu_fill_normal(&rng, h->Bp, h->n_proj, 1.0);
    tu_fill_normal(&rng, h->Cp, h->n_proj, 1.0);
    tu_fill_normal(&rng, h->dy, h->n_y, 1.0);
    for (size_t i = 0; i < h->n_y; i++) {
        if (c->softplus)
            h->dt[i] = tu_uniform(&rng, 0.0, 1.0) < 0.02 ? (float)tu_uniform(&rng, 19.0, 25.0)
                                                         : (float)tu_normal(&rng);
        else
            h->dt[i] = (float)exp(tu_uniform(&rng, log(1e-3), log(0.5)));
    }
    if (c->skip) {
        h->Dk = tu_alloc((size_t)c->D);
        tu_fill_normal(&rng, h->Dk, (size_t)c->D, 1.0);
    }
    if (c->gate) {
        h->gate = tu_alloc(h->n_y);
        tu_fill_normal(&rng, h->gate, h->n_y, 1.0);
    }
    if (c->h0) {
        h->h0 = tu_alloc(h->n_state);
        tu_fill_normal(&rng, h->h0, h->n_state, 0.5);
    }
    if (c->dht) {
        h->dhT = tu_alloc(h->n_state);
        tu_fill_normal(&rng, h->dhT, h->n_state, 0.5);
    }
    if (c->bias) {
        h->bias = tu_alloc((size_t)c->D);
        tu_fill_uniform(&rng, h->bias, (size_t)c->D, -6.0, -2.0);
    }
    if (bf16) {
        ct_round_bf16_array(h->x, h->n_y);
        ct_round_bf16_array(h->dt, h->n_y);
        ct_round_bf16_array(h->Bp, h->n_proj);
        ct_round_bf16_array(h->Cp, h->n_proj);
        ct_round_bf16_array(h->dy, h->n_y);
        if (h->gate) ct_round_bf16_array(h->gate, h->n_y);
    }
}

static void free_data(host_data *h)
{
    float *all[] = {h->x, h->dt, h->A, h->Bp, h->Cp, h->Dk, h->gate, h->h0, h->bias, h->dy, h->dhT};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static linseq_ssm1_problem host_problem(const tcase *c, const host_data *h)
{
    linseq_ssm1_problem p = {
        .B = c->B,
        .T = c->T,
        .D = c->D,
        .N = c->N,
        .G = c->G,
        .cu_seqlens = c->cu,
        .n_seqs = c->n_seqs,
        .x = h->x,
        .dt = h->dt,
        .A = h->A,
        .B_proj = h->Bp,
        .C_proj = h->Cp,
        .D_skip = h->Dk,
        .gate = h->gate,
        .h0 = h->h0,
        .dt_softplus = c->softplus,
        .dt_bias = h->bias,
        .gate_activation = c->act,
    };
    return p;
}

/* Device copies of every input; per-token tensors in bf16 with bf16. */
typedef struct {
    linseq_ssm1_problem p;
    void *ptr[10];
} dev_data;

static void upload(dev_data *d, const tcase *c, const host_data *h, int bf16)
{
    memset(d, 0, sizeof *d);
    d->p = host_problem(c, h);
    void **q = d->ptr;
    const size_t nt = h->n_y, np = h->n_proj, nd = (size_t)c->D;
    d->p.x = *q++ = ct_upload(h->x, nt, bf16);
    d->p.dt = *q++ = ct_upload(h->dt, nt, bf16);
    d->p.A = *q++ = ct_upload(h->A, (size_t)(c->D * c->N), 0);
    d->p.B_proj = *q++ = ct_upload(h->Bp, np, bf16);
    d->p.C_proj = *q++ = ct_upload(h->Cp, np, bf16);
    d->p.D_skip = h->Dk ? (*q++ = ct_upload(h->Dk, nd, 0)) : NULL;
    d->p.gate = h->gate ? (*q++ = ct_upload(h->gate, nt, bf16)) : NULL;
    d->p.h0 = h->h0 ? (*q++ = ct_upload(h->h0, h->n_state, 0)) : NULL;
    d->p.dt_bias = h->bias ? (*q++ = ct_upload(h->bias, nd, 0)) : NULL;
    d->p.cu_seqlens = c->cu ? (*q++ = ct_upload_i64(c->cu, (size_t)c->n_seqs + 1)) : NULL;
}

static void free_dev(dev_data *d)
{
    for (int i = 0; i < 10; i++) ct_free(d->ptr[i]);
}

static void compare(const char *label, const char *what, const float *got, const float *ref,
                    size_t n, double tol)
{
    const double e = tu_rel_err(got, ref, n);
    CHECK(e <= tol, "%s: %s max|gpu-cpu|/max|cpu| = %.3g > %.3g", label, what, e, tol);
}

static void test_forward(const tcase *c, int bf16, uint64_t seed)
{
    char label[256];
    describe(c, bf16, label, sizeof label);
    ct_case("forward", label);
    host_data h;
    make_data(&h, c, bf16, seed);
    const linseq_ssm1_problem hp = host_problem(c, &h);
    float *y_ref = tu_alloc(h.n_y), *hT_ref = tu_alloc(h.n_state);
    CHECK_OK(linseq_ssm1_forward(&hp, NULL, y_ref, hT_ref));

    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
    float *y = tu_alloc(h.n_y), *hT = tu_alloc(h.n_state);
    float *y2 = tu_alloc(h.n_y), *hT2 = tu_alloc(h.n_state);
    for (int run = 0; run < 2; run++) {
        dev_data d;
        upload(&d, c, &h, bf16);
        void *dy = ct_alloc_poisoned(h.n_y, bf16);
        float *dhT = c->inplace ? (float *)d.p.h0 : ct_alloc_poisoned(h.n_state, 0);
        CHECK_OK(linseq_ssm1_forward(&d.p, &ex, dy, dhT));
        ct_download(run ? y2 : y, dy, h.n_y, bf16);
        ct_download(run ? hT2 : hT, dhT, h.n_state, 0);
        ct_free(dy);
        if (!c->inplace) ct_free(dhT);
        free_dev(&d);
    }
    compare(label, "y", y, y_ref, h.n_y, bf16 ? TOL_BF16 : TOL_F32);
    compare(label, "hT", hT, hT_ref, h.n_state, TOL_F32);
    CHECK(tu_same_bits(y, y2, h.n_y) && tu_same_bits(hT, hT2, h.n_state),
          "%s: forward not bitwise identical on a second run", label);
    free(y_ref);
    free(hT_ref);
    free(y);
    free(hT);
    free(y2);
    free(hT2);
    free_data(&h);
}

static linseq_ssm1_grads as_grads(float *const *g)
{
    linseq_ssm1_grads r = {0};
    r.dx = g[G_DX];
    r.ddt = g[G_DDT];
    r.dA = g[G_DA];
    r.dB_proj = g[G_DB];
    r.dC_proj = g[G_DC];
    r.dD_skip = g[G_DD];
    r.dgate = g[G_DGATE];
    r.dh0 = g[G_DH0];
    r.ddt_bias = g[G_DDTB];
    return r;
}

/* partial: only dx, dC_proj and dh0 requested (the others' work is skipped). */
static void test_backward(const tcase *c, int bf16, bool partial, uint64_t seed)
{
    char label[256];
    describe(c, bf16, label, sizeof label);
    if (partial) strncat(label, " partial", sizeof label - strlen(label) - 1);
    ct_case("backward", label);
    host_data h;
    make_data(&h, c, bf16, seed);
    const linseq_ssm1_problem hp = host_problem(c, &h);
    size_t n[N_GRADS] = {0};
    n[G_DX] = n[G_DDT] = h.n_y;
    n[G_DA] = (size_t)(c->D * c->N);
    n[G_DB] = n[G_DC] = h.n_proj;
    n[G_DD] = c->skip ? (size_t)c->D : 0;
    n[G_DGATE] = c->gate ? h.n_y : 0;
    n[G_DH0] = h.n_state;
    n[G_DDTB] = c->softplus ? (size_t)c->D : 0;
    if (partial)
        for (int i = 0; i < N_GRADS; i++)
            if (i != G_DX && i != G_DC && i != G_DH0) n[i] = 0;

    float *ref[N_GRADS] = {0}, *got[2][N_GRADS] = {{0}};
    for (int i = 0; i < N_GRADS; i++) {
        if (!n[i]) continue;
        ref[i] = tu_alloc(n[i]);
        got[0][i] = tu_alloc(n[i]);
        got[1][i] = tu_alloc(n[i]);
    }
    const linseq_ssm1_grads rg = as_grads(ref);
    CHECK_OK(linseq_ssm1_backward(&hp, NULL, h.dy, h.dhT, &rg));

    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
    for (int run = 0; run < 2; run++) {
        dev_data d;
        upload(&d, c, &h, bf16);
        void *ddy = ct_upload(h.dy, h.n_y, bf16);
        void *ddhT = h.dhT ? ct_upload(h.dhT, h.n_state, 0) : NULL;
        float *dg[N_GRADS] = {0};
        for (int i = 0; i < N_GRADS; i++)
            if (n[i]) dg[i] = ct_alloc_poisoned(n[i], grad_per_token[i] ? bf16 : 0);
        const linseq_ssm1_grads g = as_grads(dg);
        CHECK_OK(linseq_ssm1_backward(&d.p, &ex, ddy, ddhT, &g));
        for (int i = 0; i < N_GRADS; i++) {
            if (!n[i]) continue;
            ct_download(got[run][i], dg[i], n[i], grad_per_token[i] ? bf16 : 0);
            ct_free(dg[i]);
        }
        ct_free(ddy);
        ct_free(ddhT);
        free_dev(&d);
    }
    for (int i = 0; i < N_GRADS; i++) {
        if (!n[i]) continue;
        compare(label, grad_name[i], got[0][i], ref[i], n[i],
                bf16 && grad_per_token[i] ? TOL_BF16 : TOL_F32);
        CHECK(tu_same_bits(got[0][i], got[1][i], n[i]),
              "%s: %s not bitwise identical on a second run", label, grad_name[i]);
        free(ref[i]);
        free(got[0][i]);
        free(got[1][i]);
    }
    free_data(&h);
}

/* A NULL y on the device path is reported (the validation runs before any device work). */
static void test_invalid(void)
{
    ct_case("invalid arguments", "on the device path");
    tcase c = {.B = 1, .T = 4, .D = 8, .N = 4};
    host_data h;
    make_data(&h, &c, 0, 7);
    dev_data d;
    upload(&d, &c, &h, 0);
    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, 0);
    CHECK(linseq_ssm1_forward(&d.p, &ex, NULL, NULL) == LINSEQ_ERR_NULL_POINTER,
          "device forward with y = NULL: expected LINSEQ_ERR_NULL_POINTER");
    void *y = ct_alloc_poisoned(h.n_y, 0);
    linseq_ssm1_grads g = {0};
    CHECK(linseq_ssm1_backward(&d.p, &ex, NULL, NULL, &g) == LINSEQ_ERR_NULL_POINTER,
          "device backward with d_y = NULL: expected LINSEQ_ERR_NULL_POINTER");
    d.p.G = 3; /* does not divide D = 8 */
    CHECK(linseq_ssm1_forward(&d.p, &ex, y, NULL) == LINSEQ_ERR_SHAPE_MISMATCH,
          "device forward with G not dividing D: expected LINSEQ_ERR_SHAPE_MISMATCH");
    ct_free(y);
    free_dev(&d);
    free_data(&h);
}

int main(void)
{
    ct_require_device("test_ssm1_cuda");
    static const int64_t cu3[] = {0, 20, 20, 50};
    static const int64_t cu4[] = {0, 1, 70, 70, 131};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const tcase cases[] = {
        /* the Mamba layer: gate silu, skip, softplus with bias */
        {.B = 2, .T = 37, .D = 45, .N = 7, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .dht = true},
        /* decode: T = 1, the state updated in place, groups */
        {.B = 3, .T = 1, .D = 33, .N = 16, .G = 3, .h0 = true, .inplace = true, .dht = true},
        /* varlen with an empty sequence, groups, sigmoid gate */
        {.B = 1, .T = 50, .D = 64, .N = 16, .G = 2, .gate = true, .act = LINSEQ_ACT_SIGMOID,
         .h0 = true, .cu = cu3, .n_seqs = 3},
        /* past several checkpoints; gelu; softplus without bias; no h0 */
        {.B = 3, .T = 130, .D = 96, .N = 5, .gate = true, .act = LINSEQ_ACT_GELU_TANH,
         .skip = true, .softplus = true, .dht = true},
        /* 8 states per thread forward, 2 slabs backward; groups of 5 channels straddle tiles */
        {.B = 2, .T = 70, .D = 20, .N = 40, .G = 4, .gate = true, .act = LINSEQ_ACT_RELU,
         .skip = true, .h0 = true, .dht = true},
        /* slabs forward (N > 128) and backward; identity gate */
        {.B = 1, .T = 9, .D = 12, .N = 150, .gate = true, .act = LINSEQ_ACT_IDENTITY,
         .h0 = true, .inplace = true, .softplus = true, .bias = true},
        /* a group per channel, N = 1 */
        {.B = 2, .T = 20, .D = 40, .N = 1, .G = 40, .skip = true, .softplus = true,
         .bias = true, .dht = true},
        /* Mamba widths, several tiles, varlen with a 1-token and an empty sequence */
        {.B = 1, .T = 131, .D = 256, .N = 16, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .dht = true, .cu = cu4, .n_seqs = 4},
        /* N = 33: 9 warps' worth of states forward (NB 8), 2 slabs backward */
        {.B = 2, .T = 66, .D = 35, .N = 33, .G = 5, .gate = true, .h0 = true},
        /* the Mamba layer's N = 16 with G = 1 (B_t, C_t staged in shared memory), 5 forward
         * chunks and 5 checkpoint segments, the last one partial */
        {.B = 2, .T = 257, .D = 96, .N = 16, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .dht = true},
        /* enough blocks (8 x 33 tiles) that long sequences run whole, not in pieces */
        {.B = 8, .T = 130, .D = 1056, .N = 16, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .dht = true},
        /* N % 4 == 0: B_proj/C_proj read 4 states at a time; N = 36 leaves the last warp
         * half its 8 states (forward) */
        {.B = 2, .T = 40, .D = 36, .N = 36, .G = 3, .gate = true, .skip = true, .h0 = true,
         .softplus = true, .bias = true, .dht = true},
    };
    /* clang-format on */
    const size_t n_cases = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n_cases; i++) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            test_forward(&cases[i], bf16, 100 + i);
            test_backward(&cases[i], bf16, false, 200 + i);
        }
        test_backward(&cases[i], 0, true, 300 + i);
    }
    test_invalid();
    return tu_finish("test_ssm1_cuda");
}
