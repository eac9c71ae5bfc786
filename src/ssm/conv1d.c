/* linseq_conv1d_forward and linseq_conv1d_backward: one validation of the problem for both;
 * the fast float32 causal depthwise conv (the backward kernel is in conv1d_bwd.c).
 *
 * A work item is (sequence, block of SSM_LANES channels). For each token the W taps are added
 * one after another as whole rows of channels, reading x contiguously along D; the taps that
 * reach back before the sequence read the conv state instead. Every item runs the same
 * arithmetic whichever thread takes it, and the tokens of a chained call (the second starting
 * from the first's conv_state_out) sum the same products in the same order as one call. */
#include <stdlib.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "ssm/ssm_internal.h"

typedef struct conv_plan {
    const linseq_conv1d_problem *p;
    int64_t n_blocks;
    linseq_activation act;
    float *y, *state_out;
    float *workspace;
    size_t thread_floats; /* taps [W][SSM_LANES], acc [SSM_LANES], column [SSM_LANES]      */
} conv_plan;

/* Called with lanes == SSM_LANES (a literal) for full blocks: a constant trip count after
 * inlining, which gcc vectorises at -O2. */
static inline void add_tap(int64_t lanes, float *restrict acc, const float *restrict weight,
                           const float *restrict input)
{
    for (int64_t l = 0; l < lanes; l++) acc[l] += weight[l] * input[l];
}

static inline void copy_lanes(int64_t lanes, float *restrict dst, const float *restrict src)
{
    for (int64_t l = 0; l < lanes; l++) dst[l] = src[l];
}

static void conv_item(void *ctx, int64_t item, int thread)
{
    const conv_plan *pl = ctx;
    const linseq_conv1d_problem *p = pl->p;
    const int64_t D = p->D, W = p->W;
    const int64_t seq = item / pl->n_blocks;
    const int64_t d0 = item % pl->n_blocks * SSM_LANES;
    const int64_t lanes = D - d0 < SSM_LANES ? D - d0 : SSM_LANES;
    const bool full = lanes == SSM_LANES;
    /* The state rows of this block: channel d0 + l starts at state[l * (W-1)]. */
    const float *state = W > 1 && p->conv_state ? p->conv_state + (seq * D + d0) * (W - 1) : NULL;

    float *taps = pl->workspace + (size_t)thread * pl->thread_floats;
    float *acc = taps + W * SSM_LANES;
    float *column = acc + SSM_LANES;
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < W; j++) taps[j * SSM_LANES + l] = p->weight[(d0 + l) * W + j];

    int64_t start, len;
    ssm_seq_range(p->cu_seqlens, p->T, seq, &start, &len);
    for (int64_t t = 0; t < len; t++) {
        for (int64_t l = 0; l < lanes; l++) acc[l] = p->bias ? p->bias[d0 + l] : 0.0f;
        /* Tap j reads xs[t + j]: the state for t + j < W-1, else x at token t + j - (W-1). */
        for (int64_t j = 0; j < W; j++) {
            const int64_t k = t + j;
            const float *input;
            if (k < W - 1) {
                for (int64_t l = 0; l < lanes; l++)
                    column[l] = state ? state[l * (W - 1) + k] : 0.0f;
                input = column;
            } else {
                input = p->x + (start + k - (W - 1)) * D + d0;
            }
            if (full)
                add_tap(SSM_LANES, acc, taps + j * SSM_LANES, input);
            else
                add_tap(lanes, acc, taps + j * SSM_LANES, input);
        }
        float *y_t = pl->y + (start + t) * D + d0;
        /* The per-element activation switch keeps a loop scalar: identity (the default)
         * skips it, leaving a vectorised copy. */
        if (pl->act != LINSEQ_ACT_IDENTITY)
            for (int64_t l = 0; l < lanes; l++) acc[l] = ls_activate(pl->act, acc[l]);
        if (full)
            copy_lanes(SSM_LANES, y_t, acc);
        else
            copy_lanes(lanes, y_t, acc);
    }

    /* state_out = xs[len .. len + W-2]. Written after every y of the block, and in ascending
     * order: entry i reads xs[len + i] with len + i >= i, so state_out == conv_state works in
     * place even when len < W-1 and the new state still holds part of the old one. */
    if (W > 1 && pl->state_out) {
        for (int64_t l = 0; l < lanes; l++) {
            float *out_row = pl->state_out + (seq * D + d0 + l) * (W - 1);
            for (int64_t i = 0; i < W - 1; i++) {
                const int64_t k = len + i;
                if (k < W - 1)
                    out_row[i] = state ? state[l * (W - 1) + k] : 0.0f;
                else
                    out_row[i] = p->x[(start + k - (W - 1)) * D + d0 + l];
            }
        }
    }
}

static linseq_status conv_run(const linseq_conv1d_problem *p, const linseq_exec *exec, float *y,
                              float *state_out)
{
    conv_plan pl = {.p = p, .y = y, .state_out = state_out, .act = conv1d_activation(p)};
    pl.n_blocks = (p->D + SSM_LANES - 1) / SSM_LANES;
    const int64_t n_items = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B) * pl.n_blocks;
    const int n_threads = ls_resolve_threads(exec, n_items, 2.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);

    /* Rounded up to 64 bytes so that threads never share a cache line. */
    int64_t thread_floats, total_bytes;
    if (p->W > INT64_MAX / SSM_LANES - 3) return LINSEQ_ERR_OUT_OF_MEMORY;
    thread_floats = ((p->W + 2) * SSM_LANES + 15) / 16 * 16;
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(n_items, n_threads, conv_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}

/* The sizes, options and exec of a problem, then its input tensors appended to the argument
 * table `a` (whose fn names the entry point). Run first by both entry points, so the backward
 * accepts exactly the problems the forward accepts. */
static linseq_status check_problem(ls_args *a, const linseq_conv1d_problem *p,
                                   const linseq_exec *exec)
{
    const char *fn = a->fn;
    if (!p)
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "problem is NULL; expected a linseq_conv1d_problem");
    linseq_status st;
    if ((st = ls_check_min(fn, "B", p->B, 1)) || (st = ls_check_min(fn, "T", p->T, 1)) ||
        (st = ls_check_min(fn, "D", p->D, 1)) || (st = ls_check_min(fn, "W", p->W, 1)))
        return st;
    if ((st = ssm_check_common(fn, exec, p->cu_seqlens, p->n_seqs))) return st;
    if (!ls_activation_valid(p->activation))
        return ls_fail(fn, LINSEQ_ERR_INVALID_ENUM,
                       "activation = %d; expected a linseq_activation (LINSEQ_ACT_DEFAULT .. "
                       "LINSEQ_ACT_RELU)",
                       (int)p->activation);

    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    ls_arg(a, "x", "B,T,D", p->x, true, LS_IN, sizeof(float), 3, B, T, D);
    ls_arg(a, "weight", "D,W", p->weight, true, LS_IN, sizeof(float), 2, D, W);
    ls_arg(a, "bias", "D", p->bias, false, LS_IN, sizeof(float), 1, D);
    ls_arg(a, "cu_seqlens", "n_seqs+1", p->cu_seqlens, false, LS_IN, sizeof(int64_t), 1,
           ssm_cu_entries(p->cu_seqlens, p->n_seqs));
    /* With W == 1 there is no state: the state pointers are neither read nor written. */
    if (W > 1)
        ls_arg(a, "conv_state", "N_seq,D,W-1", p->conv_state, false, LS_IN, sizeof(float), 3,
               n_seqs, D, W - 1);
    return LINSEQ_OK;
}

linseq_status linseq_conv1d_forward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_forward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B), W = p->W;
    ls_arg(&a, "y", "B,T,D", y, true, LS_OUT, sizeof(float), 3, p->B, p->T, p->D);
    if (W > 1)
        ls_arg(&a, "conv_state_out", "N_seq,D,W-1", conv_state_out, false, LS_OUT,
               sizeof(float), 3, n_seqs, p->D, W - 1)
            ->may_alias = p->conv_state;
    if ((st = ssm_check_table(&a, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;

    st = conv_run(p, exec, y, W > 1 ? conv_state_out : NULL);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}

linseq_status linseq_conv1d_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_backward"};
    linseq_status st = check_problem(&a, p, exec);
    if (st) return st;
    if (!grads)
        return ls_fail(a.fn, LINSEQ_ERR_NULL_POINTER,
                       "grads is NULL; expected a linseq_conv1d_grads (NULL members are skipped)");
    /* A bias gradient without a bias would be silently meaningless; dconv_state is allowed
     * without conv_state (the gradient at the zero state). */
    if (grads->dbias && !p->bias)
        return ls_fail(a.fn, LINSEQ_ERR_INVALID_VALUE,
                       "dbias is given but bias is NULL: there is no bias to differentiate; "
                       "pass dbias = NULL");

    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    ls_arg(&a, "d_y", "B,T,D", d_y, true, LS_IN, sizeof(float), 3, B, T, D);
    if (W > 1)
        ls_arg(&a, "d_conv_state_out", "N_seq,D,W-1", d_conv_state_out, false, LS_IN,
               sizeof(float), 3, n_seqs, D, W - 1);
    ls_arg(&a, "dx", "B,T,D", grads->dx, false, LS_OUT, sizeof(float), 3, B, T, D);
    ls_arg(&a, "dweight", "D,W", grads->dweight, false, LS_OUT, sizeof(float), 2, D, W);
    ls_arg(&a, "dbias", "D", grads->dbias, false, LS_OUT, sizeof(float), 1, D);
    if (W > 1)
        ls_arg(&a, "dconv_state", "N_seq,D,W-1", grads->dconv_state, false, LS_OUT,
               sizeof(float), 3, n_seqs, D, W - 1);
    if ((st = ssm_check_table(&a, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;

    /* With W == 1 the state gradients do not exist: the kernel never sees their pointers. */
    linseq_conv1d_grads used = *grads;
    if (W == 1) used.dconv_state = NULL;
    st = ls_conv1d_scan_backward(p, exec, d_y, W > 1 ? d_conv_state_out : NULL, &used);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}
