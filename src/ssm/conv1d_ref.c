/* The causal depthwise conv1d reference: the formulas of linseq.h in double.
 *
 * Per (sequence, channel) the padded input is xs = concat(conv_state or zeros [W-1], x), so
 * xs[k] for k < W-1 is the state and xs[W-1+t] is x_t. */
#include "core/activation.h"
#include "ssm/ssm_internal.h"

/* xs[k] of one (sequence, channel): state_row is NULL when the sequence starts from zeros. */
static double padded_input(const linseq_conv1d_problem *p, const float *state_row, int64_t start,
                           int64_t d, int64_t k)
{
    const int64_t W = p->W;
    if (k < W - 1) return state_row ? state_row[k] : 0.0;
    return p->x[(start + k - (W - 1)) * p->D + d];
}

void ls_conv1d_reference(const linseq_conv1d_problem *p, float *y, float *state_out)
{
    const int64_t D = p->D, W = p->W;
    const linseq_activation act = conv1d_activation(p);
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);

    for (int64_t s = 0; s < n_seqs; s++) {
        int64_t start, len;
        ssm_seq_range(p->cu_seqlens, p->T, s, &start, &len);
        for (int64_t d = 0; d < D; d++) {
            const float *state_row =
                W > 1 && p->conv_state ? p->conv_state + (s * D + d) * (W - 1) : NULL;
            for (int64_t t = 0; t < len; t++) {
                double acc = p->bias ? p->bias[d] : 0.0;
                for (int64_t j = 0; j < W; j++)
                    acc += (double)p->weight[d * W + j] *
                           padded_input(p, state_row, start, d, t + j);
                y[(start + t) * D + d] = (float)ls_activate_ref(act, acc);
            }
            /* The last W-1 entries of xs. Ascending order reads xs[len + i] before writing
             * entry i (len + i >= i), so an in-place state_out == conv_state is safe. */
            if (W > 1 && state_out) {
                float *out_row = state_out + (s * D + d) * (W - 1);
                for (int64_t i = 0; i < W - 1; i++)
                    out_row[i] = (float)padded_input(p, state_row, start, d, len + i);
            }
        }
    }
}
