/* libFuzzer target: linseq_ssm1_forward and linseq_ssm1_backward on problems decoded from the
 * input (sizes, groups, optional tensors, dt_softplus, the gate's activation, cu_seqlens,
 * exec, NULL and overlapping pointers, then the tensors' values).
 *
 * Buffers have exactly the sizes linseq.h gives; see fuzz_util.h for the checks around every
 * call. "Nice" inputs keep the scan stable: A <= 0 and dt >= 0 (or dt through softplus), so
 * every decay factor exp(A dt) is at most 1 and finite inputs must give finite results. A
 * second run with another thread count (and the other way of passing hT) must give the same
 * bits. */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"

/* B*T*D*N above this is skipped: each input stays a few ms under the sanitizers. */
#define SSM1_MAX_WORK 300000

static bool too_big(int64_t n) { return n < 0 || n > (int64_t)(PTRDIFF_MAX / 8); }

static size_t fbytes(int64_t n) { return n >= 0 && n <= FZ_MAX_FLOATS ? (size_t)n * 4 : 0; }

static float *make(int64_t n, fz_in *in, fz_range r, bool *nice)
{
    float *p = fz_alloc(fbytes(n) / 4);
    fz_fill(in, p, fbytes(n) / 4, r, nice);
    return p;
}

typedef struct ssm_case {
    linseq_ssm1_problem p;
    int64_t n_btd, n_dn, n_bc, n_state, n_cu;
    const float *d_y, *d_hT;
    bool nice;
} ssm_case;

static void register_inputs(const ssm_case *c, const linseq_ssm1_problem *p)
{
    const int64_t D = p->D;
    fz_arg_in(p->x, fbytes(c->n_btd));
    fz_arg_in(p->dt, fbytes(c->n_btd));
    fz_arg_in(p->A, fbytes(c->n_dn));
    fz_arg_in(p->B_proj, fbytes(c->n_bc));
    fz_arg_in(p->C_proj, fbytes(c->n_bc));
    fz_arg_in(p->D_skip, fbytes(D));
    fz_arg_in(p->gate, fbytes(c->n_btd));
    fz_arg_in(p->dt_bias, fbytes(D));
    fz_arg_in(p->h0, fbytes(c->n_state));
    if (p->cu_seqlens) fz_arg_in(p->cu_seqlens, (size_t)c->n_cu * sizeof(int64_t));
}

static linseq_status run_forward(const ssm_case *c, const linseq_ssm1_problem *p,
                                 const linseq_exec *ex, float *y, float *hT, bool must_fail)
{
    fz_call_begin("linseq_ssm1_forward");
    register_inputs(c, p);
    if (y && y == p->x) /* aliasing test: x stays an input that must not change */
        fz_arg_inout(y, fbytes(c->n_btd));
    else
        fz_arg_out(y, fbytes(c->n_btd));
    if (hT && hT == p->h0)
        fz_arg_inout(hT, fbytes(c->n_state));
    else
        fz_arg_out(hT, fbytes(c->n_state));
    return fz_call_end(linseq_ssm1_forward(p, ex, y, hT), c->nice, must_fail);
}

typedef struct grad_set {
    linseq_ssm1_grads g;
    int64_t n[9];
} grad_set;

static float **slot(linseq_ssm1_grads *g, int i)
{
    float **s[9] = {&g->dx,      &g->ddt,   &g->dA,  &g->dB_proj, &g->dC_proj,
                    &g->dD_skip, &g->dgate, &g->dh0, &g->ddt_bias};
    return s[i];
}

static void grads_alloc(grad_set *s, const ssm_case *c, unsigned mask)
{
    const int64_t D = c->p.D;
    const int64_t n[9] = {c->n_btd, c->n_btd, c->n_dn,    c->n_bc, c->n_bc,
                          D,        c->n_btd, c->n_state, D};
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 9; i++) {
        s->n[i] = n[i];
        if (mask >> i & 1) *slot(&s->g, i) = fz_alloc(fbytes(n[i]) / 4);
    }
}

static linseq_status run_backward(const ssm_case *c, const linseq_exec *ex, grad_set *s,
                                  bool null_grads, bool must_fail)
{
    fz_call_begin("linseq_ssm1_backward");
    register_inputs(c, &c->p);
    fz_arg_in(c->d_y, fbytes(c->n_btd));
    fz_arg_in(c->d_hT, fbytes(c->n_state));
    for (int i = 0; i < 9; i++) {
        float *d = *slot(&s->g, i);
        if (d && d != c->d_y) fz_arg_out(d, fbytes(s->n[i]));
    }
    return fz_call_end(linseq_ssm1_backward(&c->p, ex, c->d_y, c->d_hT, null_grads ? NULL : &s->g),
                       c->nice, must_fail);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in;
    fz_init(&in, data, size);
    ssm_case c;
    memset(&c, 0, sizeof c);
    linseq_ssm1_problem *p = &c.p;
    bool bad = false, nice = true;

    p->B = fz_size(&in, 3);
    p->T = fz_size(&in, fz_bit(&in) ? 150 : 12);
    p->D = fz_size(&in, fz_bit(&in) ? 140 : 9);
    p->N = fz_size(&in, 20);
    const unsigned gk = fz_pick(&in, 8);
    /* G: 0 (one group), a divisor of D, or anything */
    if (gk == 0) {
        p->G = 0;
    } else if (gk < 6) {
        int64_t g = 1 + fz_pick(&in, 8);
        while (p->D >= 1 && p->D <= (1 << 20) && p->D % g) g--;
        p->G = g;
    } else {
        p->G = fz_size(&in, 9);
    }
    const uint8_t f1 = fz_u8(&in), f2 = fz_u8(&in), f3 = fz_u8(&in);
    const bool has_D = f1 & 1, has_gate = f1 >> 1 & 1, has_h0 = f1 >> 2 & 1;
    p->dt_softplus = f1 >> 3 & 1;
    const bool has_bias = (f1 >> 4 & 1) && (p->dt_softplus || (f2 & 15) == 0);
    const bool varlen = (f1 >> 5 & 3) == 3;
    in.weird = (f1 >> 7) && (f2 >> 4 & 1);
    const unsigned act = fz_pick(&in, 8);
    p->gate_activation = act < 6 ? (linseq_activation)act : (linseq_activation)(act == 6 ? 6 : -1);
    if (act >= 6) bad = true;
    const unsigned hT_kind = (f3 & 3) % 3, null_kind = f3 >> 2 & 15, alias_kind = f3 >> 6;
    const bool check_threads = f2 >> 5 & 1;
    const unsigned grad_mask = (unsigned)fz_u8(&in) | (unsigned)(f2 >> 6 & 1) << 8;
    linseq_exec exs;
    const linseq_exec *ex = fz_exec(&in, &exs, &bad);

    const int64_t G = p->G ? p->G : 1;
    if (p->D >= 1 && G >= 1 && p->D % G) bad = true;
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
        if (!c.n_cu && !bad) return 0;
        p->cu_seqlens = cu;
        p->n_seqs = n_seqs;
    }
    /* sizes (B as varlen may have reset it) */
    if (p->B < 1 || p->T < 1 || p->D < 1 || p->N < 1 || p->G < 0) bad = true;
    const int64_t B = p->B, T = p->T, D = p->D, N = p->N;
    /* element counts by the op table's shapes (B_proj: [B,T,G,N], [B,T,N] for G = 0; the
     * state's rows: n_seqs with cu_seqlens) */
    c.n_btd = fz_tensor_count("ssm1", "x", p);
    c.n_dn = fz_tensor_count("ssm1", "A", p);
    c.n_bc = fz_tensor_count("ssm1", "B", p);
    c.n_state = fz_tensor_count("ssm1", "h0", p);
    /* byte sizes; the states are optional, so theirs only count where one is passed */
    if (too_big(c.n_btd) || too_big(c.n_dn) || too_big(c.n_bc)) bad = true;
    const bool state_big = too_big(c.n_state);
    int64_t work;
    const bool fits = fz_count(&work, 4, B, T, D, N) && work <= SSM1_MAX_WORK &&
                      c.n_btd <= FZ_MAX_FLOATS && c.n_bc <= FZ_MAX_FLOATS &&
                      c.n_state <= FZ_MAX_FLOATS && c.n_dn <= FZ_MAX_FLOATS;
    if (!fits && !bad) {
        fz_free_all();
        return 0;
    }

    p->x = make(c.n_btd, &in, FZ_SIGNED, &nice);
    /* without softplus, dt >= 0 keeps exp(A dt) <= 1 */
    p->dt = make(c.n_btd, &in, p->dt_softplus ? FZ_SIGNED : FZ_NONNEG, &nice);
    p->A = make(c.n_dn, &in, FZ_NONPOS, &nice);
    p->B_proj = make(c.n_bc, &in, FZ_SIGNED, &nice);
    p->C_proj = make(c.n_bc, &in, FZ_SIGNED, &nice);
    if (has_D) p->D_skip = make(D, &in, FZ_SIGNED, &nice);
    if (has_gate) p->gate = make(c.n_btd, &in, FZ_SIGNED, &nice);
    if (has_bias) p->dt_bias = make(D, &in, FZ_SIGNED, &nice);
    float *h0 = has_h0 ? make(c.n_state, &in, FZ_SIGNED, &nice) : NULL;
    p->h0 = h0;
    c.d_y = make(c.n_btd, &in, FZ_SIGNED, &nice);
    c.d_hT = (f2 & 1) ? make(c.n_state, &in, FZ_SIGNED, &nice) : NULL;
    c.nice = nice;
    const float *h0_orig = h0 ? fz_dup(h0, fbytes(c.n_state) / 4) : NULL;

    float *y = fz_alloc(fbytes(c.n_btd) / 4);
    float *hT = hT_kind == 0 ? NULL : hT_kind == 2 && h0 ? h0 : fz_alloc(fbytes(c.n_state) / 4);
    switch (null_kind) {
    case 1:
        p->x = NULL;
        bad = true;
        break;
    case 2:
        p->dt = NULL;
        bad = true;
        break;
    case 3:
        p->A = NULL;
        bad = true;
        break;
    case 4:
        p->B_proj = NULL;
        bad = true;
        break;
    case 5:
        p->C_proj = NULL;
        bad = true;
        break;
    default: break;
    }
    /* y is the forward's required output */
    const bool fwd_bad = bad || null_kind == 6 || (state_big && (h0 || hT));
    if (null_kind == 6) y = NULL;
    if (alias_kind == 1 && p->x && y) {
        /* an output on top of an input must be refused */
        run_forward(&c, p, ex, (float *)p->x, hT, true);
        fz_free_all();
        return 0;
    }

    const linseq_status st = run_forward(&c, p, ex, y, hT, fwd_bad);
    float *hT_result = hT ? fz_dup(hT, fbytes(c.n_state) / 4) : NULL;
    if (hT && hT == h0) memcpy(h0, h0_orig, fbytes(c.n_state)); /* restore h0 */
    if (st == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = {.threads = ex && ex->threads == 1 ? 2 : 1};
        linseq_ssm1_problem p2 = *p;
        float *y2 = fz_alloc(fbytes(c.n_btd) / 4), *hT2 = NULL;
        if (hT) {
            if (hT == h0) {
                hT2 = fz_alloc(fbytes(c.n_state) / 4);
            } else if (h0) { /* now in place, on a copy of h0 */
                hT2 = fz_dup(h0_orig, fbytes(c.n_state) / 4);
                p2.h0 = hT2;
            } else {
                hT2 = fz_alloc(fbytes(c.n_state) / 4);
            }
        }
        if (run_forward(&c, &p2, &e2, y2, hT2, false) != LINSEQ_OK)
            fz_die("forward fails with another thread count");
        fz_expect_same(y, y2, fbytes(c.n_btd) / 4, "y for two thread counts");
        if (hT) fz_expect_same(hT_result, hT2, fbytes(c.n_state) / 4, "hT for two thread counts");
    }

    /* backward: gradients of absent inputs are refused (dh0 and ddt_bias excepted), so they
     * are asked for only now and then */
    unsigned mask = grad_mask;
    if (null_kind != 15) {
        if (!p->D_skip) mask &= ~(1u << 5);
        if (!p->gate) mask &= ~(1u << 6);
        if (!p->dt_softplus) mask &= ~(1u << 8);
    }
    grad_set g1;
    grads_alloc(&g1, &c, mask);
    bool bwd_bad = bad || (state_big && (h0 || c.d_hT || g1.g.dh0));
    const float *d_y = c.d_y;
    if (alias_kind == 2) {
        c.d_y = NULL;
        bwd_bad = true;
    } else if (alias_kind == 3 && g1.g.dx) {
        g1.g.dx = (float *)c.d_y; /* an output on top of an input */
        bwd_bad = true;
    }
    const bool null_grads = (f2 >> 1 & 7) == 5;
    const linseq_status sb = run_backward(&c, ex, &g1, null_grads, bwd_bad || null_grads);
    c.d_y = d_y;
    if (sb == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = {.threads = ex && ex->threads == 1 ? 2 : 1};
        grad_set g2;
        grads_alloc(&g2, &c, mask);
        if (run_backward(&c, &e2, &g2, false, false) != LINSEQ_OK)
            fz_die("backward fails with another thread count");
        for (int i = 0; i < 9; i++) {
            const float *a = *slot(&g1.g, i), *b = *slot(&g2.g, i);
            if (a && b)
                fz_expect_same(a, b, fbytes(g1.n[i]) / 4, "gradients for two thread counts");
        }
    }
    fz_free_all();
    return 0;
}
