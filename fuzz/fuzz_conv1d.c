/* libFuzzer target: linseq_conv1d_forward and linseq_conv1d_backward on problems decoded from
 * the input (sizes including W = 1 and W > T + 1, bias, state, activation, cu_seqlens, exec,
 * NULL and overlapping pointers, then the tensors' values).
 *
 * Buffers have exactly the sizes linseq.h gives (with W = 1 the state tensors have no
 * element, and the library must not touch them); see fuzz_util.h for the checks around every
 * call. The op is a linear filter and an activation, so finite inputs must give finite
 * results. A second run with another thread count (and the other way of passing the state
 * out) must give the same bits. */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"

/* B*T*D*W above this is skipped: each input stays a few ms under the sanitizers. */
#define CONV1D_MAX_WORK 600000

static bool too_big(int64_t n) { return n < 0 || n > (int64_t)(PTRDIFF_MAX / 8); }

static size_t fbytes(int64_t n) { return n >= 0 && n <= FZ_MAX_FLOATS ? (size_t)n * 4 : 0; }

static float *make(int64_t n, fz_in *in, fz_range r, bool *nice)
{
    float *p = fz_alloc(fbytes(n) / 4);
    fz_fill(in, p, fbytes(n) / 4, r, nice);
    return p;
}

typedef struct conv_case {
    linseq_conv1d_problem p;
    int64_t n_btd, n_dw, n_state, n_cu;
    const float *d_y, *d_state;
    bool nice;
} conv_case;

static void register_inputs(const conv_case *c, const linseq_conv1d_problem *p)
{
    fz_arg_in(p->x, fbytes(c->n_btd));
    fz_arg_in(p->weight, fbytes(c->n_dw));
    fz_arg_in(p->bias, fbytes(p->D));
    fz_arg_in(p->conv_state, fbytes(c->n_state));
    if (p->cu_seqlens) fz_arg_in(p->cu_seqlens, (size_t)c->n_cu * sizeof(int64_t));
}

static linseq_status run_forward(const conv_case *c, const linseq_conv1d_problem *p,
                                 const linseq_exec *ex, float *y, float *state_out, bool must_fail)
{
    fz_call_begin("linseq_conv1d_forward");
    register_inputs(c, p);
    if (y && y == p->x) /* aliasing test: x stays an input that must not change */
        fz_arg_inout(y, fbytes(c->n_btd));
    else
        fz_arg_out(y, fbytes(c->n_btd));
    if (state_out && state_out == p->conv_state)
        fz_arg_inout(state_out, fbytes(c->n_state));
    else
        fz_arg_out(state_out, fbytes(c->n_state));
    return fz_call_end(linseq_conv1d_forward(p, ex, y, state_out), c->nice, must_fail);
}

static float **slot(linseq_conv1d_grads *g, int i)
{
    float **s[4] = {&g->dx, &g->dweight, &g->dbias, &g->dconv_state};
    return s[i];
}

static void grads_alloc(linseq_conv1d_grads *g, int64_t n[4], const conv_case *c, unsigned mask)
{
    const int64_t sizes[4] = {c->n_btd, c->n_dw, c->p.D, c->n_state};
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 4; i++) {
        n[i] = sizes[i];
        if (mask >> i & 1) *slot(g, i) = fz_alloc(fbytes(sizes[i]) / 4);
    }
}

static linseq_status run_backward(const conv_case *c, const linseq_exec *ex, linseq_conv1d_grads *g,
                                  const int64_t n[4], bool null_grads, bool must_fail)
{
    fz_call_begin("linseq_conv1d_backward");
    register_inputs(c, &c->p);
    fz_arg_in(c->d_y, fbytes(c->n_btd));
    fz_arg_in(c->d_state, fbytes(c->n_state));
    for (int i = 0; i < 4; i++) {
        float *d = *slot(g, i);
        if (d && d != c->d_y) fz_arg_out(d, fbytes(n[i]));
    }
    return fz_call_end(linseq_conv1d_backward(&c->p, ex, c->d_y, c->d_state, null_grads ? NULL : g),
                       c->nice, must_fail);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in;
    fz_init(&in, data, size);
    conv_case c;
    memset(&c, 0, sizeof c);
    linseq_conv1d_problem *p = &c.p;
    bool bad = false, nice = true;

    p->B = fz_size(&in, 3);
    p->T = fz_size(&in, fz_bit(&in) ? 150 : 10);
    const unsigned dk = fz_pick(&in, 8);
    /* mostly a few channels; sometimes more than one span of channels (512) */
    p->D = dk == 7 ? 500 + fz_pick(&in, 60) : fz_size(&in, dk < 4 ? 9 : 80);
    p->W = fz_size(&in, fz_bit(&in) ? 40 : 6);
    const uint8_t f1 = fz_u8(&in), f2 = fz_u8(&in);
    const bool has_bias = f1 & 1, has_state = f1 >> 1 & 1, varlen = (f1 >> 2 & 3) == 3;
    in.weird = (f1 >> 4 & 3) == 0;
    const unsigned out_kind = f1 >> 6; /* 0: NULL, 1: own buffer, 2/3: in place if a state */
    const unsigned act = fz_pick(&in, 8);
    p->activation = act < 6 ? (linseq_activation)act : (linseq_activation)(act == 6 ? 6 : -1);
    if (act >= 6) bad = true;
    const unsigned null_kind = f2 & 7, alias_kind = f2 >> 3 & 7;
    const bool check_threads = f2 >> 6 & 1, d_state_given = f2 >> 7;
    const unsigned grad_mask = fz_u8(&in);
    linseq_exec exs;
    const linseq_exec *ex = fz_exec(&in, &exs, &bad);

    int64_t n_seqs = p->B;
    int64_t *cu = NULL;
    if (varlen) {
        if (fz_bit(&in)) p->B = 1;
        n_seqs = fz_size(&in, 5);
        const unsigned corrupt = fz_pick(&in, 12);
        c.n_cu = n_seqs >= 1 && n_seqs <= 64 ? n_seqs + 1 : 0;
        cu = fz_alloc_bytes((size_t)c.n_cu * sizeof *cu);
        if (n_seqs < 1 || p->B != 1 || n_seqs > (int64_t)(PTRDIFF_MAX / 8) - 1) bad = true;
        if (c.n_cu && p->T >= 1 && p->T <= ((int64_t)1 << 30) &&
            fz_cu_seqlens(&in, cu, n_seqs, p->T, corrupt < 7 ? 0 : corrupt - 6))
            bad = true;
        if (!c.n_cu && !bad) {
            fz_free_all();
            return 0;
        }
        p->cu_seqlens = cu;
        p->n_seqs = n_seqs;
    }
    /* sizes (B as varlen may have reset it) */
    if (p->B < 1 || p->T < 1 || p->D < 1 || p->W < 1) bad = true;
    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    /* element counts by the op table's shapes (the state's rows: n_seqs with cu_seqlens) */
    c.n_btd = fz_tensor_count("causal_conv1d", "x", p);
    c.n_dw = fz_tensor_count("causal_conv1d", "weight", p);
    /* W - 1 columns: only asked for W >= 1 (the shape would compute W - 1 of INT64_MIN) */
    c.n_state = W >= 1 ? fz_tensor_count("causal_conv1d", "conv_state", p) : -1;
    /* byte sizes; the states are optional (and ignored with W = 1), so theirs only count
     * where one is passed */
    if (too_big(c.n_btd) || too_big(c.n_dw)) bad = true;
    const bool state_big = W > 1 && too_big(c.n_state);
    int64_t work;
    const bool fits = fz_count(&work, 4, B, T, D, W) && work <= CONV1D_MAX_WORK &&
                      c.n_btd <= FZ_MAX_FLOATS && c.n_dw <= FZ_MAX_FLOATS && c.n_state >= 0 &&
                      c.n_state <= FZ_MAX_FLOATS;
    if (!fits && !bad) {
        fz_free_all();
        return 0;
    }

    p->x = make(c.n_btd, &in, FZ_SIGNED, &nice);
    p->weight = make(c.n_dw, &in, FZ_SIGNED, &nice);
    if (has_bias) p->bias = make(D, &in, FZ_SIGNED, &nice);
    float *state = has_state ? make(c.n_state, &in, FZ_SIGNED, &nice) : NULL;
    p->conv_state = state;
    c.d_y = make(c.n_btd, &in, FZ_SIGNED, &nice);
    c.d_state = d_state_given ? make(c.n_state, &in, FZ_SIGNED, &nice) : NULL;
    c.nice = nice;
    const float *state_orig = state ? fz_dup(state, fbytes(c.n_state) / 4) : NULL;

    float *y = fz_alloc(fbytes(c.n_btd) / 4);
    float *state_out = out_kind == 0            ? NULL
                       : out_kind >= 2 && state ? state
                                                : fz_alloc(fbytes(c.n_state) / 4);
    switch (null_kind) {
    case 1:
        p->x = NULL;
        bad = true;
        break;
    case 2:
        p->weight = NULL;
        bad = true;
        break;
    default: break;
    }
    /* y is the forward's required output */
    const bool fwd_bad = bad || null_kind == 3 || (state_big && (state || state_out));
    if (null_kind == 3) y = NULL;
    if (alias_kind == 1 && p->x && y) {
        run_forward(&c, p, ex, (float *)p->x, state_out, true);
        fz_free_all();
        return 0;
    }

    const linseq_status st = run_forward(&c, p, ex, y, state_out, fwd_bad);
    float *out_result = state_out ? fz_dup(state_out, fbytes(c.n_state) / 4) : NULL;
    if (state_out && state_out == state) memcpy(state, state_orig, fbytes(c.n_state));
    if (st == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = {.threads = ex && ex->threads == 1 ? 2 : 1};
        linseq_conv1d_problem p2 = *p;
        float *y2 = fz_alloc(fbytes(c.n_btd) / 4), *out2 = NULL;
        if (state_out) {
            if (state_out == state) {
                out2 = fz_alloc(fbytes(c.n_state) / 4);
            } else if (state) { /* now in place, on a copy of the state */
                out2 = fz_dup(state_orig, fbytes(c.n_state) / 4);
                p2.conv_state = out2;
            } else {
                out2 = fz_alloc(fbytes(c.n_state) / 4);
            }
        }
        if (run_forward(&c, &p2, &e2, y2, out2, false) != LINSEQ_OK)
            fz_die("forward fails with another thread count");
        fz_expect_same(y, y2, fbytes(c.n_btd) / 4, "y for two thread counts");
        if (state_out)
            fz_expect_same(out_result, out2, fbytes(c.n_state) / 4,
                           "conv_state_out for two thread counts");
    }

    /* backward; dbias without a bias is refused */
    unsigned mask = grad_mask;
    if (!p->bias && !(grad_mask >> 7)) mask &= ~4u;
    linseq_conv1d_grads g1;
    int64_t n[4];
    grads_alloc(&g1, n, &c, mask);
    bool bwd_bad = bad || (state_big && (state || c.d_state || g1.dconv_state));
    const float *d_y = c.d_y;
    if (alias_kind == 2) {
        c.d_y = NULL;
        bwd_bad = true;
    } else if (alias_kind == 3 && g1.dx) {
        g1.dx = (float *)c.d_y;
        bwd_bad = true;
    }
    const bool null_grads = alias_kind == 4;
    const linseq_status sb = run_backward(&c, ex, &g1, n, null_grads, bwd_bad || null_grads);
    c.d_y = d_y;
    if (sb == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = {.threads = ex && ex->threads == 1 ? 2 : 1};
        linseq_conv1d_grads g2;
        grads_alloc(&g2, n, &c, mask);
        if (run_backward(&c, &e2, &g2, n, false, false) != LINSEQ_OK)
            fz_die("backward fails with another thread count");
        for (int i = 0; i < 4; i++) {
            const float *a = *slot(&g1, i), *b = *slot(&g2, i);
            if (a && b) fz_expect_same(a, b, fbytes(n[i]) / 4, "gradients for two thread counts");
        }
    }
    fz_free_all();
    return 0;
}
