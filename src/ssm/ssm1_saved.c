/* The saved forward state of SSM1 training: what linseq_ssm1_forward_train keeps so that
 * linseq_ssm1_backward_saved need not run the recurrence again to find its checkpoints. A
 * header (to check that the backward describes the same problem and sequence boundaries), then the state before every
 * SSM_BWD_SEGMENT-token segment of every sequence, sequence after sequence: ceil(L /
 * SSM_BWD_SEGMENT) states of a sequence of L tokens, each state-major [N][D]. Rows of channels
 * make the layout independent of how the forward (blocks of SSM_LANES channels) and the
 * backward (blocks inside one group) split the channels: each copies rows of its own lanes. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

static const char MAGIC[8] = {'l', 's', 'S', 'S', 'M', '1', 's', '2'};

/* What the states depend on besides the inputs' values: a block written for another problem
 * describes other states. */
enum { FLAG_CHANNEL_FIRST = 1, FLAG_SOFTPLUS = 2, FLAG_DT_BIAS = 4, FLAG_H0 = 8 };

typedef struct {
    char magic[8];
    int64_t segment, flags, B, T, D, N, G, n_seqs, n_checkpoints;
    uint64_t seqlens; /* ls_seqlens_fingerprint */
} saved_header;

_Static_assert(sizeof(saved_header) <= SSM1_SAVED_HEADER_BYTES, "saved header size");

/* The checkpoints of a sequence of len tokens. */
static int64_t checkpoints_of(int64_t len) { return (len + SSM_BWD_SEGMENT - 1) / SSM_BWD_SEGMENT; }

/* The checkpoint count of the problem, and with `first` (n_seqs + 1 entries) each sequence's
 * first checkpoint. Dense problems are counted without a loop over B: the size query runs
 * before any tensor bounds B. */
static int64_t count_checkpoints(const linseq_ssm1_problem *p, int64_t *first)
{
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    if (!first && !p->cu_seqlens) {
        int64_t n;
        return ls_mul_ok(&n, 2, p->B, checkpoints_of(p->T)) ? n : -1;
    }
    int64_t total = 0;
    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        if (first) first[s] = total;
        total += checkpoints_of(len); /* at most B*T tokens in all: no overflow */
    }
    if (first) first[n_seqs] = total;
    return total;
}

linseq_status ls_ssm1_saved_size_of(const char *fn, const linseq_ssm1_problem *p, size_t *bytes)
{
    const int64_t n = count_checkpoints(p, NULL);
    int64_t floats;
    if (n < 0 || !ls_mul_ok(&floats, 3, n, p->N, p->D) ||
        floats > (int64_t)((PTRDIFF_MAX - SSM1_SAVED_HEADER_BYTES) / sizeof(float)))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the saved states (one D*N state per %d tokens of each sequence) overflow "
                       "the address space",
                       SSM_BWD_SEGMENT);
    *bytes = SSM1_SAVED_HEADER_BYTES + (size_t)floats * sizeof(float);
    return LINSEQ_OK;
}

static saved_header header_of(const linseq_ssm1_problem *p)
{
    saved_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    h.segment = SSM_BWD_SEGMENT;
    h.flags = (p->channel_first ? FLAG_CHANNEL_FIRST : 0) | (p->dt_softplus ? FLAG_SOFTPLUS : 0) |
              (p->dt_bias ? FLAG_DT_BIAS : 0) | (p->h0 ? FLAG_H0 : 0);
    h.B = p->B;
    h.T = p->T;
    h.D = p->D;
    h.N = p->N;
    h.G = p->G ? p->G : 1;
    h.n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    h.n_checkpoints = count_checkpoints(p, NULL);
    h.seqlens = ls_seqlens_fingerprint(p->cu_seqlens, p->n_seqs, p->B, p->T);
    return h;
}

void ls_ssm1_saved_write_header(const linseq_ssm1_problem *p, void *saved)
{
    unsigned char block[SSM1_SAVED_HEADER_BYTES] = {0};
    const saved_header h = header_of(p);
    memcpy(block, &h, sizeof h);
    memcpy(saved, block, sizeof block);
}

/* " channel_first dt_softplus ..." for the flags in f, written into buf. */
static const char *flag_names(int64_t f, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s", f & FLAG_CHANNEL_FIRST ? " channel_first" : "",
             f & FLAG_SOFTPLUS ? " dt_softplus" : "", f & FLAG_DT_BIAS ? " dt_bias" : "",
             f & FLAG_H0 ? " h0" : "");
    if (!buf[0]) snprintf(buf, size, " none");
    return buf;
}

static linseq_status check_header(const char *fn, const linseq_ssm1_problem *p, const void *saved)
{
    saved_header h;
    memcpy(&h, saved, sizeof h);
    const saved_header want = header_of(p);
    if (memcmp(h.magic, MAGIC, sizeof MAGIC) != 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was not written by linseq_ssm1_forward_train");
    if (h.segment != want.segment)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' holds a state every %lld tokens; this library expects one every "
                       "%lld (written by another version: run linseq_ssm1_forward_train again)",
                       (long long)h.segment, (long long)want.segment);
    if (h.B != want.B || h.T != want.T || h.D != want.D || h.N != want.N || h.G != want.G ||
        h.n_seqs != want.n_seqs || h.n_checkpoints != want.n_checkpoints)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "'saved' describes B=%lld T=%lld D=%lld N=%lld G=%lld with %lld sequences "
                       "(%lld states); this problem has B=%lld T=%lld D=%lld N=%lld G=%lld with "
                       "%lld sequences (%lld states): pass the forward's problem",
                       (long long)h.B, (long long)h.T, (long long)h.D, (long long)h.N,
                       (long long)h.G, (long long)h.n_seqs, (long long)h.n_checkpoints,
                       (long long)want.B, (long long)want.T, (long long)want.D, (long long)want.N,
                       (long long)want.G, (long long)want.n_seqs, (long long)want.n_checkpoints);
    if (h.seqlens != want.seqlens)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was written for other sequence boundaries: this problem's "
                       "cu_seqlens gives %lld sequences of other lengths than the forward's (pass "
                       "the forward's cu_seqlens)",
                       (long long)want.n_seqs);
    if (h.flags != want.flags) {
        char had[64], has[64];
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was written for a problem with options:%s; this problem has:%s "
                       "(pass the forward's problem)",
                       flag_names(h.flags, had, sizeof had),
                       flag_names(want.flags, has, sizeof has));
    }
    return LINSEQ_OK;
}

linseq_status ls_ssm1_saved_layout(const char *fn, const linseq_ssm1_problem *p, const void *saved,
                                   size_t saved_bytes, int64_t **first)
{
    size_t need;
    linseq_status st;
    /* the header first: a block of another problem is named as such, not as too small */
    if (saved && saved_bytes < SSM1_SAVED_HEADER_BYTES)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                       "saved_bytes = %zu is smaller than the saved header (%d bytes)", saved_bytes,
                       SSM1_SAVED_HEADER_BYTES);
    if ((saved && (st = check_header(fn, p, saved))) || (st = ls_ssm1_saved_size_of(fn, p, &need)))
        return st;
    if (saved_bytes < need)
        return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                       "saved_bytes = %zu; expected at least %zu (linseq_ssm1_saved_size)",
                       saved_bytes, need);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    int64_t *at = malloc((size_t)(n_seqs + 1) * sizeof *at);
    if (!at) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "cannot allocate the saved layout");
    count_checkpoints(p, at);
    *first = at;
    return LINSEQ_OK;
}
