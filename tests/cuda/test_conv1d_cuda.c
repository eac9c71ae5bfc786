/* The CUDA causal conv1d (linseq_conv1d_forward / _backward on LINSEQ_DEVICE_CUDA) against the
 * CPU path of the same library on host copies of the same inputs: W = 1, 2, 3, 4 (the register
 * window kernels) and 5, 19 (the generic loop; 19 makes a chunk longer than 16 tokens), D a
 * multiple of 4 (16-byte accesses) and odd, T = 1, T < W - 1, varlen with empty sequences,
 * conv_state absent / given / advanced in place (conv_state_out == conv_state), every
 * activation, bias or none, d_conv_state_out absent or given, some gradients not requested,
 * float32 and bf16; outputs poisoned before each call, repeated runs bitwise identical, and
 * an invalid argument on the device path.
 *
 * Tolerances, as max|gpu - cpu| / max|cpu| per output:
 *   - float32: 1e-5. Both sides compute the same W-term sums in float32 (the device with one
 *     fma per tap, in tap order) and differ only in summation order and in the float32
 *     activation functions (a few ulp); dweight and dbias are sums over every token, added in
 *     a different order on each side: each a few ulp of the largest partial sum.
 *   - bf16: the CPU is fed the bf16-rounded x and d_y, so both sides compute with the same
 *     numbers; the device rounds y and dx once to bf16 (8 significant bits: at most 2^-8 of
 *     the element, so at most 2^-8 max|cpu| = 3.9e-3), on top of the float32 differences:
 *     checked at 4.5e-3. conv_state_out (copies of inputs, exact), dweight, dbias and
 *     dconv_state are float32 and keep 1e-5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_testutil.h"

#define TOL_F32 1e-5
#define TOL_BF16 4.5e-3

typedef struct {
    int64_t B, T, D, W;
    bool bias, state, inplace, dso;
    linseq_activation act;
    const int64_t *cu;
    int64_t n_seqs;
} tcase;

typedef struct {
    float *x, *w, *bias, *state, *dy, *dso;
    size_t n_y, n_w, n_state, n_seqs;
} host_data;

static void describe(const tcase *c, int bf16, char *buf, size_t n)
{
    snprintf(buf, n, "B%lld T%lld D%lld W%lld bias%d state%d%s dso%d act%d seqs%lld %s",
             (long long)c->B, (long long)c->T, (long long)c->D, (long long)c->W, c->bias, c->state,
             c->inplace ? "(in place)" : "", c->dso, (int)c->act,
             (long long)(c->cu ? c->n_seqs : 0), bf16 ? "bf16" : "f32");
}

/* x, bias, conv_state, d_y, d_conv_state_out N(0,1), weight N(0,0.5^2) (as the reference
 * data); x and d_y rounded to bf16 with bf16. */
static void make_data(host_data *h, const tcase *c, int bf16, uint64_t seed)
{
    tu_rng rng = {seed};
    memset(h, 0, sizeof *h);
    h->n_seqs = (size_t)(c->cu ? c->n_seqs : c->B);
    h->n_y = (size_t)(c->B * c->T * c->D);
    h->n_w = (size_t)(c->D * c->W);
    h->n_state = h->n_seqs * (size_t)(c->D * (c->W - 1));
    h->x = tu_alloc(h->n_y);
    h->w = tu_alloc(h->n_w);
    h->dy = tu_alloc(h->n_y);
    tu_fill_normal(&rng, h->x, h->n_y, 1.0);
    tu_fill_normal(&rng, h->w, h->n_w, 0.5);
    tu_fill_normal(&rng, h->dy, h->n_y, 1.0);
    if (c->bias) {
        h->bias = tu_alloc((size_t)c->D);
        tu_fill_normal(&rng, h->bias, (size_t)c->D, 1.0);
    }
    if (c->state && c->W > 1) {
        h->state = tu_alloc(h->n_state);
        tu_fill_normal(&rng, h->state, h->n_state, 1.0);
    }
    if (c->dso && c->W > 1) {
        h->dso = tu_alloc(h->n_state);
        tu_fill_normal(&rng, h->dso, h->n_state, 1.0);
    }
    if (bf16) {
        ct_round_bf16_array(h->x, h->n_y);
        ct_round_bf16_array(h->dy, h->n_y);
    }
}

static void free_data(host_data *h)
{
    free(h->x);
    free(h->w);
    free(h->bias);
    free(h->state);
    free(h->dy);
    free(h->dso);
}

static linseq_conv1d_problem host_problem(const tcase *c, const host_data *h)
{
    linseq_conv1d_problem p = {
        .B = c->B,
        .T = c->T,
        .D = c->D,
        .W = c->W,
        .cu_seqlens = c->cu,
        .n_seqs = c->n_seqs,
        .x = h->x,
        .weight = h->w,
        .bias = h->bias,
        .conv_state = h->state,
        .activation = c->act,
    };
    return p;
}

typedef struct {
    linseq_conv1d_problem p;
    void *ptr[5];
} dev_data;

static void upload(dev_data *d, const tcase *c, const host_data *h, int bf16)
{
    memset(d, 0, sizeof *d);
    d->p = host_problem(c, h);
    d->p.x = d->ptr[0] = ct_upload(h->x, h->n_y, bf16);
    d->p.weight = d->ptr[1] = ct_upload(h->w, h->n_w, 0);
    d->p.bias = h->bias ? (d->ptr[2] = ct_upload(h->bias, (size_t)c->D, 0)) : NULL;
    d->p.conv_state = h->state ? (d->ptr[3] = ct_upload(h->state, h->n_state, 0)) : NULL;
    d->p.cu_seqlens = c->cu ? (d->ptr[4] = ct_upload_i64(c->cu, (size_t)c->n_seqs + 1)) : NULL;
}

static void free_dev(dev_data *d)
{
    for (int i = 0; i < 5; i++) ct_free(d->ptr[i]);
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
    const linseq_conv1d_problem hp = host_problem(c, &h);
    const bool want_state = c->W > 1 && (c->inplace ? h.state != NULL : true);
    float *y_ref = tu_alloc(h.n_y), *s_ref = tu_alloc(h.n_state + 1);
    CHECK_OK(linseq_conv1d_forward(&hp, NULL, y_ref, want_state ? s_ref : NULL));

    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
    float *y[2] = {tu_alloc(h.n_y), tu_alloc(h.n_y)};
    float *s[2] = {tu_alloc(h.n_state + 1), tu_alloc(h.n_state + 1)};
    for (int run = 0; run < 2; run++) {
        dev_data d;
        upload(&d, c, &h, bf16);
        void *dy = ct_alloc_poisoned(h.n_y, bf16);
        float *ds = NULL;
        if (want_state) ds = c->inplace ? (float *)d.p.conv_state : ct_alloc_poisoned(h.n_state, 0);
        CHECK_OK(linseq_conv1d_forward(&d.p, &ex, dy, ds));
        ct_download(y[run], dy, h.n_y, bf16);
        if (want_state) ct_download(s[run], ds, h.n_state, 0);
        ct_free(dy);
        if (want_state && !c->inplace) ct_free(ds);
        free_dev(&d);
    }
    compare(label, "y", y[0], y_ref, h.n_y, bf16 ? TOL_BF16 : TOL_F32);
    CHECK(tu_same_bits(y[0], y[1], h.n_y), "%s: y not bitwise identical on a second run", label);
    if (want_state) {
        /* conv_state_out is a copy of inputs (the device reads bf16-rounded x with bf16, as
         * the CPU was given): exact */
        CHECK(tu_same_bits(s[0], s_ref, h.n_state), "%s: conv_state_out differs", label);
        CHECK(tu_same_bits(s[0], s[1], h.n_state),
              "%s: conv_state_out not bitwise identical on a second run", label);
    }
    free(y_ref);
    free(s_ref);
    for (int i = 0; i < 2; i++) {
        free(y[i]);
        free(s[i]);
    }
    free_data(&h);
}

enum { G_DX, G_DW, G_DB, G_DS, N_GRADS };
static const char *grad_name[N_GRADS] = {"dx", "dweight", "dbias", "dconv_state"};

static linseq_conv1d_grads as_grads(float *const *g)
{
    linseq_conv1d_grads r = {g[G_DX], g[G_DW], g[G_DB], g[G_DS]};
    return r;
}

/* partial: only dweight and dconv_state requested. */
static void test_backward(const tcase *c, int bf16, bool partial, uint64_t seed)
{
    char label[256];
    describe(c, bf16, label, sizeof label);
    if (partial) strncat(label, " partial", sizeof label - strlen(label) - 1);
    ct_case("backward", label);
    host_data h;
    make_data(&h, c, bf16, seed);
    const linseq_conv1d_problem hp = host_problem(c, &h);
    size_t n[N_GRADS] = {h.n_y, h.n_w, c->bias ? (size_t)c->D : 0, c->W > 1 ? h.n_state : 0};
    if (partial) n[G_DX] = n[G_DB] = 0;

    float *ref[N_GRADS] = {0}, *got[2][N_GRADS] = {{0}};
    for (int i = 0; i < N_GRADS; i++) {
        if (!n[i]) continue;
        ref[i] = tu_alloc(n[i]);
        got[0][i] = tu_alloc(n[i]);
        got[1][i] = tu_alloc(n[i]);
    }
    const linseq_conv1d_grads rg = as_grads(ref);
    CHECK_OK(linseq_conv1d_backward(&hp, NULL, h.dy, h.dso, &rg));

    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, bf16);
    for (int run = 0; run < 2; run++) {
        dev_data d;
        upload(&d, c, &h, bf16);
        void *ddy = ct_upload(h.dy, h.n_y, bf16);
        void *ddso = h.dso ? ct_upload(h.dso, h.n_state, 0) : NULL;
        float *dg[N_GRADS] = {0};
        for (int i = 0; i < N_GRADS; i++)
            if (n[i]) dg[i] = ct_alloc_poisoned(n[i], i == G_DX ? bf16 : 0);
        const linseq_conv1d_grads g = as_grads(dg);
        CHECK_OK(linseq_conv1d_backward(&d.p, &ex, ddy, ddso, &g));
        for (int i = 0; i < N_GRADS; i++) {
            if (!n[i]) continue;
            ct_download(got[run][i], dg[i], n[i], i == G_DX ? bf16 : 0);
            ct_free(dg[i]);
        }
        ct_free(ddy);
        ct_free(ddso);
        free_dev(&d);
    }
    for (int i = 0; i < N_GRADS; i++) {
        if (!n[i]) continue;
        compare(label, grad_name[i], got[0][i], ref[i], n[i],
                bf16 && i == G_DX ? TOL_BF16 : TOL_F32);
        CHECK(tu_same_bits(got[0][i], got[1][i], n[i]),
              "%s: %s not bitwise identical on a second run", label, grad_name[i]);
        free(ref[i]);
        free(got[0][i]);
        free(got[1][i]);
    }
    free_data(&h);
}

static void test_invalid(void)
{
    ct_case("invalid arguments", "on the device path");
    tcase c = {.B = 1, .T = 4, .D = 8, .W = 4};
    host_data h;
    make_data(&h, &c, 0, 9);
    dev_data d;
    upload(&d, &c, &h, 0);
    const linseq_exec ex = ct_exec(LINSEQ_MODE_DEFAULT, 0, 0);
    CHECK(linseq_conv1d_forward(&d.p, &ex, NULL, NULL) == LINSEQ_ERR_NULL_POINTER,
          "device forward with y = NULL: expected LINSEQ_ERR_NULL_POINTER");
    linseq_conv1d_grads g = {0};
    CHECK(linseq_conv1d_backward(&d.p, &ex, NULL, NULL, &g) == LINSEQ_ERR_NULL_POINTER,
          "device backward with d_y = NULL: expected LINSEQ_ERR_NULL_POINTER");
    void *y = ct_alloc_poisoned(h.n_y, 0);
    d.p.W = 0;
    CHECK(linseq_conv1d_forward(&d.p, &ex, y, NULL) == LINSEQ_ERR_INVALID_SIZE,
          "device forward with W = 0: expected LINSEQ_ERR_INVALID_SIZE");
    ct_free(y);
    free_dev(&d);
    free_data(&h);
}

int main(void)
{
    ct_require_device("test_conv1d_cuda");
    static const int64_t cu3[] = {0, 2, 2, 41};
    static const int64_t cu5[] = {0, 0, 1, 17, 17, 60};
    /* one spec a line reads as a table (clang-format would put one field a line) */
    /* clang-format off */
    const tcase cases[] = {
        /* Mamba: W = 4, silu, bias, state, D % 4 == 0 (16-byte path) */
        {.B = 2, .T = 37, .D = 64, .W = 4, .bias = true, .state = true, .dso = true,
         .act = LINSEQ_ACT_SILU},
        /* decode: T = 1, the state advanced in place */
        {.B = 3, .T = 1, .D = 24, .W = 4, .bias = true, .state = true, .inplace = true,
         .dso = true, .act = LINSEQ_ACT_SILU},
        /* T < W - 1 in place: the new state mixes the old one and x */
        {.B = 2, .T = 2, .D = 9, .W = 4, .state = true, .inplace = true, .dso = true},
        /* T < W - 1 without a state: zero-padded new state */
        {.B = 2, .T = 2, .D = 8, .W = 4, .bias = true},
        /* W = 1 (no state), odd D */
        {.B = 2, .T = 19, .D = 13, .W = 1, .bias = true, .act = LINSEQ_ACT_GELU_TANH},
        /* W = 2, 3: odd D */
        {.B = 1, .T = 50, .D = 7, .W = 2, .state = true, .dso = true, .act = LINSEQ_ACT_SIGMOID},
        {.B = 2, .T = 33, .D = 12, .W = 3, .bias = true, .state = true, .act = LINSEQ_ACT_RELU},
        /* W = 5: the generic kernels; varlen with an empty sequence */
        {.B = 1, .T = 41, .D = 20, .W = 5, .bias = true, .state = true, .dso = true,
         .act = LINSEQ_ACT_SILU, .cu = cu3, .n_seqs = 3},
        /* W = 19: chunks of 18 tokens; varlen with empty and 1-token sequences, in place */
        {.B = 1, .T = 60, .D = 6, .W = 19, .bias = true, .state = true, .inplace = true,
         .dso = true, .cu = cu5, .n_seqs = 5},
        /* varlen W = 4 with the 16-byte path and several 8-chunk blocks */
        {.B = 1, .T = 60, .D = 36, .W = 4, .bias = true, .state = true, .dso = true,
         .act = LINSEQ_ACT_SILU, .cu = cu5, .n_seqs = 5},
        /* long: many chunks and blocks of chunks */
        {.B = 2, .T = 700, .D = 40, .W = 4, .bias = true, .act = LINSEQ_ACT_SILU},
    };
    /* clang-format on */
    const size_t n_cases = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n_cases; i++) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            test_forward(&cases[i], bf16, 400 + i);
            test_backward(&cases[i], bf16, false, 500 + i);
        }
        test_backward(&cases[i], 0, true, 600 + i);
    }
    test_invalid();
    return tu_finish("test_conv1d_cuda");
}
