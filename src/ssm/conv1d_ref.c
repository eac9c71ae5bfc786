/* The causal depthwise conv1d references: the formulas of linseq.h in double, and their
 * reverse mode.
 *
 * Per (sequence, channel) the padded input is xs = concat(conv_state or zeros [W-1], x), so
 * xs[k] for k < W-1 is the state and xs[W-1+t] is x_t. */
#include <stdlib.h>
#include <string.h>

#include "core/activation.h"
#include "ssm/ssm_internal.h"

/* One (sequence, channel)'s conv state: position i at p[i * step]; p NULL for zeros. */
typedef struct state_col {
    const float *p;
    int64_t step;
} state_col;

/* Sequence s, channel d of the problem's conv_state (W > 1). */
static state_col state_col_of(const linseq_conv1d_problem *p, int64_t s, int64_t d)
{
    const int64_t L = p->W - 1;
    if (!p->conv_state) return (state_col){NULL, 0};
    return (state_col){p->conv_state + conv1d_state_at(p, s, d, 0, L),
                       conv1d_state_layout(p, L).position};
}

/* xs[k] of one (sequence, channel). */
static double padded_input(const linseq_conv1d_problem *p, state_col state, int64_t start,
                           int64_t d, int64_t k)
{
    const int64_t W = p->W;
    if (k < W - 1) return state.p ? state.p[k * state.step] : 0.0;
    return p->x[(start + k - (W - 1)) * p->D + d];
}

/* weight[d][j] in the problem's layout; its index for dweight. */
static int64_t weight_index(const linseq_conv1d_problem *p, int64_t d, int64_t j)
{
    const conv1d_weight_strides ws = conv1d_weight_layout(p);
    return d * ws.channel + j * ws.tap;
}

static double weight_at(const linseq_conv1d_problem *p, int64_t d, int64_t j)
{
    return p->weight[weight_index(p, d, j)];
}

/* The outputs of one forward: either float (rounded on store) or double, each may be NULL. */
typedef struct ref_outputs {
    float *y, *state_out;
    double *y64, *state_out64;
} ref_outputs;

/* bias + sum_j weight[d,j] xs[t+j]: the argument of the activation. */
static double pre_activation(const linseq_conv1d_problem *p, state_col state, int64_t start,
                             int64_t d, int64_t t)
{
    double acc = p->bias ? p->bias[d] : 0.0;
    for (int64_t j = 0; j < p->W; j++)
        acc += weight_at(p, d, j) * padded_input(p, state, start, d, t + j);
    return acc;
}

static void reference_forward(const linseq_conv1d_problem *p, const ref_outputs *out)
{
    const int64_t D = p->D, W = p->W;
    const linseq_activation act = conv1d_activation(p);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);

    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        for (int64_t d = 0; d < D; d++) {
            const state_col state = W > 1 ? state_col_of(p, s, d) : (state_col){NULL, 0};
            for (int64_t t = 0; t < len; t++) {
                const double y = ls_activate_ref(act, pre_activation(p, state, start, d, t));
                if (out->y64) out->y64[(start + t) * D + d] = y;
                if (out->y) out->y[(start + t) * D + d] = (float)y;
            }
            /* The last W-1 entries of xs. Ascending order reads xs[len + i] before writing
             * entry i (len + i >= i), so an in-place state_out == conv_state is safe. */
            if (W == 1) continue;
            for (int64_t i = 0; i < W - 1; i++) {
                const double v = padded_input(p, state, start, d, len + i);
                const int64_t at = conv1d_state_at(p, s, d, i, W - 1);
                if (out->state_out64) out->state_out64[at] = v;
                if (out->state_out) out->state_out[at] = (float)v;
            }
        }
    }
}

void ls_conv1d_reference(const linseq_conv1d_problem *p, float *y, float *state_out)
{
    const ref_outputs out = {.y = y, .state_out = state_out};
    reference_forward(p, &out);
}

void ls_conv1d_reference_f64(const linseq_conv1d_problem *p, double *y, double *state_out)
{
    const ref_outputs out = {.y64 = y, .state_out64 = state_out};
    reference_forward(p, &out);
}

linseq_status ls_conv1d_backward_reference(const linseq_conv1d_problem *p, const float *d_y,
                                           const float *d_conv_state_out,
                                           const ls_conv1d_grads_f64 *grads)
{
    const int64_t D = p->D, W = p->W;
    const linseq_activation act = conv1d_activation(p);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);
    /* dxs[k]: the gradient of xs[k] of one (sequence, channel); one spare entry so that the
     * size is never 0 (W == 1 with only empty sequences). */
    double *dxs = malloc((size_t)(longest + W) * sizeof *dxs);
    if (!dxs) return LINSEQ_ERR_OUT_OF_MEMORY;
    if (grads->dweight) memset(grads->dweight, 0, (size_t)(D * W) * sizeof(double));
    if (grads->dbias) memset(grads->dbias, 0, (size_t)D * sizeof(double));

    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        for (int64_t d = 0; d < D; d++) {
            const state_col conv_state = W > 1 ? state_col_of(p, s, d) : (state_col){NULL, 0};
            memset(dxs, 0, (size_t)(len + W - 1) * sizeof *dxs);
            /* conv_state_out = xs[len .. len + W-2] */
            if (W > 1 && d_conv_state_out)
                for (int64_t i = 0; i < W - 1; i++)
                    dxs[len + i] += d_conv_state_out[conv1d_state_at(p, s, d, i, W - 1)];
            /* y_t = act(pre_t), pre_t = bias + sum_j weight[j] xs[t+j] */
            for (int64_t t = 0; t < len; t++) {
                const double pre = pre_activation(p, conv_state, start, d, t);
                const double d_pre = d_y[(start + t) * D + d] * ls_activate_grad_ref(act, pre);
                if (grads->dbias) grads->dbias[d] += d_pre;
                for (int64_t j = 0; j < W; j++) {
                    dxs[t + j] += d_pre * weight_at(p, d, j);
                    if (grads->dweight)
                        grads->dweight[weight_index(p, d, j)] +=
                            d_pre * padded_input(p, conv_state, start, d, t + j);
                }
            }
            if (W > 1 && grads->dconv_state)
                for (int64_t k = 0; k < W - 1; k++)
                    grads->dconv_state[conv1d_state_at(p, s, d, k, W - 1)] = dxs[k];
            if (grads->dx)
                for (int64_t t = 0; t < len; t++) grads->dx[(start + t) * D + d] = dxs[W - 1 + t];
        }
    }
    free(dxs);
    return LINSEQ_OK;
}

/* ---- decode over a pool of states (linseq_conv1d_decode), the header's words literally ---- */

/* Element (b, t, d) of x in any layout. */
static double x_at(const linseq_conv1d_problem *p, int64_t b, int64_t t, int64_t d)
{
    const ssm_view v = ssm_view_of(p->x, p->x_strides, p->channel_first, p->T, p->D, 1);
    return v.base[b * v.batch + t * v.token + d * v.channel];
}

linseq_status ls_conv1d_decode_reference(const linseq_conv1d_problem *p, float *state,
                                         int64_t state_len, const int64_t *rows,
                                         const int64_t *cache_seqlens, double *y)
{
    const int64_t B = p->B, T = p->T, D = p->D, W = p->W, L = state_len;
    const linseq_activation act = conv1d_activation(p);
    double *xs = malloc((size_t)(W - 1 + T) * sizeof *xs);
    double *all = malloc((size_t)(L + T) * sizeof *all);
    if (!xs || !all) {
        free(xs), free(all);
        return LINSEQ_ERR_OUT_OF_MEMORY;
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t r = rows ? rows[b] : b;
        for (int64_t d = 0; d < D; d++) {
            if (r < 0) {
                for (int64_t t = 0; t < T; t++) y[(b * T + t) * D + d] = 0.0;
                continue;
            }
            /* position i at row[i * step] */
            float *row = state + conv1d_state_at(p, r, d, 0, L);
            const int64_t step = conv1d_state_layout(p, L).position;
            const int64_t c = cache_seqlens ? cache_seqlens[b] % L : 0;
            /* xs: the W-1 inputs before the new tokens, oldest first, then the new ones */
            for (int64_t i = 0; i < W - 1; i++) {
                const int64_t pos =
                    cache_seqlens ? ((c - (W - 1) + i) % L + L) % L : L - (W - 1) + i;
                xs[i] = row[pos * step];
            }
            for (int64_t t = 0; t < T; t++) xs[W - 1 + t] = x_at(p, b, t, d);
            for (int64_t t = 0; t < T; t++) {
                double acc = p->bias ? p->bias[d] : 0.0;
                for (int64_t j = 0; j < W; j++) acc += weight_at(p, d, j) * xs[t + j];
                y[(b * T + t) * D + d] = ls_activate_ref(act, acc);
            }
            if (cache_seqlens) {
                for (int64_t t = 0; t < T; t++) row[(c + t) % L * step] = (float)xs[W - 1 + t];
            } else { /* the last L entries of concat(row, new inputs) */
                for (int64_t i = 0; i < L; i++) all[i] = row[i * step];
                for (int64_t t = 0; t < T; t++) all[L + t] = xs[W - 1 + t];
                for (int64_t i = 0; i < L; i++) row[i * step] = (float)all[T + i];
            }
        }
    }
    free(xs), free(all);
    return LINSEQ_OK;
}
