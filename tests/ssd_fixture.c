/* Random SSD problems, the double definition they are checked against, and the per-ISA run
 * (ssd_fixture.h). */
#include "ssd_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const int64_t ssd_cu_empty[5] = {0, 37, 37, 100, 130};

void ssd_fixture_alloc(ssd_fixture *f, const ssd_spec *s)
{
    memset(f, 0, sizeof *f);
    const int64_t G = s->G ? s->G : 1, BT = s->B * s->T;
    f->n_rows = s->cu ? s->n_seqs : s->B;
    f->n_y = (size_t)(BT * s->H * s->P);
    f->n_dt = (size_t)(BT * s->H);
    f->n_bc = (size_t)(BT * G * s->N);
    f->n_d = (size_t)(s->D_per_channel ? s->H * s->P : s->H);
    f->n_s = (size_t)(f->n_rows * s->H * s->P * s->N);
    f->x = tu_alloc(f->n_y), f->dt = tu_alloc(f->n_dt), f->A = tu_alloc((size_t)s->H);
    f->Bp = tu_alloc(f->n_bc), f->Cp = tu_alloc(f->n_bc);
    f->D = tu_alloc((size_t)(s->H * s->P)), f->z = tu_alloc(f->n_y);
    f->h0 = tu_alloc(f->n_s), f->dt_bias = tu_alloc((size_t)s->H);
    f->p = (linseq_ssd_problem){.B = s->B,
                                .T = s->T,
                                .H = s->H,
                                .P = s->P,
                                .N = s->N,
                                .G = s->G,
                                .cu_seqlens = s->cu,
                                .n_seqs = s->n_seqs,
                                .x = f->x,
                                .dt = f->dt,
                                .A = f->A,
                                .B_proj = f->Bp,
                                .C_proj = f->Cp,
                                .D_skip = s->D ? f->D : NULL,
                                .z = s->z ? f->z : NULL,
                                .h0 = s->h0 ? f->h0 : NULL,
                                .dt_bias = s->softplus ? f->dt_bias : NULL,
                                .dt_softplus = s->softplus,
                                .D_per_channel = s->D_per_channel,
                                .state_n_first = s->n_first,
                                .dt_min = s->dt_max > 0.0f ? 0.05f : 0.0f,
                                .dt_max = s->dt_max};
}

void ssd_fixture_make(ssd_fixture *f, const ssd_spec *s, uint64_t seed)
{
    ssd_fixture_alloc(f, s);
    tu_rng r = {seed};
    tu_fill_normal(&r, f->x, f->n_y, 1.0);
    tu_fill_uniform(&r, f->dt, f->n_dt, s->softplus ? -4.0 : 0.01, s->softplus ? 0.0 : 0.3);
    tu_fill_uniform(&r, f->A, (size_t)s->H, -4.0, -0.5);
    tu_fill_normal(&r, f->Bp, f->n_bc, 1.0);
    tu_fill_normal(&r, f->Cp, f->n_bc, 1.0);
    if (s->D) tu_fill_normal(&r, f->D, f->n_d, 1.0);
    if (s->z) tu_fill_normal(&r, f->z, f->n_y, 1.0);
    if (s->h0) tu_fill_normal(&r, f->h0, f->n_s, 0.5);
    if (s->softplus) tu_fill_uniform(&r, f->dt_bias, (size_t)s->H, -1.0, 1.0);
}

void ssd_fixture_free(ssd_fixture *f)
{
    free(f->x), free(f->dt), free(f->A), free(f->Bp), free(f->Cp), free(f->D), free(f->z);
    free(f->h0), free(f->dt_bias);
    memset(f, 0, sizeof *f);
}

/* ---- the definition ------------------------------------------------------------------- */

static double ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

double ssd_ref_dt(const linseq_ssd_problem *p, int64_t bt, int64_t h)
{
    double d = p->dt[bt * p->H + h];
    if (p->dt_softplus) d = ref_softplus(d + (p->dt_bias ? p->dt_bias[h] : 0.0));
    if (p->dt_max > p->dt_min) d = fmin(fmax(d, p->dt_min), p->dt_max);
    return d;
}

void ssd_ref_tokens(const linseq_ssd_problem *p, int64_t s, int64_t *first, int64_t *last)
{
    *first = p->cu_seqlens ? p->cu_seqlens[s] : s * p->T;
    *last = p->cu_seqlens ? p->cu_seqlens[s + 1] : (s + 1) * p->T;
}

int64_t ssd_ref_state_at(const linseq_ssd_problem *p, int64_t row, int64_t h, int64_t i, int64_t n)
{
    const int64_t base = (row * p->H + h) * p->P * p->N;
    return p->state_n_first ? base + n * p->P + i : base + i * p->N + n;
}

/* y of token bt, head h from the state S [P,N] after it. */
static void read_out(const linseq_ssd_problem *p, int64_t bt, int64_t h, const double *S, double *y)
{
    const int64_t H = p->H, P = p->P, N = p->N, G = p->G ? p->G : 1;
    const float *x = p->x + (bt * H + h) * P, *Cv = p->C_proj + (bt * G + h / (H / G)) * N;
    for (int64_t i = 0; i < P; i++) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; n++) acc += S[i * N + n] * Cv[n];
        if (p->D_skip) acc += (double)p->D_skip[p->D_per_channel ? h * P + i : h] * x[i];
        if (p->z) {
            const double z = p->z[(bt * H + h) * P + i];
            acc *= z / (1.0 + exp(-z));
        }
        y[(bt * H + h) * P + i] = acc;
    }
}

void ssd_reference(const linseq_ssd_problem *p, double *y, double *hT)
{
    const int64_t H = p->H, P = p->P, N = p->N, G = p->G ? p->G : 1;
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B;
    double *S = malloc((size_t)(P * N) * sizeof *S);
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t h = 0; h < H; h++) {
            int64_t first, last;
            ssd_ref_tokens(p, s, &first, &last);
            for (int64_t i = 0; i < P; i++)
                for (int64_t n = 0; n < N; n++)
                    S[i * N + n] = p->h0 ? p->h0[ssd_ref_state_at(p, s, h, i, n)] : 0.0;
            for (int64_t bt = first; bt < last; bt++) {
                const double d = ssd_ref_dt(p, bt, h), decay = exp(d * p->A[h]);
                const float *x = p->x + (bt * H + h) * P;
                const float *Bv = p->B_proj + (bt * G + h / (H / G)) * N;
                for (int64_t i = 0; i < P; i++)
                    for (int64_t n = 0; n < N; n++)
                        S[i * N + n] = decay * S[i * N + n] + d * x[i] * Bv[n];
                if (y) read_out(p, bt, h, S, y);
            }
            for (int64_t i = 0; hT && i < P; i++)
                for (int64_t n = 0; n < N; n++) hT[ssd_ref_state_at(p, s, h, i, n)] = S[i * N + n];
        }
    free(S);
}

/* ---- the definition's gradients ---------------------------------------------------- */

static void zero_d(double *x, size_t n)
{
    for (size_t i = 0; x && i < n; i++) x[i] = 0.0;
}

void ssd_reference_backward(const linseq_ssd_problem *p, const float *d_y, const float *d_hT,
                            const ssd_ref_grads *g)
{
    const int64_t H = p->H, P = p->P, N = p->N, G = p->G ? p->G : 1, BT = p->B * p->T;
    const int64_t n_seqs = p->cu_seqlens ? p->n_seqs : p->B, PN = P * N;
    /* sums first: every gradient of a shared input (B, C, D, A, dt_bias) adds up */
    zero_d(g->dx, (size_t)(BT * H * P)), zero_d(g->dz, (size_t)(BT * H * P));
    zero_d(g->ddt, (size_t)(BT * H)), zero_d(g->dA, (size_t)H), zero_d(g->ddt_bias, (size_t)H);
    zero_d(g->dB, (size_t)(BT * G * N)), zero_d(g->dC, (size_t)(BT * G * N));
    zero_d(g->dD, (size_t)(p->D_per_channel ? H * P : H));
    zero_d(g->dh0, (size_t)(n_seqs * H * PN));
    int64_t longest = 0;
    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t first, last;
        ssd_ref_tokens(p, s, &first, &last);
        if (last - first > longest) longest = last - first;
    }
    double *S = malloc((size_t)((longest + 1) * PN) * sizeof *S); /* S_t after t tokens */
    double *dS = malloc((size_t)PN * sizeof *dS);
    if (!S || !dS) abort();
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t h = 0; h < H; h++) {
            int64_t first, last;
            ssd_ref_tokens(p, s, &first, &last);
            const int64_t gr = h / (H / G);
            const double A = p->A[h];
            for (int64_t i = 0; i < P; i++)
                for (int64_t n = 0; n < N; n++) {
                    const int64_t at = ssd_ref_state_at(p, s, h, i, n);
                    S[i * N + n] = p->h0 ? p->h0[at] : 0.0;
                    dS[i * N + n] = d_hT ? d_hT[at] : 0.0;
                }
            for (int64_t bt = first; bt < last; bt++) {
                const double d = ssd_ref_dt(p, bt, h), decay = exp(d * A);
                const float *x = p->x + (bt * H + h) * P, *Bv = p->B_proj + (bt * G + gr) * N;
                const double *prev = S + (bt - first) * PN;
                double *next = S + (bt - first + 1) * PN;
                for (int64_t i = 0; i < P; i++)
                    for (int64_t n = 0; n < N; n++)
                        next[i * N + n] = decay * prev[i * N + n] + d * x[i] * Bv[n];
            }
            for (int64_t bt = last - 1; bt >= first; bt--) {
                const double d = ssd_ref_dt(p, bt, h), decay = exp(d * A);
                const int64_t o = (bt * H + h) * P;
                const float *x = p->x + o, *Bv = p->B_proj + (bt * G + gr) * N;
                const float *Cv = p->C_proj + (bt * G + gr) * N;
                const double *prev = S + (bt - first) * PN, *St = prev + PN;
                /* the read-out y = (S_t C + D x) silu(z) */
                for (int64_t i = 0; i < P; i++) {
                    const double Dv = p->D_skip ? p->D_skip[p->D_per_channel ? h * P + i : h] : 0.0;
                    double gy = d_y[o + i];
                    if (p->z) {
                        double yf = Dv * x[i];
                        for (int64_t n = 0; n < N; n++) yf += St[i * N + n] * Cv[n];
                        const double z = p->z[o + i], sig = 1.0 / (1.0 + exp(-z));
                        if (g->dz) g->dz[o + i] = gy * yf * sig * (1.0 + z * (1.0 - sig));
                        gy *= z * sig;
                    }
                    if (g->dD) g->dD[p->D_per_channel ? h * P + i : h] += gy * x[i];
                    if (g->dx) g->dx[o + i] += Dv * gy;
                    for (int64_t n = 0; n < N; n++) {
                        if (g->dC) g->dC[(bt * G + gr) * N + n] += St[i * N + n] * gy;
                        dS[i * N + n] += gy * Cv[n];
                    }
                }
                /* S_t = decay S_{t-1} + d x B^T */
                double dd = 0.0, ddecay = 0.0;
                for (int64_t i = 0; i < P; i++)
                    for (int64_t n = 0; n < N; n++) {
                        const double ds = dS[i * N + n];
                        ddecay += ds * prev[i * N + n];
                        dd += ds * x[i] * Bv[n];
                        if (g->dx) g->dx[o + i] += d * ds * Bv[n];
                        if (g->dB) g->dB[(bt * G + gr) * N + n] += d * ds * x[i];
                        dS[i * N + n] = decay * ds;
                    }
                dd += ddecay * decay * A;
                if (g->dA) g->dA[h] += ddecay * decay * d;
                /* d = clamp(softplus(dt + dt_bias)): a clamped dt passes nothing */
                const double raw = p->dt[bt * H + h];
                const double biased = raw + (p->dt_bias ? p->dt_bias[h] : 0.0);
                const double pre =
                    p->dt_softplus ? (biased > 20.0 ? biased : log1p(exp(biased))) : raw;
                double gdt =
                    p->dt_max > p->dt_min && (pre < p->dt_min || pre > p->dt_max) ? 0.0 : dd;
                if (p->dt_softplus) gdt *= 1.0 / (1.0 + exp(-biased));
                if (g->ddt) g->ddt[bt * H + h] = gdt;
                if (g->ddt_bias) g->ddt_bias[h] += gdt;
            }
            for (int64_t i = 0; g->dh0 && i < P; i++)
                for (int64_t n = 0; n < N; n++)
                    g->dh0[ssd_ref_state_at(p, s, h, i, n)] = dS[i * N + n];
        }
    free(S), free(dS);
}

/* ---- every ISA ------------------------------------------------------------------------ */

void ssd_each_isa(const char *suite, void (*tests)(ls_isa isa), const char *detail)
{
    for (int i = 0; i < LS_ISA_COUNT; i++) {
        const ls_isa isa = (ls_isa)i;
        if (!ls_isa_available(isa)) {
            printf("%s %s: not available on this CPU, skipped\n", suite, ls_isa_name(isa));
            continue;
        }
        const tu_mark mark = tu_mark_now();
        tests(isa);
        tu_mark tally = {0, 0};
        tu_tally_add(&tally, mark);
        char label[64];
        snprintf(label, sizeof label, "%s %s", suite, ls_isa_name(isa));
        tu_report(label, tally, detail);
    }
}
