/* linseq_kda_backward: validation, the (sequence, qk head) work items, and the chain rules of
 * the in-kernel options (l2norm and scale, beta sigmoid, gate) around the kernels' gradients.
 * The sums over the batch (dA_log, ddt_bias) go through per-item partials reduced in item
 * order, so the result does not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "kda/kda_backward.h"
#include "kda/kda_kernels.h"
#include "kda/kda_op.h"
#include "optable/check.h"
#include "simd/isa.h"

void kda_bwd_emit(const kda_bwd *b, int64_t tok, int64_t hv, const float *dqs, const float *dks,
                  const float *dv, float dbeta, const float *dg, double *item_partials)
{
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const linseq_kda_grads *gr = b->gr;
    const int64_t K = p->K, V = p->V, H = p->H, HV = pl->HV, gK = pl->gK;
    const int64_t h = hv / pl->group;
    /* restrict: the rows are the caller's outputs, never the kernel's buffers (and the
     * compiler can then vectorise the sums) */
    if (gr->dq) {
        float *restrict row = gr->dq + (tok * H + h) * K;
        const float *restrict src = dqs;
        for (int64_t i = 0; i < K; i++) row[i] += src[i];
    }
    if (gr->dk) {
        float *restrict row = gr->dk + (tok * H + h) * K;
        const float *restrict src = dks;
        for (int64_t i = 0; i < K; i++) row[i] += src[i];
    }
    if (gr->dv) memcpy(gr->dv + (tok * HV + hv) * V, dv, (size_t)V * sizeof(float));
    if (gr->dbeta) {
        float d = dbeta;
        if (p->beta_is_logit) {
            const float s = ls_sigmoidf(p->beta[tok * HV + hv]);
            d *= s * (1.0f - s);
        }
        gr->dbeta[tok * HV + hv] = d;
    }
    if (p->decay == LINSEQ_DECAY_NONE) return;
    const int64_t at = (tok * HV + hv) * gK;
    if (!p->gate_in_kernel) {
        if (gr->dg) memcpy(gr->dg + at, dg, (size_t)gK * sizeof(float));
        return;
    }
    const int64_t g_in_group = hv % pl->group;
    const float a_log = p->A_log ? p->A_log[hv] : 0.0f;
    for (int64_t i = 0; i < gK; i++) {
        const float bias = p->dt_bias ? p->dt_bias[hv * gK + i] : 0.0f;
        float d_raw, d_alog;
        ls_kda_gate_gradf(p->g[at + i], bias, a_log, p->lower_bound, &d_raw, &d_alog);
        const float d = dg[i] * d_raw;
        if (gr->dg) gr->dg[at + i] = d;
        if (item_partials) {
            item_partials[g_in_group] += (double)(dg[i] * d_alog);
            item_partials[pl->group + g_in_group * gK + i] += (double)d;
        }
    }
}

void kda_bwd_load_dht(const kda_bwd *b, int64_t n, int64_t hv, float *dS)
{
    const int64_t KV = b->pl->p->K * b->pl->p->V;
    kda_state_load(b->pl, b->d_ht ? b->d_ht + (n * b->pl->HV + hv) * KV : NULL, dS);
}

void kda_bwd_store_dh0(const kda_bwd *b, int64_t n, int64_t hv, const float *dS)
{
    const int64_t KV = b->pl->p->K * b->pl->p->V;
    if (b->gr->dh0) kda_state_store(b->pl, dS, b->gr->dh0 + (n * b->pl->HV + hv) * KV);
}

typedef struct {
    const kda_bwd *b;
    unsigned char *ws;
    size_t ws_stride;
} bwd_ctx;

static void backward_item(void *ctx, int64_t item, int thread)
{
    const bwd_ctx *c = ctx;
    const kda_bwd *b = c->b;
    const kda_plan *pl = b->pl;
    const linseq_kda_problem *p = pl->p;
    const linseq_kda_grads *gr = b->gr;
    const int64_t H = p->H, K = p->K, n = item / H, h = item % H;
    int64_t start, len;
    kda_seq_range(pl, n, &start, &len);
    void *ws = c->ws + (size_t)thread * c->ws_stride;
    double *partials = b->partials ? b->partials + item * b->partial_len : NULL;

    for (int64_t tok = start; tok < start + len; tok++) {
        if (gr->dq) memset(gr->dq + (tok * H + h) * K, 0, (size_t)K * sizeof(float));
        if (gr->dk) memset(gr->dk + (tok * H + h) * K, 0, (size_t)K * sizeof(float));
    }
    for (int64_t hv = h * pl->group; hv < (h + 1) * pl->group; hv++) {
        if (pl->chunk)
            b->kern->chunk_bwd_item(b, n, hv, start, len, ws, partials);
        else
            b->kern->recurrent_bwd_item(b, n, hv, start, len, ws, partials);
    }
    /* dq and dk now hold the group's sum w.r.t. qs and ks: chain through scale and l2norm. */
    b->kern->bwd_chain_qk(b, start, len, h);
}

linseq_status kda_check_option_grads(const char *fn, const linseq_kda_problem *p,
                                     const linseq_kda_grads *gr)
{
    if (p->decay == LINSEQ_DECAY_NONE && gr->dg)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->dg is given but decay is LINSEQ_DECAY_NONE (there is no g)");
    if (!p->beta && gr->dbeta)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->dbeta is given but 'beta' is NULL (no delta rule: there is no "
                       "beta)");
    if (!p->gate_in_kernel && (gr->dA_log || gr->ddt_bias))
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->%s is given but gate_in_kernel is false",
                       gr->dA_log ? "dA_log" : "ddt_bias");
    return LINSEQ_OK;
}

/* The backward; with saved (from linseq_kda_forward_train) it skips the forward pass. */
static linseq_status backward_impl(const char *fn, const linseq_kda_problem *problem,
                                   const linseq_exec *exec, const void *saved, size_t saved_bytes,
                                   const float *d_o, const float *d_ht,
                                   const linseq_kda_grads *grads, const kda_kernels *kern)
{
    ls_clear_error();
    kda_plan pl;
    linseq_status st;
    if ((st = kda_check_problem(fn, &ls_op_kda, problem, exec, false, &pl))) return st;
    if (!grads) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'grads' is NULL");
    const linseq_kda_problem *p = problem;
    const linseq_kda_grads *gr = grads;
    if ((st = kda_check_option_grads(fn, p, gr))) return st;

    if (saved && ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "the saved training block is CPU-only; on CUDA call linseq_kda_forward "
                       "and linseq_kda_backward");
    const int64_t B = p->B, T = p->T, H = p->H, HV = pl.HV, K = p->K, V = p->V, gK = pl.gK;
    const size_t te = ls_token_bytes(exec);
    ls_args a = {.fn = fn};
    const float *const up[] = {d_o, d_ht};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_INPUT, p, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_UPSTREAM, up, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda, p, LS_ROLE_GRAD, gr, te)))
        return st;
    /* a byte buffer that holds floats after its header */
    if (saved)
        ls_arg(&a, "saved", "saved_bytes", saved, true, LS_IN, 1, 1, (int64_t)saved_bytes)->align =
            sizeof(float);

    kda_exec_plan(&pl, exec);
    pl.bf16_grad_products = exec && exec->products == LINSEQ_PRODUCTS_BF16 && pl.chunk;
    pl.bf16_dot = pl.bf16_grad_products && kern->isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    const int chunk = pl.segment; /* chunk size, or the recurrent checkpoint interval */
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ls_args_validate(&a))) return st;
    if (ls_on_cuda(exec)) {
        const ls_cuda_kda_args dev = {.p = p, .HV = pl.HV, .scale = pl.scale, .chunk = pl.chunk};
        return ls_cuda_entry_kda_backward(fn, &dev, exec, d_o, d_ht, gr);
    }
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    int64_t *saved_at = NULL;
    if (saved) {
        if (saved_bytes < KDA_SAVED_HEADER_BYTES)
            return ls_fail(fn, LINSEQ_ERR_INVALID_SIZE,
                           "saved_bytes = %zu is smaller than the saved header", saved_bytes);
        if ((st = kda_saved_check_header(fn, &pl, saved)) ||
            (st = kda_saved_offsets(fn, &pl, saved_bytes, &saved_at)))
            return st;
    }
    const int64_t max_len = ls_longest_sequence(p->cu_seqlens, p->n_seqs, p->T);
    kda_bwd b = {.pl = &pl,
                 .d_o = d_o,
                 .d_ht = d_ht,
                 .gr = gr,
                 .max_len = max_len,
                 .segment = chunk,
                 .kern = kern,
                 .saved_at = saved_at,
                 .saved = saved ? (const float *)(const void *)((const unsigned char *)saved +
                                                                KDA_SAVED_HEADER_BYTES)
                                : NULL};
    /* Per thread: one state per chunk or segment of the longest sequence, plus a segment of
     * states (recurrent) or one chunk's matrices (chunked). */
    int64_t kv, n_ckpt_states, chunk_rows;
    if (!ls_mul_ok(&kv, 2, K, V) || !ls_mul_ok(&chunk_rows, 2, (int64_t)chunk, K + V + chunk) ||
        !ls_mul_ok(&n_ckpt_states, 2, kv, max_len / chunk + 2 + chunk) ||
        n_ckpt_states > (int64_t)(PTRDIFF_MAX / 64) || chunk_rows > (int64_t)(PTRDIFF_MAX / 64)) {
        free(saved_at);
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the backward's checkpoints (T/%d + %d states of K*V = %lld*%lld floats) "
                       "are too large to allocate",
                       chunk, chunk + 2, (long long)K, (long long)V);
    }

    const size_t ws_stride =
        ((pl.chunk ? b.kern->chunk_bwd_ws_bytes(&b) : b.kern->recurrent_bwd_ws_bytes(&b)) + 63) &
        ~(size_t)63;
    const int64_t n_items = pl.n_seqs * H;
    const double work = 20.0 * (double)B * (double)T * (double)HV * (double)K * (double)V;
    const int threads = ls_resolve_threads(exec, n_items, work);
    const bool want_partials = p->gate_in_kernel && (gr->dA_log || gr->ddt_bias);
    b.partial_len = pl.group * (1 + gK);
    unsigned char *ws;
    if ((st = ls_alloc_blocks(fn, ws_stride, threads, (void **)&ws))) {
        free(saved_at);
        return st;
    }
    b.partials = NULL;
    if (want_partials && (st = ls_alloc_blocks(fn, (size_t)b.partial_len * sizeof(double), n_items,
                                               (void **)&b.partials)) == LINSEQ_OK)
        memset(b.partials, 0, (size_t)(n_items * b.partial_len) * sizeof(double));
    if (st) {
        free(ws);
        free(saved_at);
        return st;
    }
    atomic_int positive_g = 0; /* the kernels' pass over g (kda_decay_row) */
    pl.positive_g = &positive_g;
    bwd_ctx c = {.b = &b, .ws = ws, .ws_stride = ws_stride};
    ls_parallel_for(n_items, threads, backward_item, &c);

    if (want_partials) {
        /* partials[item] for item = n*H + h: summed over n into the first H, in order */
        for (int64_t item = H; item < n_items; item++)
            for (int64_t i = 0; i < b.partial_len; i++)
                b.partials[(item % H) * b.partial_len + i] += b.partials[item * b.partial_len + i];
        for (int64_t h = 0; h < H; h++) {
            const double *part = b.partials + h * b.partial_len;
            for (int64_t g = 0; g < pl.group; g++) {
                const int64_t hv = h * pl.group + g;
                if (gr->dA_log) gr->dA_log[hv] = (float)part[g];
                for (int64_t i = 0; gr->ddt_bias && i < gK; i++)
                    gr->ddt_bias[hv * gK + i] = (float)part[pl.group + g * gK + i];
            }
        }
    }
    free(b.partials);
    free(ws);
    free(saved_at);
    return kda_positive_g_status(fn, &pl);
}

linseq_status ls_kda_backward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                  const float *d_o, const float *d_ht,
                                  const linseq_kda_grads *grads, ls_isa isa)
{
    return backward_impl("linseq_kda_backward", problem, exec, NULL, 0, d_o, d_ht, grads,
                         ls_kda_kernels(isa));
}

linseq_status ls_kda_backward_saved_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                        const void *saved, size_t saved_bytes, const float *d_o,
                                        const float *d_ht, const linseq_kda_grads *grads,
                                        ls_isa isa)
{
    static const char fn[] = "linseq_kda_backward_saved";
    if (!saved) {
        ls_clear_error();
        return ls_fail(fn, LINSEQ_ERR_NULL_POINTER,
                       "argument 'saved' is NULL; expected what linseq_kda_forward_train wrote");
    }
    return backward_impl(fn, problem, exec, saved, saved_bytes, d_o, d_ht, grads,
                         ls_kda_kernels(isa));
}

linseq_status linseq_kda_backward(const linseq_kda_problem *problem, const linseq_exec *exec,
                                  const float *d_o, const float *d_ht,
                                  const linseq_kda_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_backward", &isa);
    return st ? st : ls_kda_backward_isa(problem, exec, d_o, d_ht, grads, isa);
}

linseq_status linseq_kda_backward_saved(const linseq_kda_problem *problem, const linseq_exec *exec,
                                        const void *saved, size_t saved_bytes, const float *d_o,
                                        const float *d_ht, const linseq_kda_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_backward_saved", &isa);
    return st ? st
              : ls_kda_backward_saved_isa(problem, exec, saved, saved_bytes, d_o, d_ht, grads, isa);
}
