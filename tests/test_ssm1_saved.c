/* linseq_ssm1_saved_size / _forward_train / _backward_saved: training that keeps the
 * backward's checkpoints from the forward.
 *   - forward_train's y and hT are bitwise linseq_ssm1_forward's;
 *   - every gradient of backward_saved is bitwise linseq_ssm1_backward's, for 1, 2 and 3
 *     threads and every ISA: dense, h0 with gate and D_skip, softplus with dt_bias, varlen with
 *     an empty sequence, channel_first, strided inputs, groups whose channels span the
 *     forward's blocks, T not a multiple of the segment, one token;
 *   - the saved states themselves: checkpoint k of a sequence is bitwise the hT of a forward
 *     over its first 64 k tokens (the state layout of ssm_internal.h);
 *   - refusals with nothing written: saved too small, saved of another problem (sizes,
 *     options, cu_seqlens of the same sizes), not a saved block, NULL saved, a CUDA exec. */
#include <stdlib.h>
#include <string.h>

#include "simd/isa.h"
#include "ssm/ssm_internal.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int64_t B, T, D, N, G;
    bool h0, extras, softplus, varlen, channel_first, strided;
} config;

/* varlen: three sequences, the middle one empty */
static const int64_t CU[] = {0, 70, 70, 200};

static const config CONFIGS[] = {
    {"dense", 2, 150, 8, 5, 1, false, false, false, false, false, false},
    {"h0, gate, D_skip, ragged block", 2, 130, 70, 4, 1, true, true, false, false, false, false},
    {"softplus, dt_bias", 1, 129, 16, 3, 1, false, false, true, false, false, false},
    {"varlen, empty sequence, h0", 1, 200, 8, 4, 2, true, false, true, true, false, false},
    {"channel_first", 2, 100, 12, 4, 2, true, true, false, false, true, false},
    {"strided x and B", 2, 80, 8, 4, 1, false, true, false, false, false, true},
    {"groups spanning blocks", 1, 90, 140, 3, 2, true, true, true, false, false, false},
    {"one token", 3, 1, 8, 4, 1, true, true, true, false, false, false},
};

enum { N_GRADS = 9 };

typedef struct {
    linseq_ssm1_problem p;
    float *x, *dt, *A, *Bp, *Cp, *Dk, *gate, *bias, *h0, *d_y, *d_hT;
    size_t n_tok, n_proj, n_state, n_grad[N_GRADS];
} scase;

static void make_case(scase *c, const config *cf, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    tu_rng r = {seed};
    const int64_t n_seqs = cf->varlen ? 3 : cf->B;
    const size_t x_width = cf->strided ? 2 : 1; /* strided: x and B_proj use every other row */
    c->n_tok = (size_t)(cf->B * cf->T * cf->D);
    c->n_proj = (size_t)(cf->B * cf->T * cf->G * cf->N);
    c->n_state = (size_t)(n_seqs * cf->D * cf->N);
    c->x = tu_alloc(x_width * c->n_tok), c->dt = tu_alloc(c->n_tok), c->gate = tu_alloc(c->n_tok);
    c->A = tu_alloc((size_t)(cf->D * cf->N));
    c->Bp = tu_alloc(x_width * c->n_proj), c->Cp = tu_alloc(c->n_proj);
    c->Dk = tu_alloc((size_t)cf->D), c->bias = tu_alloc((size_t)cf->D);
    c->h0 = tu_alloc(c->n_state), c->d_y = tu_alloc(c->n_tok), c->d_hT = tu_alloc(c->n_state);
    tu_fill_normal(&r, c->x, x_width * c->n_tok, 1.0);
    tu_fill_normal(&r, c->gate, c->n_tok, 1.0);
    tu_fill_uniform(&r, c->A, (size_t)(cf->D * cf->N), -4.0, -0.1);
    tu_fill_normal(&r, c->Bp, x_width * c->n_proj, 1.0);
    tu_fill_normal(&r, c->Cp, c->n_proj, 1.0);
    tu_fill_normal(&r, c->Dk, (size_t)cf->D, 1.0);
    tu_fill_uniform(&r, c->bias, (size_t)cf->D, -2.0, 0.0);
    tu_fill_normal(&r, c->h0, c->n_state, 1.0);
    tu_fill_normal(&r, c->d_y, c->n_tok, 1.0);
    tu_fill_normal(&r, c->d_hT, c->n_state, 1.0);
    if (cf->softplus)
        tu_fill_normal(&r, c->dt, c->n_tok, 1.0);
    else
        tu_fill_uniform(&r, c->dt, c->n_tok, 1e-3, 0.3);
    c->p = (linseq_ssm1_problem){.B = cf->B,
                                 .T = cf->T,
                                 .D = cf->D,
                                 .N = cf->N,
                                 .G = cf->G,
                                 .cu_seqlens = cf->varlen ? CU : NULL,
                                 .n_seqs = cf->varlen ? 3 : 0,
                                 .x = c->x,
                                 .dt = c->dt,
                                 .A = c->A,
                                 .B_proj = c->Bp,
                                 .C_proj = c->Cp,
                                 .D_skip = cf->extras ? c->Dk : NULL,
                                 .gate = cf->extras ? c->gate : NULL,
                                 .h0 = cf->h0 ? c->h0 : NULL,
                                 .dt_softplus = cf->softplus,
                                 .dt_bias = cf->softplus ? c->bias : NULL,
                                 .channel_first = cf->channel_first};
    if (cf->strided) {
        const int64_t T = cf->T, D = cf->D, GN = cf->G * cf->N;
        c->p.x_strides = (linseq_strides){2 * T * D, 2 * D, 1, 0};
        c->p.B_strides = (linseq_strides){2 * T * GN, 2 * GN, cf->N, 1};
    }
    const size_t D = (size_t)cf->D, DN = D * (size_t)cf->N;
    const size_t n[N_GRADS] = {c->n_tok,
                               c->n_tok,
                               DN,
                               c->n_proj,
                               c->n_proj,
                               cf->extras ? D : 0,
                               cf->extras ? c->n_tok : 0,
                               c->n_state,
                               cf->softplus ? D : 0};
    memcpy(c->n_grad, n, sizeof n);
}

static void free_case(scase *c)
{
    free(c->x), free(c->dt), free(c->gate), free(c->A), free(c->Bp), free(c->Cp), free(c->Dk);
    free(c->bias), free(c->h0), free(c->d_y), free(c->d_hT);
}

/* Poisoned gradient buffers in grads order (dx ddt dA dB dC dD dgate dh0 ddt_bias); NULL where
 * the problem has no such gradient. */
static linseq_ssm1_grads alloc_grads(const scase *c, float *g[N_GRADS])
{
    for (int i = 0; i < N_GRADS; i++) g[i] = c->n_grad[i] ? tu_alloc_poisoned(c->n_grad[i]) : NULL;
    return (linseq_ssm1_grads){g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]};
}

static void free_grads(float *g[N_GRADS])
{
    for (int i = 0; i < N_GRADS; i++) free(g[i]);
}

static const char *const GRAD_NAMES[N_GRADS] = {"dx", "ddt",   "dA",  "dB_proj", "dC_proj",
                                                "dD", "dgate", "dh0", "ddt_bias"};

/* forward_train against forward, backward_saved against backward, with 1, 2 and 3 threads. */
static void check_isa(const scase *c, ls_isa isa, const char *what)
{
    const linseq_ssm1_problem *p = &c->p;
    const linseq_exec one = {.threads = 1};
    float *y = tu_alloc_poisoned(c->n_tok), *hT = tu_alloc_poisoned(c->n_state);
    float *g_ref[N_GRADS];
    const linseq_ssm1_grads ref = alloc_grads(c, g_ref);
    CHECK_OK(ls_ssm1_forward_isa(p, &one, y, hT, isa));
    CHECK_OK(ls_ssm1_backward_isa(p, &one, c->d_y, c->d_hT, &ref, isa));

    size_t bytes = 0;
    CHECK_OK(linseq_ssm1_saved_size(p, NULL, &bytes));
    for (int threads = 1; threads <= 3; threads++) {
        const linseq_exec ex = {.threads = threads};
        void *saved = malloc(bytes);
        float *yt = tu_alloc_poisoned(c->n_tok), *hTt = tu_alloc_poisoned(c->n_state);
        CHECK_OK(ls_ssm1_forward_train_isa(p, &ex, yt, hTt, saved, bytes, isa));
        CHECK(tu_same_bits(y, yt, c->n_tok) && tu_same_bits(hT, hTt, c->n_state),
              "%s [%s, %d threads]: forward_train's y or hT differ from the forward's", what,
              ls_isa_name(isa), threads);
        float *g[N_GRADS];
        const linseq_ssm1_grads gs = alloc_grads(c, g);
        CHECK_OK(ls_ssm1_backward_saved_isa(p, &ex, saved, bytes, c->d_y, c->d_hT, &gs, isa));
        for (int i = 0; i < N_GRADS; i++)
            CHECK(!g[i] || tu_same_bits(g[i], g_ref[i], c->n_grad[i]),
                  "%s [%s, %d threads]: backward_saved's %s differs from the backward's", what,
                  ls_isa_name(isa), threads, GRAD_NAMES[i]);
        free_grads(g);
        free(saved), free(yt), free(hTt);
    }
    free_grads(g_ref);
    free(y), free(hT);
}

/* Checkpoint k of a one-sequence token-major problem is the state after its first 64 k tokens:
 * the hT of the forward over those tokens (the same inputs, T = 64 k), or h0 (zeros) for k = 0. */
static void check_states(const scase *c, ls_isa isa, const char *what)
{
    const linseq_ssm1_problem *p = &c->p;
    const int64_t D = p->D, N = p->N;
    size_t bytes = 0;
    CHECK_OK(linseq_ssm1_saved_size(p, NULL, &bytes));
    const int64_t n_ckpt = (p->T + SSM_BWD_SEGMENT - 1) / SSM_BWD_SEGMENT;
    CHECK(bytes == SSM1_SAVED_HEADER_BYTES + (size_t)(n_ckpt * N * D) * sizeof(float),
          "%s: saved_size %zu is not the header and %lld states", what, bytes, (long long)n_ckpt);
    unsigned char *saved = malloc(bytes);
    float *y = tu_alloc(c->n_tok), *hT = tu_alloc((size_t)(D * N));
    CHECK_OK(ls_ssm1_forward_train_isa(p, NULL, y, NULL, saved, bytes, isa));
    const float *states = (const float *)(const void *)(saved + SSM1_SAVED_HEADER_BYTES);
    for (int64_t k = 0; k < n_ckpt; k++) {
        linseq_ssm1_problem prefix = *p;
        prefix.T = k * SSM_BWD_SEGMENT;
        if (k > 0) {
            CHECK_OK(ls_ssm1_forward_isa(&prefix, NULL, y, hT, isa));
        } else {
            for (int64_t i = 0; i < D * N; i++) hT[i] = p->h0 ? p->h0[i] : 0.0f;
        }
        bool same = true;
        for (int64_t d = 0; d < D; d++)
            for (int64_t n = 0; n < N; n++) {
                const float a = states[(k * N + n) * D + d], b = hT[d * N + n];
                same = same && memcmp(&a, &b, sizeof a) == 0;
            }
        CHECK(same, "%s [%s]: saved checkpoint %lld is not the state after %lld tokens", what,
              ls_isa_name(isa), (long long)k, (long long)prefix.T);
    }
    free(saved), free(y), free(hT);
}

/* A refused call: the status, a message naming `needle`, and every buffer still poisoned. */
static void expect_refused(linseq_status st, linseq_status want, const char *needle,
                           void *const *bufs, const size_t *sizes, int n, const char *what)
{
    CHECK(st == want, "%s: got %s, expected %s (%s)", what, linseq_status_string(st),
          linseq_status_string(want), linseq_last_error());
    CHECK(strstr(linseq_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'", what,
          linseq_last_error(), needle);
    for (int i = 0; i < n; i++)
        CHECK(!bufs[i] || tu_is_poisoned(bufs[i], sizes[i]), "%s: buffer %d was written", what, i);
}

static void check_refusals(const scase *c)
{
    const linseq_ssm1_problem *p = &c->p;
    const linseq_exec cuda = {.device = LINSEQ_DEVICE_CUDA};
    size_t bytes = 0;
    CHECK_OK(linseq_ssm1_saved_size(p, NULL, &bytes));
    unsigned char *good = malloc(bytes);
    float *y = tu_alloc(c->n_tok), *hT = tu_alloc(c->n_state);
    CHECK_OK(linseq_ssm1_forward_train(p, NULL, y, hT, good, bytes));

    /* the forward: outputs and the saved block untouched */
    void *saved = malloc(bytes);
    void *fwd[3] = {y, hT, saved};
    const size_t fwd_sizes[3] = {c->n_tok * sizeof(float), c->n_state * sizeof(float), bytes};
    for (int i = 0; i < 3; i++) tu_poison(fwd[i], fwd_sizes[i]);
    expect_refused(linseq_ssm1_forward_train(p, NULL, y, hT, saved, bytes - 4),
                   LINSEQ_ERR_INVALID_SIZE, "saved_bytes", fwd, fwd_sizes, 3,
                   "forward_train, saved too small");
    expect_refused(linseq_ssm1_forward_train(p, NULL, y, hT, NULL, bytes), LINSEQ_ERR_NULL_POINTER,
                   "saved", fwd, fwd_sizes, 3, "forward_train, NULL saved");
    expect_refused(linseq_ssm1_forward_train(p, &cuda, y, hT, saved, bytes), LINSEQ_ERR_UNSUPPORTED,
                   "CUDA", fwd, fwd_sizes, 3, "forward_train on CUDA");
    size_t cuda_bytes = 12345;
    CHECK(linseq_ssm1_saved_size(p, &cuda, &cuda_bytes) == LINSEQ_ERR_UNSUPPORTED &&
              cuda_bytes == 12345,
          "saved_size on CUDA: expected LINSEQ_ERR_UNSUPPORTED, nothing written");
    CHECK(linseq_ssm1_saved_size(p, NULL, NULL) == LINSEQ_ERR_NULL_POINTER,
          "saved_size with bytes NULL: expected LINSEQ_ERR_NULL_POINTER");

    /* the backward: gradients untouched */
    float *g[N_GRADS];
    const linseq_ssm1_grads gs = alloc_grads(c, g);
    void *bufs[N_GRADS];
    size_t sizes[N_GRADS];
    for (int i = 0; i < N_GRADS; i++) {
        bufs[i] = g[i];
        sizes[i] = c->n_grad[i] * sizeof(float);
        if (g[i]) tu_poison(g[i], sizes[i]);
    }
    expect_refused(linseq_ssm1_backward_saved(p, NULL, good, bytes - 4, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_INVALID_SIZE, "saved_bytes", bufs, sizes, N_GRADS,
                   "backward_saved, saved too small");
    expect_refused(linseq_ssm1_backward_saved(p, NULL, good, 16, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_INVALID_SIZE, "header", bufs, sizes, N_GRADS,
                   "backward_saved, smaller than the header");
    expect_refused(linseq_ssm1_backward_saved(p, NULL, NULL, bytes, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_NULL_POINTER, "saved", bufs, sizes, N_GRADS,
                   "backward_saved, NULL saved");
    expect_refused(linseq_ssm1_backward_saved(p, &cuda, good, bytes, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_UNSUPPORTED, "CUDA", bufs, sizes, N_GRADS, "backward_saved on CUDA");
    /* not a saved block at all */
    unsigned char *junk = malloc(bytes);
    memset(junk, 0x5a, bytes);
    expect_refused(linseq_ssm1_backward_saved(p, NULL, junk, bytes, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_INVALID_VALUE, "not written by linseq_ssm1_forward_train", bufs,
                   sizes, N_GRADS, "backward_saved, not a saved block");
    free(junk);

    /* a block of another problem: sizes (half the tokens, as big a buffer), then options */
    linseq_ssm1_problem shorter = *p;
    shorter.T = p->T / 2;
    CHECK_OK(linseq_ssm1_forward_train(&shorter, NULL, y, NULL, saved, bytes));
    expect_refused(linseq_ssm1_backward_saved(p, NULL, saved, bytes, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_SHAPE_MISMATCH, "'saved' describes", bufs, sizes, N_GRADS,
                   "backward_saved, saved of a shorter problem");
    linseq_ssm1_problem no_h0 = *p;
    no_h0.h0 = NULL;
    CHECK_OK(linseq_ssm1_forward_train(&no_h0, NULL, y, NULL, saved, bytes));
    expect_refused(linseq_ssm1_backward_saved(p, NULL, saved, bytes, c->d_y, c->d_hT, &gs),
                   LINSEQ_ERR_INVALID_VALUE, "options", bufs, sizes, N_GRADS,
                   "backward_saved, saved of a problem without h0");
    /* and the good block still works */
    CHECK_OK(linseq_ssm1_backward_saved(p, NULL, good, bytes, c->d_y, c->d_hT, &gs));
    free_grads(g);
    free(good), free(saved), free(y), free(hT);
}

/* A block from the same sizes and sequence count with other sequence boundaries holds the
 * states of other sequences: refused, naming cu_seqlens, whichever call had which. */
static void check_other_cu_seqlens(const scase *c)
{
    static const int64_t moved_cu[] = {0, 60, 130, 200};
    linseq_ssm1_problem moved = c->p;
    moved.cu_seqlens = moved_cu;
    size_t bytes = 0, moved_bytes = 0;
    CHECK_OK(linseq_ssm1_saved_size(&c->p, NULL, &bytes));
    CHECK_OK(linseq_ssm1_saved_size(&moved, NULL, &moved_bytes));
    if (moved_bytes > bytes) bytes = moved_bytes;
    unsigned char *saved = malloc(bytes);
    float *y = tu_alloc(c->n_tok), *hT = tu_alloc(c->n_state);
    float *g[N_GRADS];
    const linseq_ssm1_grads gs = alloc_grads(c, g);
    void *bufs[N_GRADS];
    size_t sizes[N_GRADS];
    for (int i = 0; i < N_GRADS; i++) {
        bufs[i] = g[i];
        sizes[i] = c->n_grad[i] * sizeof(float);
        if (g[i]) tu_poison(g[i], sizes[i]);
    }
    const linseq_ssm1_problem *written[2] = {&c->p, &moved}, *read[2] = {&moved, &c->p};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(linseq_ssm1_forward_train(written[k], NULL, y, hT, saved, bytes));
        expect_refused(
            linseq_ssm1_backward_saved(read[k], NULL, saved, bytes, c->d_y, c->d_hT, &gs),
            LINSEQ_ERR_INVALID_VALUE, "cu_seqlens", bufs, sizes, N_GRADS,
            "backward_saved, saved of other cu_seqlens");
    }
    free_grads(g);
    free(saved), free(y), free(hT);
}

int main(void)
{
    tu_mark tally[LS_ISA_COUNT] = {{0}};
    for (size_t k = 0; k < sizeof CONFIGS / sizeof CONFIGS[0]; k++) {
        const config *cf = &CONFIGS[k];
        scase c;
        make_case(&c, cf, 1000u + 17u * (uint64_t)k);
        for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
            if (!ls_isa_available((ls_isa)isa)) continue;
            const tu_mark mark = tu_mark_now();
            check_isa(&c, (ls_isa)isa, cf->name);
            if (cf->B == 1 && !cf->varlen && !cf->channel_first && !cf->strided)
                check_states(&c, (ls_isa)isa, cf->name);
            tu_tally_add(&tally[isa], mark);
        }
        free_case(&c);
    }
    for (int isa = 0; isa < LS_ISA_COUNT; isa++) {
        if (!ls_isa_available((ls_isa)isa)) continue;
        char label[64];
        snprintf(label, sizeof label, "ssm1 saved %s", ls_isa_name((ls_isa)isa));
        tu_report(label, tally[isa], "forward_train and backward_saved bitwise; saved states");
    }

    const tu_mark mark = tu_mark_now();
    scase c;
    make_case(&c, &CONFIGS[1], 7);
    check_refusals(&c);
    free_case(&c);
    make_case(&c, &CONFIGS[3], 8);
    check_other_cu_seqlens(&c);
    free_case(&c);
    tu_mark refusals = {0};
    tu_tally_add(&refusals, mark);
    tu_report("ssm1 saved refusals", refusals, "nothing written");
    return tu_finish("test_ssm1_saved");
}
