/* The README's example: a KDA layer's prefill, then one decode step from the returned state.
 * Build against an installed linseq (the install lines of README "A short C example"):
 *     cc kda_prefill_decode.c $(pkg-config --cflags --libs linseq) -lm */
#include <linseq.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { B = 1, T = 256, H = 4, K = 64, V = 64 };
    float *q = malloc(sizeof(float) * B * T * H * K), *k = malloc(sizeof(float) * B * T * H * K);
    float *v = malloc(sizeof(float) * B * T * H * V), *g = malloc(sizeof(float) * B * T * H * K);
    float *beta = malloc(sizeof(float) * B * T * H), *o = malloc(sizeof(float) * B * T * H * V);
    float *state = malloc(sizeof(float) * B * H * K * V);
    if (!q || !k || !v || !g || !beta || !o || !state) return 1;
    for (int i = 0; i < B * T * H * K; i++) {
        q[i] = sinf(0.1f * i);
        k[i] = cosf(0.07f * i);
        g[i] = -0.05f * (1.0f + sinf(0.3f * i)); /* log decay, <= 0 */
    }
    for (int i = 0; i < B * T * H * V; i++) v[i] = sinf(0.013f * i);
    for (int i = 0; i < B * T * H; i++) beta[i] = 0.5f;

    /* Prefill: chunked (the default), q and k normalised in the kernel, final state out. */
    linseq_kda_problem p = {.B = B,
                            .T = T,
                            .H = H,
                            .K = K,
                            .V = V,
                            .q = q,
                            .k = k,
                            .v = v,
                            .beta = beta,
                            .g = g,
                            .decay = LINSEQ_DECAY_PER_CHANNEL,
                            .qk_l2norm = true};
    if (linseq_kda_forward(&p, NULL, o, state) != LINSEQ_OK) {
        fprintf(stderr, "%s\n", linseq_last_error());
        return 1;
    }

    /* Decode: the next token (here: the first one again) against the state, in place. */
    p.T = 1;
    if (linseq_kda_decode(&p, NULL, state, B, NULL, o) != LINSEQ_OK) {
        fprintf(stderr, "%s\n", linseq_last_error());
        return 1;
    }
    printf("linseq %s: o[0..3] after decode = %.6f %.6f %.6f %.6f\n", linseq_version(), o[0], o[1],
           o[2], o[3]);

    /* A bad argument is reported, never a crash. */
    p.HV = 3; /* not a multiple of H */
    linseq_status st = linseq_kda_forward(&p, NULL, o, state);
    printf("with HV = 3: %s\n  %s\n", linseq_status_string(st), linseq_last_error());
    free(q), free(k), free(v), free(g), free(beta), free(o), free(state);
    return st == LINSEQ_ERR_SHAPE_MISMATCH ? 0 : 1;
}
