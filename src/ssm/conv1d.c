/* linseq_conv1d_forward: validation, then the fast float32 causal depthwise conv.
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

#define FN "linseq_conv1d_forward"

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

linseq_status linseq_conv1d_forward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out)
{
    ls_clear_error();
    if (!p)
        return ls_fail(FN, LINSEQ_ERR_NULL_POINTER,
                       "problem is NULL; expected a linseq_conv1d_problem");
    linseq_status st;
    if ((st = ls_check_min(FN, "B", p->B, 1)) || (st = ls_check_min(FN, "T", p->T, 1)) ||
        (st = ls_check_min(FN, "D", p->D, 1)) || (st = ls_check_min(FN, "W", p->W, 1)))
        return st;
    if ((st = ssm_check_common(FN, exec, p->cu_seqlens, p->n_seqs))) return st;
    if (!ls_activation_valid(p->activation))
        return ls_fail(FN, LINSEQ_ERR_INVALID_ENUM,
                       "activation = %d; expected a linseq_activation (LINSEQ_ACT_DEFAULT .. "
                       "LINSEQ_ACT_RELU)",
                       (int)p->activation);

    const int64_t B = p->B, T = p->T, D = p->D, W = p->W;
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, B);
    ls_args a = {.fn = FN};
    ls_arg(&a, "x", "B,T,D", p->x, true, LS_IN, sizeof(float), 3, B, T, D);
    ls_arg(&a, "weight", "D,W", p->weight, true, LS_IN, sizeof(float), 2, D, W);
    ls_arg(&a, "bias", "D", p->bias, false, LS_IN, sizeof(float), 1, D);
    ls_arg(&a, "cu_seqlens", "n_seqs+1", p->cu_seqlens, false, LS_IN, sizeof(int64_t), 1,
           ssm_cu_entries(p->cu_seqlens, p->n_seqs));
    ls_arg(&a, "y", "B,T,D", y, true, LS_OUT, sizeof(float), 3, B, T, D);
    /* With W == 1 there is no state: the state pointers are neither read nor written. */
    if (W > 1) {
        ls_arg(&a, "conv_state", "N_seq,D,W-1", p->conv_state, false, LS_IN, sizeof(float), 3,
               n_seqs, D, W - 1);
        ls_arg(&a, "conv_state_out", "N_seq,D,W-1", conv_state_out, false, LS_OUT,
               sizeof(float), 3, n_seqs, D, W - 1)
            ->may_alias = p->conv_state;
    }
    if ((st = ls_args_validate(&a))) return st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(FN, p->cu_seqlens, p->n_seqs, B, T)))
        return st;

    st = conv_run(p, exec, y, W > 1 ? conv_state_out : NULL);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(FN, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}
