/* linseq_kda_segment_forward / _backward: a segment's effect on the state, S_end = P S_start
 * + R (kda_segment.h), for context parallelism. The forward runs one item per (sequence,
 * value head) through the per-ISA kernel; the backward differentiates the same map as one
 * widened run of the KDA backward: the state [R | P] ([K, V+K]) is what the recurrence gives
 * from the start state [0 | I] with the values [v | 0], so the gradients of sum(P * d_P) +
 * sum(R * d_R) are those of that run's final state against [d_R | d_P], with no output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "kda/kda_kernels.h"
#include "kda/kda_segment.h"
#include "kda/kda_op.h"
#include "optable/check.h"

/* The problem as linseq_kda_forward checks it, with h0 absent, on the CPU; pl gets the
 * chunked form at exec's chunk size whatever exec->mode says. */
static linseq_status check_segment(const char *fn, const linseq_kda_problem *p,
                                   const linseq_exec *exec, kda_plan *pl)
{
    linseq_status st;
    if ((st = kda_check_problem(fn, &ls_op_kda_segment, p, exec, false, pl))) return st;
    if (p->h0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->h0 must be NULL: R is the end state from zeros (the end state "
                       "from a start state S0 is P S0 + R)");
    if (exec && exec->dtype != LINSEQ_DTYPE_F32)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "the segment summary takes float32 tensors (exec->dtype = %d)",
                       (int)exec->dtype);
    if (ls_on_cuda(exec))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "the segment summary runs on the CPU only (exec->device = "
                       "LINSEQ_DEVICE_CUDA)");
    kda_exec_plan(pl, exec);
    pl->chunk = pl->segment;
    return LINSEQ_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Forward                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const kda_plan *pl;
    const kda_kernels *kern;
    float *P, *R;
    unsigned char *ws;
    size_t ws_stride, r_bytes; /* per thread: R [K,V] (K-major), then the kernel's workspace */
} forward_ctx;

static void forward_item(void *ctx, int64_t item, int thread)
{
    const forward_ctx *c = ctx;
    const kda_plan *pl = c->pl;
    const int64_t K = pl->p->K, KV = K * pl->p->V, n = item / pl->HV, hv = item % pl->HV;
    int64_t start, len;
    kda_seq_range(pl, n, &start, &len);
    unsigned char *ws = c->ws + (size_t)thread * c->ws_stride;
    float *R = (float *)(void *)ws;
    c->kern->segment_item(pl, start, len, hv, c->P + item * K * K, R, ws + c->r_bytes);
    if (c->R) kda_state_store(pl, R, c->R + item * KV);
}

/* Per thread: R and the kernel's workspace, checked so that no size can wrap. */
static linseq_status forward_workspace(const char *fn, const kda_plan *pl, size_t *r_bytes,
                                       size_t *stride)
{
    const linseq_kda_problem *p = pl->p;
    int64_t kv, ck, kk, kpv;
    if (__builtin_add_overflow(p->K, p->V, &kpv) || !ls_mul_ok(&kv, 2, p->K, p->V) ||
        !ls_mul_ok(&ck, 2, (int64_t)pl->chunk + 16, kpv) || !ls_mul_ok(&kk, 2, p->K, p->K) ||
        kv > (int64_t)(PTRDIFF_MAX / 64) || ck > (int64_t)(PTRDIFF_MAX / 64) ||
        kk > (int64_t)(PTRDIFF_MAX / 64))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the working state K*(K+V) = %lld*(%lld+%lld) is too large to allocate",
                       (long long)p->K, (long long)p->K, (long long)p->V);
    *r_bytes = kda_align64((size_t)kv * sizeof(float));
    *stride = *r_bytes + kda_segment_ws_bytes(pl);
    return LINSEQ_OK;
}

linseq_status ls_kda_segment_forward_isa(const linseq_kda_problem *problem, const linseq_exec *exec,
                                         float *P, float *R, ls_isa isa)
{
    static const char fn[] = "linseq_kda_segment_forward";
    ls_clear_error();
    kda_plan pl;
    linseq_status st;
    if ((st = check_segment(fn, problem, exec, &pl))) return st;
    const linseq_kda_problem *p = problem;
    ls_args a = {.fn = fn};
    float *const out[] = {P, R};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda_segment, p, LS_ROLE_INPUT, p, sizeof(float))) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda_segment, p, LS_ROLE_OUTPUT, out, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    size_t r_bytes = 0, stride = 0;
    if ((st = forward_workspace(fn, &pl, &r_bytes, &stride)) || (st = ls_args_validate(&a)))
        return st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    const int64_t n_items = pl.n_seqs * pl.HV;
    const double work =
        4.0 * (double)(p->B * p->T) * (double)pl.HV * (double)p->K * (double)(p->K + p->V);
    const int threads = ls_resolve_threads(exec, n_items, work);
    unsigned char *ws;
    if ((st = ls_alloc_blocks(fn, stride, threads, (void **)&ws))) return st;
    atomic_int positive_g = 0; /* the kernels' pass over g (kda_decay_row) */
    pl.positive_g = &positive_g;
    forward_ctx c = {.pl = &pl,
                     .kern = ls_kda_kernels(isa),
                     .P = P,
                     .R = R,
                     .ws = ws,
                     .ws_stride = stride,
                     .r_bytes = r_bytes};
    ls_parallel_for(n_items, threads, forward_item, &c);
    free(ws);
    return kda_positive_g_status(fn, &pl);
}

linseq_status linseq_kda_segment_forward(const linseq_kda_problem *problem, const linseq_exec *exec,
                                         float *P, float *R)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_segment_forward", &isa);
    return st ? st : ls_kda_segment_forward_isa(problem, exec, P, R, isa);
}

/* ---------------------------------------------------------------------------------------- */
/* Backward: the widened run                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The widened run's buffers: v' = [v | 0], d_o' = 0, h0' = [0 | I], d_ht' = [d_R | d_P]
 * (K-major [K, V+K]) and its dv' ([B,T,HV,V+K], only when dv is wanted). */
typedef struct {
    float *v, *d_o, *h0, *d_ht, *dv;
} widened;

static void widened_free(widened *w)
{
    free(w->v), free(w->d_o), free(w->h0), free(w->d_ht), free(w->dv);
}

static linseq_status widened_alloc(const char *fn, const kda_plan *pl, bool want_dv, widened *w)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t Vw = p->V + p->K, rows = p->B * p->T * pl->HV, states = pl->n_seqs * pl->HV;
    const size_t row_bytes = (size_t)Vw * sizeof(float), state_bytes = (size_t)p->K * row_bytes;
    linseq_status st;
    *w = (widened){0};
    if ((st = ls_alloc_blocks(fn, row_bytes, rows, (void **)&w->v)) ||
        (st = ls_alloc_blocks(fn, row_bytes, rows, (void **)&w->d_o)) ||
        (st = ls_alloc_blocks(fn, state_bytes, states, (void **)&w->h0)) ||
        (st = ls_alloc_blocks(fn, state_bytes, states, (void **)&w->d_ht)) ||
        (want_dv && (st = ls_alloc_blocks(fn, row_bytes, rows, (void **)&w->dv)))) {
        widened_free(w);
        return st;
    }
    memset(w->d_o, 0, (size_t)rows * row_bytes);
    memset(w->h0, 0, (size_t)states * state_bytes);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(w->v + r * Vw, p->v + r * p->V, (size_t)p->V * sizeof(float));
        memset(w->v + r * Vw + p->V, 0, (size_t)p->K * sizeof(float));
    }
    return LINSEQ_OK;
}

/* h0' and d_ht' of every state row, from d_R (state layout) and d_P [K,K]; NULL is zeros. */
static void widened_states(const kda_plan *pl, const float *d_P, const float *d_R, widened *w)
{
    const linseq_kda_problem *p = pl->p;
    const int64_t K = p->K, V = p->V, Vw = V + K;
    for (int64_t s = 0; s < pl->n_seqs * pl->HV; s++) {
        float *h0 = w->h0 + s * K * Vw, *dht = w->d_ht + s * K * Vw;
        const float *dR = d_R ? d_R + s * K * V : NULL, *dP = d_P ? d_P + s * K * K : NULL;
        for (int64_t i = 0; i < K; i++) {
            h0[i * Vw + V + i] = 1.0f;
            for (int64_t j = 0; j < V; j++)
                dht[i * Vw + j] = !dR ? 0.0f : p->state_v_first ? dR[j * K + i] : dR[i * V + j];
            for (int64_t j = 0; j < K; j++) dht[i * Vw + V + j] = dP ? dP[i * K + j] : 0.0f;
        }
    }
}

/* The backward's rules for the grads, with no dh0. */
static linseq_status check_grads(const char *fn, const linseq_kda_problem *p,
                                 const linseq_kda_grads *gr)
{
    if (!gr) return ls_fail(fn, LINSEQ_ERR_NULL_POINTER, "argument 'grads' is NULL");
    if (gr->dh0)
        return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                       "grads->dh0 must be NULL: the summary does not depend on a start state");
    return kda_check_option_grads(fn, p, gr);
}

/* The widened backward over the validated call; q gets no gradient (it does not enter). */
static linseq_status run_widened(const char *fn, const kda_plan *pl, const linseq_exec *exec,
                                 const float *d_P, const float *d_R, const linseq_kda_grads *gr,
                                 ls_isa isa)
{
    const linseq_kda_problem *p = pl->p;
    widened w;
    linseq_status st = widened_alloc(fn, pl, gr->dv != NULL, &w);
    if (st) return st;
    widened_states(pl, d_P, d_R, &w);
    linseq_kda_problem wide = *p;
    wide.V = p->V + p->K;
    wide.v = w.v;
    wide.h0 = w.h0;
    wide.state_v_first = false;
    linseq_kda_grads wg = *gr;
    wg.dq = NULL;
    wg.dv = w.dv;
    linseq_exec ex = exec ? *exec : (linseq_exec){0};
    ex.mode = LINSEQ_MODE_CHUNKED;
    ex.chunk_size = pl->chunk;
    st = ls_kda_backward_isa(&wide, &ex, w.d_o, w.d_ht, &wg, isa);
    if (st != LINSEQ_OK) { /* only its workspace can fail: the call is validated */
        char inner[256];
        snprintf(inner, sizeof inner, "%s", linseq_last_error());
        ls_fail(fn, st, "the widened backward failed (%s)", inner);
    } else {
        const int64_t rows = p->B * p->T * pl->HV, Vw = wide.V;
        for (int64_t r = 0; gr->dv && r < rows; r++)
            memcpy(gr->dv + r * p->V, w.dv + r * Vw, (size_t)p->V * sizeof(float));
        if (gr->dq) memset(gr->dq, 0, (size_t)(p->B * p->T * p->H * p->K) * sizeof(float));
    }
    widened_free(&w);
    return st;
}

linseq_status ls_kda_segment_backward_isa(const linseq_kda_problem *problem,
                                          const linseq_exec *exec, const float *d_P,
                                          const float *d_R, const linseq_kda_grads *grads,
                                          ls_isa isa)
{
    static const char fn[] = "linseq_kda_segment_backward";
    ls_clear_error();
    kda_plan pl;
    linseq_status st;
    if ((st = check_segment(fn, problem, exec, &pl)) || (st = check_grads(fn, problem, grads)))
        return st;
    const linseq_kda_problem *p = problem;
    ls_args a = {.fn = fn};
    const float *const up[] = {d_P, d_R};
    if ((st = ls_op_add_tensors(&a, &ls_op_kda_segment, p, LS_ROLE_INPUT, p, sizeof(float))) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda_segment, p, LS_ROLE_UPSTREAM, up, sizeof(float))) ||
        (st = ls_op_add_tensors(&a, &ls_op_kda_segment, p, LS_ROLE_GRAD, grads, sizeof(float))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    int64_t wide_row, kpv;
    if (__builtin_add_overflow(p->K, p->V, &kpv) ||
        !ls_mul_ok(&wide_row, 3, kpv, p->K, (int64_t)sizeof(float)) ||
        wide_row > (int64_t)(PTRDIFF_MAX / 64))
        return ls_fail(fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "the widened state K*(V+K) = %lld*(%lld+%lld) is too large to allocate",
                       (long long)p->K, (long long)p->V, (long long)p->K);
    if ((st = ls_args_validate(&a))) return st;
    if (p->cu_seqlens && (st = ls_check_cu_seqlens(fn, p->cu_seqlens, p->n_seqs, p->B, p->T)))
        return st;
    return run_widened(fn, &pl, exec, d_P, d_R, grads, isa);
}

linseq_status linseq_kda_segment_backward(const linseq_kda_problem *problem,
                                          const linseq_exec *exec, const float *d_P,
                                          const float *d_R, const linseq_kda_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_kda_segment_backward", &isa);
    return st ? st : ls_kda_segment_backward_isa(problem, exec, d_P, d_R, grads, isa);
}
