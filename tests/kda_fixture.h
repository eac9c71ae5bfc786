/* Random KDA problems for the tests: owns the buffers a linseq_kda_problem points to. */
#ifndef LS_KDA_FIXTURE_H
#define LS_KDA_FIXTURE_H

#include "linseq.h"
#include "testutil.h"

typedef enum {
    GATE_ZERO,    /* g = 0 exactly: no decay at all */
    GATE_RAND,    /* g = -mag * U(0,2) */
    GATE_EXTREME, /* mostly -mag*U(0,2), with -1000, -inf and 0 sprinkled in */
} gate_regime;

typedef struct {
    int64_t B, T, H, HV, K, V;
    linseq_decay decay;
    bool l2norm, with_h0, v_first;
    bool no_delta; /* beta NULL: gated linear attention (beta is still filled, unread) */
    double gmag;
    gate_regime regime;
    int64_t n_seqs;    /* 0: no varlen */
    const int64_t *cu; /* n_seqs + 1 offsets when n_seqs > 0 */
    uint64_t seed;
} kda_spec;

typedef struct {
    kda_spec s;
    linseq_kda_problem p;
    float *q, *k, *v, *beta, *g, *h0;
    int64_t *cu;
    int64_t n_rows; /* state rows */
    size_t n_qk, n_v, n_beta, n_g, n_state;
} kda_fixture;

void kda_fixture_make(kda_fixture *f, const kda_spec *s);
void kda_fixture_free(kda_fixture *f);

#endif
