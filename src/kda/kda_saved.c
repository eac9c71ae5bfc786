/* The saved forward state of KDA training: what linseq_kda_forward_train keeps so that
 * linseq_kda_backward_saved need not run the forward again. A 128-byte header (to check that
 * the backward describes the same problem, sequence boundaries, options, mode and chunk
 * size), then one block per
 * (sequence, value head) item in item order: the state before every chunk (every chunk_size
 * tokens in recurrent mode), and in chunked mode every token's delta u. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/validate.h"
#include "kda/kda_internal.h"

static const char MAGIC[8] = {'l', 's', 'K', 'D', 'A', 's', 'v', '2'};

/* What the saved states depend on besides the inputs' values and sizes: a block written for
 * another problem describes other states. */
enum {
    FLAG_L2NORM = 1,
    FLAG_BETA_LOGIT = 2,
    FLAG_GATE_IN_KERNEL = 4,
    FLAG_H0 = 8,
    FLAG_A_LOG = 16,
    FLAG_DT_BIAS = 32,
    FLAG_NO_DELTA = 64 /* beta NULL: gated linear attention */
};

typedef struct {
    char magic[8];
    int64_t chunked, chunk, K, V, HV, tokens, n_seqs;
    int64_t decay, flags;
    float lower_bound;
    float l2norm_eps; /* as the problem gives it (0: the default) */
    uint64_t seqlens; /* ls_seqlens_fingerprint */
} saved_header;

_Static_assert(sizeof(saved_header) <= KDA_SAVED_HEADER_BYTES, "saved header size");

/* Floats of one item's block, rounded to 64 bytes; -1 on overflow. */
static int64_t item_floats(const kda_plan *pl, int64_t len)
{
    const int64_t C = pl->chunk ? pl->chunk : pl->segment;
    int64_t states, deltas = 0;
    /* linseq_kda_saved_size gets here before any tensor bounds K, V or T, so neither K*V nor
     * len + C - 1 may be formed unchecked */
    if (!ls_mul_ok(&states, 3, len / C + (len % C != 0), pl->p->K, pl->p->V)) return -1;
    if (pl->chunk && !ls_mul_ok(&deltas, 2, len, pl->p->V)) return -1;
    if (states > INT64_MAX - deltas - 16) return -1;
    return (states + deltas + 15) / 16 * 16;
}

linseq_status kda_saved_layout(const char *fn, const kda_plan *pl, int64_t *offsets, size_t *bytes)
{
    int64_t total = 0;
    const bool closed_form = !offsets && !pl->p->cu_seqlens;
    if (closed_form) {
        /* B blocks of T tokens, without a loop over B: the size query runs before any tensor
         * bounds B, and B = 2^40 must be answered (or refused), not iterated. */
        const int64_t f = item_floats(pl, pl->p->T);
        if (f < 0 || !ls_mul_ok(&total, 3, f, pl->HV, pl->n_seqs))
            return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                           "the saved states (one K*V state per chunk per sequence and head) "
                           "overflow the address space");
    }
    for (int64_t n = 0; !closed_form && n < pl->n_seqs; n++) {
        int64_t start, len;
        kda_seq_range(pl, n, &start, &len);
        const int64_t f = item_floats(pl, len);
        int64_t block;
        if (f < 0 || !ls_mul_ok(&block, 2, f, pl->HV) || total > INT64_MAX / 4 - block)
            return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                           "the saved states (one K*V state per chunk per sequence and head) "
                           "overflow the address space");
        for (int64_t hv = 0; offsets && hv < pl->HV; hv++)
            offsets[n * pl->HV + hv] = total + hv * f;
        total += block;
    }
    if (total > (int64_t)((PTRDIFF_MAX - KDA_SAVED_HEADER_BYTES) / sizeof(float)))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW, "the saved states overflow the address space");
    *bytes = KDA_SAVED_HEADER_BYTES + (size_t)total * sizeof(float);
    return LINSEQ_OK;
}

static saved_header header_of(const kda_plan *pl)
{
    saved_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    h.chunked = pl->chunk != 0;
    h.chunk = pl->chunk ? pl->chunk : pl->segment;
    h.K = pl->p->K;
    h.V = pl->p->V;
    h.HV = pl->HV;
    h.tokens = pl->p->B * pl->p->T;
    h.n_seqs = pl->n_seqs;
    const linseq_kda_problem *p = pl->p;
    h.decay = p->decay;
    h.flags = (p->qk_l2norm ? FLAG_L2NORM : 0) | (p->beta_is_logit ? FLAG_BETA_LOGIT : 0) |
              (p->gate_in_kernel ? FLAG_GATE_IN_KERNEL : 0) | (p->h0 ? FLAG_H0 : 0) |
              (p->beta ? 0 : FLAG_NO_DELTA);
    if (p->gate_in_kernel) h.flags |= (p->A_log ? FLAG_A_LOG : 0) | (p->dt_bias ? FLAG_DT_BIAS : 0);
    h.lower_bound = p->gate_in_kernel ? p->lower_bound : 0.0f;
    h.l2norm_eps = p->qk_l2norm ? p->l2norm_eps : 0.0f;
    h.seqlens = ls_seqlens_fingerprint(p->cu_seqlens, p->n_seqs, p->B, p->T);
    return h;
}

void kda_saved_write_header(const kda_plan *pl, void *saved)
{
    unsigned char block[KDA_SAVED_HEADER_BYTES] = {0};
    const saved_header h = header_of(pl);
    memcpy(block, &h, sizeof h);
    memcpy(saved, block, sizeof block);
}

/* " qk_l2norm beta_is_logit ..." for the flags in f, written into buf. */
static const char *flag_names(int64_t f, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s%s%s%s", f & FLAG_L2NORM ? " qk_l2norm" : "",
             f & FLAG_BETA_LOGIT ? " beta_is_logit" : "",
             f & FLAG_GATE_IN_KERNEL ? " gate_in_kernel" : "", f & FLAG_H0 ? " h0" : "",
             f & FLAG_A_LOG ? " A_log" : "", f & FLAG_DT_BIAS ? " dt_bias" : "",
             f & FLAG_NO_DELTA ? " no_delta(beta NULL)" : "");
    if (!buf[0]) snprintf(buf, size, " none");
    return buf;
}

linseq_status kda_saved_check_header(const char *fn, const kda_plan *pl, const void *saved)
{
    saved_header h;
    memcpy(&h, saved, sizeof h);
    const saved_header want = header_of(pl);
    if (memcmp(h.magic, MAGIC, sizeof MAGIC) != 0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was not written by linseq_kda_forward_train");
    if (h.chunked != want.chunked || h.chunk != want.chunk)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was written in %s mode with chunk size %lld; this call asks for "
                       "%s mode with chunk size %lld (pass the forward's exec)",
                       h.chunked ? "chunked" : "recurrent", (long long)h.chunk,
                       want.chunked ? "chunked" : "recurrent", (long long)want.chunk);
    if (h.K != want.K || h.V != want.V || h.HV != want.HV || h.tokens != want.tokens ||
        h.n_seqs != want.n_seqs)
        return ls_fail(fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "'saved' describes K=%lld V=%lld HV=%lld, %lld tokens in %lld sequences; "
                       "this problem has K=%lld V=%lld HV=%lld, %lld tokens in %lld sequences",
                       (long long)h.K, (long long)h.V, (long long)h.HV, (long long)h.tokens,
                       (long long)h.n_seqs, (long long)want.K, (long long)want.V,
                       (long long)want.HV, (long long)want.tokens, (long long)want.n_seqs);
    if (h.seqlens != want.seqlens)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was written for other sequence boundaries: this problem's "
                       "cu_seqlens gives %lld sequences of other lengths than the forward's (pass "
                       "the forward's cu_seqlens)",
                       (long long)want.n_seqs);
    if (h.flags != want.flags || h.decay != want.decay ||
        memcmp(&h.lower_bound, &want.lower_bound, sizeof h.lower_bound) != 0 ||
        memcmp(&h.l2norm_eps, &want.l2norm_eps, sizeof h.l2norm_eps) != 0) {
        char had[96], has[96];
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "'saved' was written for a problem with decay %lld, lower_bound %g, "
                       "l2norm_eps %g and options:%s; this problem has decay %lld, lower_bound "
                       "%g, l2norm_eps %g and options:%s (pass the forward's problem)",
                       (long long)h.decay, (double)h.lower_bound, (double)h.l2norm_eps,
                       flag_names(h.flags, had, sizeof had), (long long)want.decay,
                       (double)want.lower_bound, (double)want.l2norm_eps,
                       flag_names(want.flags, has, sizeof has));
    }
    return LINSEQ_OK;
}

linseq_status kda_saved_offsets(const char *fn, const kda_plan *pl, size_t saved_bytes,
                                int64_t **offsets)
{
    size_t need;
    int64_t *at = malloc((size_t)(pl->n_seqs * pl->HV) * sizeof *at);
    if (!at) return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY, "cannot allocate the saved layout");
    linseq_status st = kda_saved_layout(fn, pl, at, &need);
    if (!st && saved_bytes < need)
        st = ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                     "saved_bytes = %zu; expected at least %zu (linseq_kda_saved_size)",
                     saved_bytes, need);
    if (st) {
        free(at);
        return st;
    }
    *offsets = at;
    return LINSEQ_OK;
}
