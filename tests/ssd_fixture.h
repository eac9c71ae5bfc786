/* Random SSD problems for the tests (test_ssd.c, test_ssd_segment.c): the buffers a
 * linseq_ssd_problem points to, the definition in double, and the run over every ISA. */
#ifndef LS_SSD_FIXTURE_H
#define LS_SSD_FIXTURE_H

#include "linseq.h"
#include "simd/isa.h"
#include "testutil.h"

typedef struct ssd_spec {
    const char *name; /* for messages; NULL where a test names a spec by its index */
    int64_t B, T, H, P, N, G;
    bool h0, D, D_per_channel, z, softplus, n_first;
    float dt_max;      /* > 0: dt clamped to [0.05, dt_max]; 0: no clamp */
    const int64_t *cu; /* with n_seqs */
    int64_t n_seqs;
} ssd_spec;

/* Packed offsets of 4 sequences in 130 tokens, the second one empty (n_seqs 4). */
extern const int64_t ssd_cu_empty[5];

/* A problem and its buffers: every input's, optional or not (D at [H,P]), so that a test may
 * draw them all; the problem points to those its spec asks for (h0 for h0, dt_bias with
 * softplus). The element counts: x (y, z), dt, B (C), D as the problem has it, a state;
 * n_rows the sequences. */
typedef struct ssd_fixture {
    linseq_ssd_problem p;
    float *x, *dt, *A, *Bp, *Cp, *D, *z, *h0, *dt_bias;
    size_t n_y, n_dt, n_bc, n_d, n_s;
    int64_t n_rows;
} ssd_fixture;

/* The sizes, the buffers (zeros) and the problem. */
void ssd_fixture_alloc(ssd_fixture *f, const ssd_spec *s);
/* Those, with the problem's inputs drawn from seed: x, B, C, z ~ N(0,1); dt ~ U(0.01, 0.3), or
 * U(-4, 0) before softplus; A ~ U(-4, -0.5); D ~ N(0,1); h0 ~ 0.5 N(0,1); dt_bias ~ U(-1, 1). */
void ssd_fixture_make(ssd_fixture *f, const ssd_spec *s, uint64_t seed);
void ssd_fixture_free(ssd_fixture *f);

/* ---- the definition (docs/semantics.md) in double, one token at a time ---------------- */

/* dt of token bt (of the flattened B T) and head h as the recurrence uses it. */
double ssd_ref_dt(const linseq_ssd_problem *p, int64_t bt, int64_t h);
/* Sequence s's tokens [*first, *last) of the flattened B T. */
void ssd_ref_tokens(const linseq_ssd_problem *p, int64_t s, int64_t *first, int64_t *last);
/* Index of state element (row, h, i, n) in the problem's state layout. */
int64_t ssd_ref_state_at(const linseq_ssd_problem *p, int64_t row, int64_t h, int64_t i, int64_t n);
/* y [B,T,H,P] and hT (the state layout) from h0 (NULL: zeros); either may be NULL. */
void ssd_reference(const linseq_ssd_problem *p, double *y, double *hT);

/* The gradients of L = sum(y * d_y) + sum(hT * d_hT) in double, by the reverse of
 * ssd_reference's recurrence (each token's state kept on the way forward), in the layouts of
 * linseq_ssd_grads: dx and dz [B,T,H,P], ddt [B,T,H], dB and dC [B,T,G,N], dD as the problem
 * has it, dh0 the state layout, dA and ddt_bias [H]. d_hT may be NULL (zero); a NULL member is
 * not computed. Through the clamp a clamped dt passes no gradient, as the kernels take it. */
typedef struct ssd_ref_grads {
    double *dx, *ddt, *dA, *dB, *dC, *dD, *dz, *dh0, *ddt_bias;
} ssd_ref_grads;
void ssd_reference_backward(const linseq_ssd_problem *p, const float *d_y, const float *d_hT,
                            const ssd_ref_grads *g);

/* tests(isa) once per ISA the CPU has, each ISA's checks reported on a line of their own,
 * "<suite> <isa>: ..., <detail>". */
void ssd_each_isa(const char *suite, void (*tests)(ls_isa isa), const char *detail);

#endif
