/* libFuzzer target: the KDA entry points (forward in both modes, backward, the training pair,
 * decode, and the standalone gate) on problems decoded from the input.
 *
 * The first byte picks the family; the next bytes give sizes, options, which pointers are
 * NULL, cu_seqlens and an exec; the rest fills the tensors. Every buffer has exactly the size
 * linseq.h gives for the decoded shape, so any access outside it is caught by
 * AddressSanitizer. Problems too large to run fast are skipped unless they break a
 * documented rule (then they get small buffers and must be refused before any access).
 * Beyond fuzz_util.h's per-call checks: a second run with another thread count (and the other
 * way of passing ht) must give the same bits, and the training pair must give exactly what
 * forward and backward give. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

/* B*T*HV*K*V above this is skipped: a few ms per input under the sanitizers. */
#define KDA_MAX_WORK 400000

typedef struct tensor {
    float *p;
    int64_t n; /* elements the API expects; -1: overflows or negative */
} tensor;

/* A tensor's size in floats; -1 when a dimension is negative or the product overflows. */
static int64_t count(int nd, int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t n;
    const int64_t dims[4] = {a, b, c, d};
    bool ok = true;
    n = 1;
    for (int i = 0; i < nd; i++)
        if (dims[i] < 0 || __builtin_mul_overflow(n, dims[i], &n)) ok = false;
    return ok ? n : -1;
}

/* Byte size beyond ptrdiff_t (or no valid size): the library must refuse the tensor. */
static bool too_big(int64_t n) { return n < 0 || n > (int64_t)(PTRDIFF_MAX / 8); }

static size_t bytes_of(const tensor *t)
{
    return t->n >= 0 && t->n <= FZ_MAX_FLOATS ? (size_t)t->n * sizeof(float) : 0;
}

/* Exactly n floats when that is small; otherwise a buffer with no usable byte (the problem
 * must then be refused before the library touches it). */
static void make(tensor *t, int64_t n, fz_in *in, fz_range r, bool *nice)
{
    t->n = n;
    const size_t k = n >= 0 && n <= FZ_MAX_FLOATS ? (size_t)n : 0;
    t->p = fz_alloc(k);
    fz_fill(in, t->p, k, r, nice);
}

/* ---------------------------------------------------------------------------------- */
/* Forward, backward and the training pair                                            */
/* ---------------------------------------------------------------------------------- */

typedef struct kda_case {
    linseq_kda_problem p;
    int64_t HV, rows;
    tensor q, k, v, beta, g, h0, A_log, dt_bias, d_o, d_ht;
    tensor h0_orig; /* h0 as decoded: an in-place forward overwrites h0 */
    int64_t *cu;
    int64_t n_cu;
    int64_t n_o, n_state, n_g, n_bias;
    bool nice, must_fail, bad_sizes;
} kda_case;

static void register_inputs(const kda_case *c)
{
    const tensor *ts[] = {&c->q, &c->k, &c->v, &c->beta, &c->g, &c->h0, &c->A_log, &c->dt_bias};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->p) fz_arg_in(ts[i]->p, bytes_of(ts[i]));
    if (c->cu) fz_arg_in(c->cu, (size_t)c->n_cu * sizeof(int64_t));
}

static size_t fbytes(int64_t n) { return n >= 0 && n <= FZ_MAX_FLOATS ? (size_t)n * 4 : 0; }

/* g holds a positive log decay (g is not a raw gate): the forward, training forward and
 * backward refuse the call, finding it in the kernels' own pass over g, after outputs may
 * have been written (linseq.h); decode checks first and writes nothing. */
static void allow_positive_g_refusal(const kda_case *c)
{
    if (c->p.decay == LINSEQ_DECAY_NONE || c->p.gate_in_kernel || !c->g.p) return;
    for (size_t i = 0; i < bytes_of(&c->g) / sizeof(float); i++)
        if (c->g.p[i] > 0.0f) {
            fz_call_may_write_on_failure(LINSEQ_ERR_INVALID_VALUE);
            return;
        }
}

static linseq_status run_forward(const kda_case *c, const linseq_kda_problem *p,
                                 const linseq_exec *ex, float *o, float *ht, bool must_fail)
{
    fz_call_begin("linseq_kda_forward");
    allow_positive_g_refusal(c);
    register_inputs(c);
    if (p->h0 && p->h0 != c->h0.p) fz_arg_in(p->h0, fbytes(c->n_state));
    if (o && o == p->v) /* aliasing test: v stays an input that must not change */
        fz_arg_inout(o, fbytes(c->n_o));
    else
        fz_arg_out(o, fbytes(c->n_o));
    if (ht && ht == p->h0)
        fz_arg_inout(ht, fbytes(c->n_state));
    else
        fz_arg_out(ht, fbytes(c->n_state));
    return fz_call_end(linseq_kda_forward(p, ex, o, ht), c->nice, must_fail);
}

typedef struct grad_set {
    linseq_kda_grads g;
    int64_t n[8];
} grad_set;

static float **grad_slot(linseq_kda_grads *g, int i)
{
    float **slots[8] = {&g->dq, &g->dk,  &g->dv,     &g->dbeta,
                        &g->dg, &g->dh0, &g->dA_log, &g->ddt_bias};
    return slots[i];
}

static void grads_alloc(grad_set *s, const kda_case *c, unsigned mask)
{
    const linseq_kda_problem *p = &c->p;
    /* the gradients have their inputs' shapes; dA_log is [HV] even where the options rule
     * A_log out (the library must refuse it there) */
    const int64_t n_qk = fz_tensor_count("kda", "q", p), n_beta = fz_tensor_count("kda", "beta", p);
    const int64_t sizes[8] = {n_qk, n_qk, c->n_o, n_beta, c->n_g, c->n_state, c->HV, c->n_bias};
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 8; i++) {
        s->n[i] = sizes[i];
        if (mask >> i & 1) *grad_slot(&s->g, i) = fz_alloc(fbytes(sizes[i]) / 4);
    }
}

static linseq_status run_backward(const kda_case *c, const linseq_exec *ex, grad_set *s,
                                  const void *saved, size_t saved_bytes, bool nice, bool must_fail)
{
    fz_call_begin(saved ? "linseq_kda_backward_saved" : "linseq_kda_backward");
    allow_positive_g_refusal(c);
    register_inputs(c);
    if (c->d_o.p) fz_arg_in(c->d_o.p, bytes_of(&c->d_o));
    if (c->d_ht.p) fz_arg_in(c->d_ht.p, bytes_of(&c->d_ht));
    if (saved) fz_arg_in(saved, saved_bytes);
    for (int i = 0; i < 8; i++) {
        float *d = *grad_slot(&s->g, i);
        /* an aliasing test's gradient on top of d_o: d_o stays an input that must not
         * change */
        if (d && d != c->d_o.p) fz_arg_out(d, fbytes(s->n[i]));
    }
    const linseq_status st =
        saved ? linseq_kda_backward_saved(&c->p, ex, saved, saved_bytes, c->d_o.p, c->d_ht.p, &s->g)
              : linseq_kda_backward(&c->p, ex, c->d_o.p, c->d_ht.p, &s->g);
    return fz_call_end(st, nice, must_fail);
}

static void expect_same_grads(const grad_set *a, const grad_set *b, const char *what)
{
    for (int i = 0; i < 8; i++) {
        float *x = *grad_slot((linseq_kda_grads *)&a->g, i);
        float *y = *grad_slot((linseq_kda_grads *)&b->g, i);
        if (x && y) fz_expect_same(x, y, fbytes(a->n[i]) / 4, what);
    }
}

/* The other thread count of a determinism check. */
static linseq_exec other_threads(const linseq_exec *ex)
{
    linseq_exec e = ex ? *ex : (linseq_exec){0};
    e.threads = e.threads == 1 ? 2 : 1;
    return e;
}

static void fuzz_kda_main(fz_in *in)
{
    kda_case c;
    memset(&c, 0, sizeof c);
    linseq_kda_problem *p = &c.p;
    bool bad = false; /* a documented rule is broken */

    p->B = fz_size(in, 3);
    p->T = fz_size(in, fz_bit(in) ? 140 : 20);
    p->H = fz_size(in, 3);
    const unsigned hv_kind = fz_pick(in, 8);
    if (hv_kind == 0)
        p->HV = 0;
    else if (hv_kind == 1)
        p->HV = fz_size(in, 7);
    else /* a multiple of H, unless H is out of range */
        p->HV = p->H >= 1 && p->H <= 64 ? p->H * (1 + hv_kind % 3) : p->H;
    p->K = fz_size(in, fz_bit(in) ? 48 : 8);
    p->V = fz_size(in, fz_bit(in) ? 48 : 8);
    const unsigned dk = fz_pick(in, 8);
    p->decay = dk < 6 ? (linseq_decay)(dk % 3) : (linseq_decay)(dk == 6 ? 3 : -1);
    const uint8_t f1 = fz_u8(in), f2 = fz_u8(in), f3 = fz_u8(in);
    p->qk_l2norm = f1 & 1;
    p->beta_is_logit = f1 >> 1 & 1;
    p->state_v_first = f1 >> 2 & 1;
    p->gate_in_kernel = f1 >> 3 & 1;
    const bool has_h0 = f1 >> 4 & 1, varlen = (f1 >> 5 & 1) && (f2 >> 7);
    /* gate parameters normally only with gate_in_kernel (the library refuses them without) */
    const bool gate_params = p->gate_in_kernel || (f2 & 15) == 0;
    const bool has_alog = gate_params && (f1 >> 6 & 1), has_bias = gate_params && (f1 >> 7 & 1);
    in->weird = (f2 >> 4 & 3) == 0;
    const bool g_extreme = (f2 >> 6 & 1);
    const unsigned ht_kind = (f3 & 3) % 3;   /* NULL, own buffer, in place (h0) */
    const unsigned null_kind = f3 >> 2 & 15; /* 1..6: one required pointer is NULL */
    const bool g_mismatch = (f3 >> 6) == 3;  /* g given without decay or missing with */
    static const float scales[] = {0.0f, 0.0f,  0.0f, 1.0f,     0.5f,  -0.75f,
                                   2.5f, 1e-3f, NAN,  INFINITY, 1e30f, -3.0f};
    static const float bounds[] = {0.0f, -5.0f, -1.0f, -0.25f, 0.5f, NAN, -INFINITY, -1e30f};
    const unsigned si = fz_pick(in, 12), bi = fz_pick(in, 8);
    p->scale = scales[si];
    p->lower_bound = gate_params ? bounds[bi] : 0.0f;
    bool nice = (si < 8 || si == 11) && (!gate_params || bi < 4);
    if (si == 8 || si == 9 || (gate_params && bi >= 4 && bi <= 6)) bad = true;

    linseq_exec exs;
    const linseq_exec *ex = fz_exec(in, &exs, &bad);
    const uint8_t f4 = fz_u8(in);
    const unsigned grad_mask = fz_u8(in);
    const bool check_threads = f4 & 1, d_ht_given = f4 >> 1 & 1;
    const unsigned train_kind = f4 >> 2 & 7, alias_kind = f4 >> 5 & 7;

    c.HV = p->HV ? p->HV : p->H;
    if (p->H >= 1 && p->HV > 0 && p->HV % p->H) bad = true;
    if ((unsigned)p->decay > 2) bad = true;
    int64_t n_seqs = p->B;
    if (varlen) {
        if (fz_bit(in)) p->B = 1; /* usually a valid varlen batch */
        n_seqs = fz_size(in, 5);
        const unsigned corrupt = fz_pick(in, 12);
        c.n_cu = n_seqs >= 1 && n_seqs <= 64 ? n_seqs + 1 : 0;
        c.cu = fz_alloc_bytes((size_t)c.n_cu * sizeof(int64_t));
        if (n_seqs < 1 || p->B != 1 || p->T < 1) bad = true;
        /* n_seqs + 1 offsets of 8 bytes beyond ptrdiff_t: refused before cu is read */
        if (n_seqs > (int64_t)(PTRDIFF_MAX / 8) - 1) bad = true;
        if (c.n_cu && p->T >= 1 && p->T <= ((int64_t)1 << 30) &&
            fz_cu_seqlens(in, c.cu, n_seqs, p->T, corrupt < 7 ? 0 : corrupt - 6))
            bad = true;
        if (!c.n_cu && !bad) return; /* a valid count we cannot allocate */
        p->cu_seqlens = c.cu;
        p->n_seqs = n_seqs;
    }
    c.rows = n_seqs;
    /* sizes (B as varlen may have reset it) */
    if (p->B < 1 || p->T < 1 || p->H < 1 || p->K < 1 || p->V < 1 || p->HV < 0) bad = true;
    const int64_t HV = c.HV, B = p->B, T = p->T, K = p->K, V = p->V;
    /* element counts by the op table's shapes: g and dt_bias have none where the options
     * rule them out (no decay, the gate outside the kernel), so one passed there is refused
     * with no byte to read */
    c.n_o = fz_tensor_count("kda", "o", p);
    c.n_state = fz_tensor_count("kda", "h0", p);
    c.n_g = fz_tensor_count("kda", "g", p);
    c.n_bias = fz_tensor_count("kda", "dt_bias", p);
    const int64_t n_qk = fz_tensor_count("kda", "q", p), n_beta = fz_tensor_count("kda", "beta", p);
    const bool want_g = p->decay != LINSEQ_DECAY_NONE;
    const bool has_g = g_mismatch ? !want_g : want_g;
    if (has_g != want_g && (unsigned)p->decay <= 2) bad = true;

    /* byte sizes; the states are optional, so theirs only count where one is passed */
    if (too_big(n_qk) || too_big(c.n_o) || too_big(n_beta) || (has_g && too_big(c.n_g)) ||
        (p->gate_in_kernel && has_bias && too_big(c.n_bias)))
        bad = true;
    const bool state_big = too_big(c.n_state);
    int64_t work;
    const bool fits = fz_count(&work, 5, B, T, HV, K, V) && work <= KDA_MAX_WORK &&
                      n_qk <= FZ_MAX_FLOATS && c.n_o <= FZ_MAX_FLOATS &&
                      c.n_state <= FZ_MAX_FLOATS && c.n_g <= FZ_MAX_FLOATS;
    if (!fits && !bad) return;

    /* tensors */
    make(&c.q, n_qk, in, FZ_SIGNED, &nice);
    make(&c.k, n_qk, in, p->qk_l2norm ? FZ_SIGNED : FZ_SMALL, &nice);
    /* without l2norm, |k|^2 <= 1 and beta <= 1 keep every step a contraction */
    if (!p->qk_l2norm && K > 0)
        for (int64_t i = 0; i < (int64_t)(bytes_of(&c.k) / 4); i++) c.k.p[i] /= sqrtf((float)K);
    make(&c.v, c.n_o, in, FZ_SIGNED, &nice);
    make(&c.beta, n_beta, in, p->beta_is_logit ? FZ_SIGNED : FZ_UNIT, &nice);
    if (has_g) {
        make(&c.g, c.n_g, in, p->gate_in_kernel ? FZ_SIGNED : FZ_NONPOS, &nice);
        /* chunked mode is documented exact down to g = -inf */
        if (g_extreme && !p->gate_in_kernel)
            for (int64_t i = 0; i < (int64_t)(bytes_of(&c.g) / 4); i++) {
                const unsigned r = fz_u8(in);
                if (r % 5 == 1) c.g.p[i] = -INFINITY;
                if (r % 5 == 2) c.g.p[i] = -1e30f;
                if (r % 5 == 3) c.g.p[i] = -200.0f;
            }
    }
    if (has_h0) make(&c.h0, c.n_state, in, FZ_SIGNED, &nice);
    if (has_alog) make(&c.A_log, HV, in, FZ_SIGNED, &nice);
    if (has_bias) make(&c.dt_bias, c.n_bias, in, FZ_SIGNED, &nice);
    make(&c.d_o, c.n_o, in, FZ_SIGNED, &nice);
    if (d_ht_given) make(&c.d_ht, c.n_state, in, FZ_SIGNED, &nice);
    c.h0_orig = c.h0;
    if (c.h0.p) c.h0_orig.p = fz_dup(c.h0.p, bytes_of(&c.h0) / 4);
    p->q = c.q.p;
    p->k = c.k.p;
    p->v = c.v.p;
    p->beta = c.beta.p;
    p->g = c.g.p;
    p->h0 = c.h0.p;
    p->A_log = c.A_log.p;
    p->dt_bias = c.dt_bias.p;
    float *o = fz_alloc(fbytes(c.n_o) / 4);
    float *ht = ht_kind == 0            ? NULL
                : ht_kind == 2 && p->h0 ? c.h0.p
                                        : fz_alloc(fbytes(c.n_state) / 4);
    switch (null_kind) {
    case 1:
        p->q = NULL;
        bad = true;
        break;
    case 2:
        p->k = NULL;
        bad = true;
        break;
    case 3:
        p->v = NULL;
        bad = true;
        break;
    case 4: /* no delta rule: gated linear attention, a valid problem */ p->beta = NULL; break;
    default: break;
    }
    c.nice = nice;
    c.bad_sizes = bad;
    /* an output that overlaps an input of the same shape must be refused */
    bool fwd_bad = bad || (state_big && (p->h0 || ht));
    if (null_kind == 5) { /* the forward's required output (the backward has none) */
        o = NULL;
        fwd_bad = true;
    }
    float *o_run = o;
    if (alias_kind == 1 && p->v && o) {
        o_run = (float *)p->v;
        fwd_bad = true;
    }

    /* forward, then again with the other thread count and the other way of passing ht */
    const linseq_status st = run_forward(&c, p, ex, o_run, ht, fwd_bad);
    if (o_run != o) return;
    /* ht as computed; an in-place run's h0 is restored for the calls below */
    float *ht_result = ht ? fz_dup(ht, fbytes(c.n_state) / 4) : NULL;
    if (ht == c.h0.p && ht) memcpy(c.h0.p, c.h0_orig.p, bytes_of(&c.h0));
    if (st == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = other_threads(ex);
        linseq_kda_problem p2 = *p;
        float *o2 = fz_alloc(fbytes(c.n_o) / 4), *ht2 = NULL;
        if (ht) {
            if (ht == c.h0.p) { /* was in place: now its own buffer */
                ht2 = fz_alloc(fbytes(c.n_state) / 4);
            } else if (p->h0) { /* was its own buffer: now in place on a copy of h0 */
                ht2 = fz_dup(c.h0_orig.p, bytes_of(&c.h0) / 4);
                p2.h0 = ht2;
            } else {
                ht2 = fz_alloc(fbytes(c.n_state) / 4);
            }
        }
        if (run_forward(&c, &p2, &e2, o2, ht2, false) != LINSEQ_OK)
            fz_die("forward fails with another thread count");
        fz_expect_same(o, o2, fbytes(c.n_o) / 4, "forward o for two thread counts");
        if (ht)
            fz_expect_same(ht_result, ht2, fbytes(c.n_state) / 4,
                           "forward ht for two thread counts, in place and not");
    }

    /* backward */
    grad_set g1;
    unsigned mask = grad_mask;
    if (!p->gate_in_kernel && (f2 & 7) != 1) mask &= 0x3f; /* dA_log, ddt_bias need the gate */
    if (!want_g && (f2 & 7) != 2) mask &= ~16u;
    if (!p->beta) mask &= ~8u; /* without beta there is no dbeta to ask for */
    grads_alloc(&g1, &c, mask);
    const float *d_o_saved = c.d_o.p;
    bool bwd_bad = bad || (state_big && (p->h0 || c.d_ht.p || g1.g.dh0));
    if (alias_kind == 2) {
        c.d_o.p = NULL;
        bwd_bad = true;
    }
    if (alias_kind == 3 && g1.g.dv) {
        g1.g.dv = c.d_o.p; /* an output on top of an input */
        bwd_bad = true;
    }
    if (alias_kind == 4 && g1.g.dq && g1.g.dk) {
        g1.g.dk = g1.g.dq; /* two outputs on top of each other */
        bwd_bad = true;
    }
    const linseq_status sb = run_backward(&c, ex, &g1, NULL, 0, c.nice, bwd_bad);
    c.d_o.p = (float *)d_o_saved;
    if (sb == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = other_threads(ex);
        grad_set g2;
        grads_alloc(&g2, &c, mask);
        if (run_backward(&c, &e2, &g2, NULL, 0, c.nice, false) != LINSEQ_OK)
            fz_die("backward fails with another thread count");
        expect_same_grads(&g1, &g2, "backward gradients for two thread counts");
    }

    /* the training pair: saved_size, forward_train, backward_saved */
    if (!train_kind || null_kind || alias_kind) return;
    size_t bytes = 0;
    fz_call_begin("linseq_kda_saved_size");
    if (c.cu) fz_arg_in(c.cu, (size_t)c.n_cu * sizeof(int64_t));
    const linseq_status ss = fz_call_end(linseq_kda_saved_size(p, ex, &bytes), true, false);
    if (ss != LINSEQ_OK || bytes > ((size_t)64 << 20) || !fits || bad) return;
    const size_t short_by = train_kind == 2 ? 1 + fz_u8(in) % 64 : 0;
    const size_t have = bytes > short_by ? bytes - short_by : 0;
    unsigned char *saved = fz_alloc_bytes(have);
    float *o3 = fz_alloc(fbytes(c.n_o) / 4);
    float *ht3 = ht ? fz_alloc(fbytes(c.n_state) / 4) : NULL;
    fz_call_begin("linseq_kda_forward_train");
    allow_positive_g_refusal(&c);
    register_inputs(&c);
    fz_arg_out(o3, fbytes(c.n_o));
    fz_arg_out(ht3, fbytes(c.n_state));
    fz_arg_out_raw(saved, have);
    const linseq_status st3 =
        fz_call_end(linseq_kda_forward_train(p, ex, o3, ht3, saved, have), c.nice, short_by > 0);
    if (st3 != LINSEQ_OK) return;
    if (st != LINSEQ_OK) fz_die("forward_train accepts what forward refuses");
    fz_expect_same(o, o3, fbytes(c.n_o) / 4, "o of forward and forward_train");
    if (ht)
        fz_expect_same(ht_result, ht3, fbytes(c.n_state) / 4, "ht of forward and forward_train");

    bool saved_bad = false, saved_nice = c.nice;
    size_t pass_bytes = have;
    const linseq_exec *ex_saved = ex;
    linseq_exec other;
    switch (train_kind) {
    case 3:
        saved[fz_u8(in) % 64] ^= (unsigned char)(1u << fz_pick(in, 8));
        saved_bad = true;
        break;
    case 4:
        if (have > 64) saved[64 + fz_u32(in) % (have - 64)] ^= 0x40;
        saved_nice = false;
        break;
    case 5:
        pass_bytes = have - 1 - fz_u8(in) % 8;
        saved_bad = true;
        break;
    case 6:
        other = other_threads(ex);
        other.mode = (linseq_mode)fz_pick(in, 3);
        other.chunk_size = 16 << fz_pick(in, 4);
        ex_saved = &other;
        break;
    default: break;
    }
    grad_set g3;
    grads_alloc(&g3, &c, mask);
    const linseq_status s3 =
        run_backward(&c, ex_saved, &g3, saved, pass_bytes, saved_nice, saved_bad);
    if (s3 == LINSEQ_OK && sb == LINSEQ_OK && train_kind != 4 && ex_saved == ex)
        expect_same_grads(&g1, &g3, "gradients of backward and backward_saved");
}

/* ---------------------------------------------------------------------------------- */
/* Decode                                                                             */
/* ---------------------------------------------------------------------------------- */

static void fuzz_kda_decode(fz_in *in)
{
    linseq_kda_problem p = {0};
    bool bad = false, nice = true;
    p.B = fz_size(in, 6);
    p.T = fz_pick(in, 16) ? 1 : fz_size(in, 3);
    p.H = fz_size(in, 3);
    const unsigned group = 1 + fz_pick(in, 2);
    p.HV = p.H >= 1 && p.H <= 64 ? p.H * group : 0;
    p.K = fz_size(in, fz_bit(in) ? 48 : 8);
    p.V = fz_size(in, fz_bit(in) ? 48 : 8);
    const unsigned dk = fz_pick(in, 7);
    p.decay = dk < 6 ? (linseq_decay)(dk % 3) : (linseq_decay)5;
    const uint8_t f1 = fz_u8(in), f2 = fz_u8(in);
    p.qk_l2norm = f1 & 1;
    p.beta_is_logit = f1 >> 1 & 1;
    p.state_v_first = f1 >> 2 & 1;
    p.gate_in_kernel = f1 >> 3 & 1 && p.decay != LINSEQ_DECAY_NONE;
    const bool has_alog = p.gate_in_kernel && (f1 >> 4 & 1);
    const bool has_bias = p.gate_in_kernel && (f1 >> 5 & 1);
    const unsigned rows_kind = f1 >> 6; /* 0: row b; 1-3: a row list */
    in->weird = (f2 & 3) == 0;
    const bool with_h0 = (f2 >> 2 & 15) == 1, with_cu = (f2 >> 2 & 15) == 2;
    const bool check_threads = f2 >> 6 & 1;
    linseq_exec exs;
    const linseq_exec *ex = fz_exec(in, &exs, &bad);
    const int64_t n_rows = fz_size(in, 8);

    if (p.B < 1 || p.T != 1 || p.H < 1 || p.K < 1 || p.V < 1 || (unsigned)p.decay > 2) bad = true;
    if (n_rows < 1 || with_h0 || with_cu) bad = true;
    const int64_t HV = p.HV ? p.HV : p.H, B = p.B, K = p.K, V = p.V;
    const bool per_channel = p.decay == LINSEQ_DECAY_PER_CHANNEL;
    const int64_t n_qk = count(4, B, 1, p.H, K), n_o = count(4, B, 1, HV, V);
    const int64_t n_g = per_channel ? count(4, B, 1, HV, K) : count(3, B, 1, HV, 1);
    const int64_t n_state = count(4, n_rows, HV, K, V);
    if (too_big(n_qk) || too_big(n_o) || too_big(n_state) || too_big(n_g)) bad = true;
    int64_t work;
    const bool fits = fz_count(&work, 4, B, HV, K, V) && work <= KDA_MAX_WORK && n_state >= 0 &&
                      n_state <= FZ_MAX_FLOATS && n_qk <= FZ_MAX_FLOATS;
    if (!fits && !bad) return;

    /* the row list: each entry a row, a padding request (< 0), or out of range */
    int64_t *rows = NULL;
    if (rows_kind && B >= 1 && B <= 64) {
        rows = fz_alloc_bytes((size_t)B * sizeof *rows);
        for (int64_t b = 0; b < B; b++) {
            const unsigned r = fz_pick(in, 16);
            rows[b] = r < 12    ? (int64_t)(fz_u8(in) % (n_rows > 0 && n_rows < 256 ? n_rows : 1))
                      : r < 14  ? -1 - (int64_t)fz_pick(in, 3)
                      : r == 14 ? n_rows
                                : INT64_MIN;
            if (rows[b] >= n_rows && n_rows >= 1) bad = true;
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t b2 = 0; b2 < b; b2++)
                if (rows[b] >= 0 && rows[b] == rows[b2]) bad = true;
    } else if (rows_kind) {
        return;
    } else if (n_rows < B) {
        bad = true;
    }

    tensor q, k, v, beta, g = {0}, alog = {0}, bias = {0}, state;
    make(&q, n_qk, in, FZ_SIGNED, &nice);
    make(&k, n_qk, in, p.qk_l2norm ? FZ_SIGNED : FZ_SMALL, &nice);
    if (!p.qk_l2norm && K > 0)
        for (int64_t i = 0; i < (int64_t)(bytes_of(&k) / 4); i++) k.p[i] /= sqrtf((float)K);
    make(&v, n_o, in, FZ_SIGNED, &nice);
    make(&beta, count(3, B, 1, HV, 1), in, p.beta_is_logit ? FZ_SIGNED : FZ_UNIT, &nice);
    if (p.decay != LINSEQ_DECAY_NONE)
        make(&g, n_g, in, p.gate_in_kernel ? FZ_SIGNED : FZ_NONPOS, &nice);
    if (has_alog) make(&alog, HV, in, FZ_SIGNED, &nice);
    if (has_bias) make(&bias, per_channel ? count(2, HV, K, 1, 1) : HV, in, FZ_SIGNED, &nice);
    make(&state, n_state, in, FZ_SIGNED, &nice);
    p.q = q.p;
    p.k = k.p;
    p.v = v.p;
    p.beta = beta.p;
    p.g = g.p;
    p.A_log = alog.p;
    p.dt_bias = bias.p;
    int64_t cu[2] = {0, 1};
    if (with_h0) p.h0 = state.p;
    if (with_cu) {
        p.cu_seqlens = cu;
        p.n_seqs = 1;
    }
    float *state_before = fz_dup(state.p, bytes_of(&state) / 4);
    float *o = fz_alloc(fbytes(n_o) / 4);

    fz_call_begin("linseq_kda_decode");
    const tensor *ins[] = {&q, &k, &v, &beta, &g, &alog, &bias};
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
        if (ins[i]->p) fz_arg_in(ins[i]->p, bytes_of(ins[i]));
    if (rows) fz_arg_in(rows, (size_t)B * sizeof *rows);
    fz_arg_inout(state.p, bytes_of(&state));
    fz_arg_out(o, fbytes(n_o));
    const linseq_status st =
        fz_call_end(linseq_kda_decode(&p, ex, state.p, n_rows, rows, o), nice, bad);
    if (st != LINSEQ_OK) return;
    /* rows no request names are neither read nor written; padding requests give o = 0 */
    const int64_t KV = K * V, row_floats = HV * KV;
    for (int64_t r = 0; r < n_rows; r++) {
        bool named = false;
        for (int64_t b = 0; b < B; b++) named |= (rows ? rows[b] : b) == r;
        if (!named && memcmp(state.p + r * row_floats, state_before + r * row_floats,
                             (size_t)row_floats * sizeof(float)) != 0)
            fz_die("decode wrote state row %lld, which no request names", (long long)r);
    }
    for (int64_t b = 0; rows && b < B; b++)
        if (rows[b] < 0)
            for (int64_t i = 0; i < HV * V; i++)
                if (o[b * HV * V + i] != 0.0f)
                    fz_die("padding request %lld has o != 0", (long long)b);
    if (check_threads) {
        const linseq_exec e2 = other_threads(ex);
        float *o2 = fz_alloc(fbytes(n_o) / 4);
        float *state2 = fz_dup(state_before, bytes_of(&state) / 4);
        if (linseq_kda_decode(&p, &e2, state2, n_rows, rows, o2) != LINSEQ_OK)
            fz_die("decode fails with another thread count");
        fz_expect_same(o, o2, fbytes(n_o) / 4, "decode o for two thread counts");
        fz_expect_same(state.p, state2, bytes_of(&state) / 4, "decode state for two thread counts");
    }
}

/* ---------------------------------------------------------------------------------- */
/* The standalone gate                                                                */
/* ---------------------------------------------------------------------------------- */

static void fuzz_kda_gate(fz_in *in)
{
    linseq_kda_gate_problem p = {0};
    bool bad = false, nice = true;
    p.B = fz_size(in, 3);
    p.T = fz_size(in, 40);
    p.H = fz_size(in, 4);
    p.K = fz_size(in, 40);
    const unsigned dk = fz_pick(in, 10);
    p.decay = dk < 8 ? (linseq_decay)(1 + dk % 2) : dk == 8 ? LINSEQ_DECAY_NONE : (linseq_decay)7;
    const uint8_t f = fz_u8(in);
    in->weird = (f & 3) == 0;
    static const float bounds[] = {0.0f, -5.0f, -1.0f, -0.25f, 0.5f, NAN, -INFINITY, -1e30f};
    const unsigned bi = f >> 2 & 7;
    p.lower_bound = bounds[bi];
    if (bi >= 4) nice = false;
    if (bi >= 4 && bi <= 6) bad = true;
    const bool has_alog = f >> 5 & 1, has_bias = f >> 6 & 1, check_threads = f >> 7;
    const unsigned mask = fz_u8(in);
    linseq_exec exs;
    const linseq_exec *ex = fz_exec(in, &exs, &bad);

    const bool per_channel = p.decay == LINSEQ_DECAY_PER_CHANNEL;
    if (p.decay != LINSEQ_DECAY_PER_HEAD && !per_channel) bad = true;
    if (p.B < 1 || p.T < 1 || p.H < 1 || (per_channel && p.K < 1)) bad = true;
    const int64_t n_g = fz_tensor_count("kda_gate", "g_raw", &p);
    const int64_t n_bias = fz_tensor_count("kda_gate", "dt_bias", &p);
    if (too_big(n_g) || too_big(n_bias)) bad = true;
    if (!(n_g >= 0 && n_g <= FZ_MAX_FLOATS && n_bias <= FZ_MAX_FLOATS) && !bad) return;

    tensor raw, alog = {0}, bias = {0}, dg;
    make(&raw, n_g, in, FZ_SIGNED, &nice);
    if (has_alog) make(&alog, p.H, in, FZ_SIGNED, &nice);
    if (has_bias) make(&bias, n_bias, in, FZ_SIGNED, &nice);
    make(&dg, n_g, in, FZ_SIGNED, &nice);
    p.g_raw = mask >> 7 ? NULL : raw.p;
    if (!p.g_raw) bad = true;
    p.A_log = alog.p;
    p.dt_bias = bias.p;
    float *g = fz_alloc(fbytes(n_g) / 4);

    fz_call_begin("linseq_kda_gate_forward");
    fz_arg_in(raw.p, bytes_of(&raw));
    if (alog.p) fz_arg_in(alog.p, bytes_of(&alog));
    if (bias.p) fz_arg_in(bias.p, bytes_of(&bias));
    fz_arg_out(g, fbytes(n_g));
    const linseq_status st = fz_call_end(linseq_kda_gate_forward(&p, ex, g), nice, bad);
    if (st == LINSEQ_OK && nice)
        for (int64_t i = 0; i < n_g; i++)
            if (!(g[i] <= 0.0f)) fz_die("gate value %g > 0 at %lld", (double)g[i], (long long)i);
    if (st == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = other_threads(ex);
        float *g2 = fz_alloc(fbytes(n_g) / 4);
        if (linseq_kda_gate_forward(&p, &e2, g2) != LINSEQ_OK)
            fz_die("gate forward fails with another thread count");
        fz_expect_same(g, g2, fbytes(n_g) / 4, "gate for two thread counts");
    }

    linseq_kda_gate_grads gr = {0};
    if (mask & 1) gr.dg_raw = fz_alloc(fbytes(n_g) / 4);
    if (mask & 2) gr.dA_log = fz_alloc(fbytes(p.H) / 4);
    if (mask & 4) gr.ddt_bias = fz_alloc(fbytes(n_bias) / 4);
    const bool null_grads = (mask >> 3 & 7) == 5, null_dg = (mask >> 3 & 7) == 6;
    fz_call_begin("linseq_kda_gate_backward");
    fz_arg_in(raw.p, bytes_of(&raw));
    if (alog.p) fz_arg_in(alog.p, bytes_of(&alog));
    if (bias.p) fz_arg_in(bias.p, bytes_of(&bias));
    fz_arg_in(dg.p, bytes_of(&dg));
    fz_arg_out(gr.dg_raw, fbytes(n_g));
    fz_arg_out(gr.dA_log, fbytes(p.H));
    fz_arg_out(gr.ddt_bias, fbytes(n_bias));
    const linseq_status sb = fz_call_end(
        linseq_kda_gate_backward(&p, ex, null_dg ? NULL : dg.p, null_grads ? NULL : &gr), nice,
        bad || null_grads || null_dg);
    if (sb == LINSEQ_OK && check_threads) {
        const linseq_exec e2 = other_threads(ex);
        linseq_kda_gate_grads g2 = {0};
        if (gr.dg_raw) g2.dg_raw = fz_alloc(fbytes(n_g) / 4);
        if (gr.dA_log) g2.dA_log = fz_alloc(fbytes(p.H) / 4);
        if (gr.ddt_bias) g2.ddt_bias = fz_alloc(fbytes(n_bias) / 4);
        if (linseq_kda_gate_backward(&p, &e2, dg.p, &g2) != LINSEQ_OK)
            fz_die("gate backward fails with another thread count");
        if (gr.dg_raw) fz_expect_same(gr.dg_raw, g2.dg_raw, fbytes(n_g) / 4, "dg_raw");
        if (gr.dA_log) fz_expect_same(gr.dA_log, g2.dA_log, fbytes(p.H) / 4, "dA_log");
        if (gr.ddt_bias) fz_expect_same(gr.ddt_bias, g2.ddt_bias, fbytes(n_bias) / 4, "ddt_bias");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in;
    fz_init(&in, data, size);
    switch (fz_u8(&in) % 4) {
    case 0:
    case 1: fuzz_kda_main(&in); break;
    case 2: fuzz_kda_decode(&in); break;
    default: fuzz_kda_gate(&in); break;
    }
    fz_free_all();
    return 0;
}
