/* linseq_conv1d_forward and linseq_conv1d_backward: one validation of the problem for both;
 * the forward driver (its kernel is conv1d_simd.c, the backward's conv1d_bwd.c and
 * conv1d_bwd_simd.c).
 *
 * A forward work item is (sequence, span of channels, chunk of tokens). Every item runs the same
 * arithmetic whichever thread takes it, so the result does not depend on the thread count. */
#include <stdlib.h>

#include "core/activation.h"
#include "core/parallel.h"
#include "core/status.h"
#include "core/validate.h"
#include "cuda/cuda_entry.h"
#include "optable/check.h"
#include "ssm/ssm_internal.h"
#include "ssm/ssm_kernels.h"

linseq_status ls_conv1d_scan(const linseq_conv1d_problem *p, const linseq_exec *exec,
                             const ssm_kernels *kern, float *y, float *state_out)
{
    conv1d_plan pl = {.p = p, .y = y, .state_out = state_out, .act = conv1d_activation(p)};
    pl.x = ssm_view_of(p->x, p->x_strides, p->channel_first, p->T, p->D, 1);
    pl.bf16 = ls_token_bytes(exec) == 2;
    pl.x_tiled = pl.x.channel != 1; /* a bfloat16 x is dense [B,T,D], read in place */
    const int64_t n_seqs = ssm_seq_count(p->cu_seqlens, p->n_seqs, p->B);
    const int64_t longest = ls_longest_sequence(p->cu_seqlens, n_seqs, p->T);
    pl.n_blocks = (p->D + CONV1D_SPAN - 1) / CONV1D_SPAN;
    pl.chunk = p->W - 1 > CONV1D_CHUNK ? p->W - 1 : CONV1D_CHUNK;
    pl.n_chunks = longest > pl.chunk ? (longest + pl.chunk - 1) / pl.chunk : 1;
    int64_t n_items;
    if (!ls_mul_ok(&n_items, 3, n_seqs, pl.n_blocks, pl.n_chunks)) return LINSEQ_ERR_OUT_OF_MEMORY;
    const int n_threads = ls_resolve_threads(
        exec, n_items, 2.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);

    /* Whole rows of CONV1D_SPAN floats: every thread's part is a multiple of 64 bytes, so
     * threads never share a cache line. */
    int64_t total_bytes;
    if (p->W > INT64_MAX / CONV1D_SPAN / 8) return LINSEQ_ERR_OUT_OF_MEMORY;
    const int64_t thread_floats =
        CONV1D_FWD_FLOATS(p->W) +
        CONV1D_FWD_TILE_FLOATS(p->W, pl.chunk, pl.x_tiled, p->channel_first);
    if (!ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)))
        return LINSEQ_ERR_OUT_OF_MEMORY;
    pl.thread_floats = (size_t)thread_floats;
    pl.workspace = aligned_alloc(64, (size_t)total_bytes);
    if (!pl.workspace) return LINSEQ_ERR_OUT_OF_MEMORY;

    ls_parallel_for(n_items, n_threads, kern->conv1d_item, &pl);
    free(pl.workspace);
    return LINSEQ_OK;
}

/* The problem (its description's checks, then conv's own) and its input tensors appended to
 * the argument table `a` (whose fn names the entry point). Run first by every entry point, so
 * the backward and decode accept exactly the problems the forward accepts. */
static linseq_status check_problem(ls_args *a, const linseq_conv1d_problem *p,
                                   const linseq_exec *exec, bool cpu_bf16)
{
    linseq_status st = ls_op_check_problem(a->fn, &ls_op_conv1d, p, exec, cpu_bf16);
    return st ? st : ls_op_add_tensors(a, &ls_op_conv1d, p, LS_ROLE_INPUT, p, ls_token_bytes(exec));
}

/* The CPU forward's bfloat16 x and y are dense [B,T,D]: what a serving engine passes. */
static linseq_status check_cpu_bf16(const char *fn, const linseq_conv1d_problem *p,
                                    const linseq_exec *exec)
{
    if (ls_token_bytes(exec) != 2 || ls_on_cuda(exec)) return LINSEQ_OK;
    if (p->channel_first || !ssm_strides_zero(p->x_strides))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "exec->dtype = LINSEQ_DTYPE_BF16 with %s; on the CPU a bfloat16 x and y "
                       "are dense [B,T,D] (channel_first = false, x_strides all zero)",
                       p->channel_first ? "channel_first" : "x_strides");
    return LINSEQ_OK;
}

/* The CUDA kernels read and write the token-major layout only. */
static linseq_status check_cuda_layout(const char *fn, const linseq_conv1d_problem *p)
{
    if (p->channel_first)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "channel_first is set; the CUDA backend takes the token-major layout "
                       "[B,T,D] only (run on the CPU, or pass channel_first = false)");
    if (p->state_tap_major || p->weight_tap_major)
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "%s is set; the CUDA backend takes conv states [N_seq,D,W-1] and a "
                       "weight [D,W] only (run on the CPU, or pass %s = false)",
                       p->state_tap_major ? "state_tap_major" : "weight_tap_major",
                       p->state_tap_major ? "state_tap_major" : "weight_tap_major");
    if (!ssm_strides_zero(p->x_strides))
        return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                       "x_strides is set; the CUDA backend takes a dense x only (all strides "
                       "zero)");
    return LINSEQ_OK;
}

linseq_status linseq_conv1d_forward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_conv1d_forward", &isa);
    return st ? st : ls_conv1d_forward_isa(p, exec, y, conv_state_out, isa);
}

linseq_status linseq_conv1d_backward(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_conv1d_backward", &isa);
    return st ? st : ls_conv1d_backward_isa(p, exec, d_y, d_conv_state_out, grads, isa);
}

linseq_status ls_conv1d_forward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                    float *y, float *conv_state_out, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_forward"};
    linseq_status st = check_problem(&a, p, exec, true);
    if (st || (st = check_cpu_bf16(a.fn, p, exec))) return st;
    const int64_t W = p->W;
    float *const out[] = {y, conv_state_out};
    if ((st = ls_op_add_tensors(&a, &ls_op_conv1d, p, LS_ROLE_OUTPUT, out, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return (st = check_cuda_layout(a.fn, p))
                   ? st
                   : ls_cuda_entry_conv1d_forward(a.fn, p, exec, y, W > 1 ? conv_state_out : NULL);

    st = ls_conv1d_scan(p, exec, ls_ssm_kernels(isa), y, W > 1 ? conv_state_out : NULL);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}

linseq_status ls_conv1d_backward_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                     const float *d_y, const float *d_conv_state_out,
                                     const linseq_conv1d_grads *grads, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_backward"};
    linseq_status st = check_problem(&a, p, exec, false);
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

    const int64_t W = p->W;
    const size_t te = ls_token_bytes(exec);
    const float *const up[] = {d_y, d_conv_state_out};
    if ((st = ls_op_add_tensors(&a, &ls_op_conv1d, p, LS_ROLE_UPSTREAM, up, te)) ||
        (st = ls_op_add_tensors(&a, &ls_op_conv1d, p, LS_ROLE_GRAD, grads, te)))
        return st;
    ls_arg_structs(&a, p, sizeof *p, grads, sizeof *grads, exec);
    if ((st = ssm_check_table(&a, exec, p->cu_seqlens, p->n_seqs, p->B, p->T))) return st;

    /* With W == 1 the state gradients do not exist: the kernel never sees their pointers. */
    linseq_conv1d_grads used = *grads;
    if (W == 1) used.dconv_state = NULL;
    if (ls_on_cuda(exec))
        return (st = check_cuda_layout(a.fn, p))
                   ? st
                   : ls_cuda_entry_conv1d_backward(a.fn, p, exec, d_y,
                                                   W > 1 ? d_conv_state_out : NULL, &used);
    st = ls_conv1d_scan_backward(p, exec, ls_ssm_kernels(isa), d_y, W > 1 ? d_conv_state_out : NULL,
                                 &used);
    if (st == LINSEQ_ERR_OUT_OF_MEMORY)
        return ls_fail(a.fn, st, "could not allocate the workspace (W = %lld)", (long long)W);
    return st;
}

/* Decode's own arguments after the problem's: sizes, the pool, the maps, y. */
static linseq_status check_decode(ls_args *a, const linseq_conv1d_problem *p, float *state,
                                  int64_t n_state_rows, int64_t state_len,
                                  const int64_t *state_rows, const int64_t *cache_seqlens, float *y,
                                  size_t te)
{
    linseq_status st;
    if (p->cu_seqlens || p->conv_state)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "problem->%s must be NULL: decode reads and writes the 'state' pool",
                       p->cu_seqlens ? "cu_seqlens" : "conv_state");
    if ((st = ls_check_min(a->fn, "n_state_rows", n_state_rows, 1))) return st;
    if (state_len < 1 || state_len < p->W - 1)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_SIZE,
                       "state_len = %lld; expected state_len >= W - 1 = %lld and >= 1",
                       (long long)state_len, (long long)(p->W - 1));
    if (!state_rows && n_state_rows < p->B)
        return ls_fail(a->fn, LINSEQ_ERR_SHAPE_MISMATCH,
                       "n_state_rows = %lld < B = %lld; without state_rows request b uses row b",
                       (long long)n_state_rows, (long long)p->B);
    ls_arg(a, "state_rows", "B", state_rows, false, LS_IN, sizeof(int64_t), 1, p->B);
    ls_arg(a, "cache_seqlens", "B", cache_seqlens, false, LS_IN, sizeof(int64_t), 1, p->B);
    if (p->state_tap_major)
        ls_arg(a, "state", "n_state_rows,state_len,D", state, true, LS_OUT, sizeof(float), 3,
               n_state_rows, state_len, p->D);
    else
        ls_arg(a, "state", "n_state_rows,D,state_len", state, true, LS_OUT, sizeof(float), 3,
               n_state_rows, p->D, state_len);
    float *const out[] = {y, NULL}; /* the state is the pool's */
    return ls_op_add_tensors(a, &ls_op_conv1d, p, LS_ROLE_OUTPUT, out, te);
}

static linseq_status check_cache_seqlens(const char *fn, const int64_t *cache_seqlens, int64_t B)
{
    for (int64_t b = 0; cache_seqlens && b < B; b++)
        if (cache_seqlens[b] < 0)
            return ls_fail(fn, LINSEQ_ERR_INVALID_VALUE,
                           "cache_seqlens[%lld] = %lld; expected >= 0 (the number of inputs "
                           "written to that request's circular state so far)",
                           (long long)b, (long long)cache_seqlens[b]);
    return LINSEQ_OK;
}

/* The decode step a serving engine takes every token: one token over tap-major states without
 * cache_seqlens, x's channels contiguous. Its kernel (conv1d_decode_span_item) also takes
 * bfloat16 x and y, and a serving engine's rows where they lie (ls_conv1d_decode_rows_isa). */
static bool span_step(const linseq_conv1d_problem *p, const int64_t *cache_seqlens)
{
    return p->state_tap_major && p->T == 1 && !cache_seqlens &&
           ssm_view_of(p->x, p->x_strides, p->channel_first, p->T, p->D, 1).channel == 1;
}

static linseq_status check_decode_bf16(const char *fn, const linseq_conv1d_problem *p,
                                       const linseq_exec *exec, const int64_t *cache_seqlens)
{
    if (ls_token_bytes(exec) != 2 || span_step(p, cache_seqlens)) return LINSEQ_OK;
    return ls_fail(fn, LINSEQ_ERR_UNSUPPORTED,
                   "exec->dtype = LINSEQ_DTYPE_BF16; the CPU decode takes bfloat16 x and y for "
                   "one token (T = 1) over tap-major states (state_tap_major) without "
                   "cache_seqlens, x's channels contiguous; this call has T = %lld, "
                   "state_tap_major = %d, "
                   "cache_seqlens %s",
                   (long long)p->T, (int)p->state_tap_major, cache_seqlens ? "given" : "NULL");
}

/* The checked step: its items, threads and workspace, then the kernels. */
static linseq_status decode_run(const char *fn, conv1d_decode_plan *pl, const linseq_exec *exec,
                                ls_isa isa)
{
    const linseq_conv1d_problem *p = pl->p;
    pl->x = ssm_view_of(p->x, p->x_strides, p->channel_first, p->T, p->D, 1);
    pl->act = conv1d_activation(p);
    /* Tap-major rows stepped one token: vectors straight from the rows, a span over every
     * request (conv1d_decode_span_item); else one item per request and block of channels. */
    const bool by_span =
        p->state_tap_major && p->T == 1 && !pl->cache_seqlens && pl->x.channel == 1;
    const int64_t n_items = by_span ? (p->D + CONV1D_SPAN - 1) / CONV1D_SPAN
                                    : p->B * ((p->D + SSM_LANES - 1) / SSM_LANES);
    const int n_threads = ls_resolve_threads(
        exec, n_items, 2.0 * (double)p->B * (double)p->T * (double)p->D * (double)p->W);
    int64_t thread_floats, total_bytes;
    if (p->W > INT64_MAX / 4 / CONV1D_SPAN || p->T > INT64_MAX / 4 / SSM_LANES ||
        !ls_mul_ok(&thread_floats, 2, by_span ? p->W : CONV1D_DECODE_FLOATS(p->W, p->T) / SSM_LANES,
                   (int64_t)(by_span ? CONV1D_SPAN : SSM_LANES)) ||
        !ls_mul_ok(&total_bytes, 3, thread_floats, (int64_t)n_threads, (int64_t)sizeof(float)) ||
        !(pl->workspace = aligned_alloc(64, (size_t)total_bytes)))
        return ls_fail(fn, LINSEQ_ERR_OUT_OF_MEMORY,
                       "could not allocate the decode workspace (W = %lld, T = %lld)",
                       (long long)p->W, (long long)p->T);
    pl->thread_floats = (size_t)thread_floats;
    const ssm_kernels *kern = ls_ssm_kernels(isa);
    /* bf16 rows rounded by AVX512-BF16's instruction where the CPU has it (the same bits) */
    const bool round_by_instruction = isa == LS_ISA_AVX512 && ls_cpu_has_bf16_dot();
    ls_parallel_for_static(n_items, n_threads,
                           !by_span               ? kern->conv1d_decode_item
                           : round_by_instruction ? kern->conv1d_decode_span_item_bf16
                                                  : kern->conv1d_decode_span_item,
                           pl);
    free(pl->workspace);
    return LINSEQ_OK;
}

linseq_status ls_conv1d_decode_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                   float *state, int64_t n_state_rows, int64_t state_len,
                                   const int64_t *state_rows, const int64_t *cache_seqlens,
                                   float *y, ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_conv1d_decode"};
    linseq_status st = check_problem(&a, p, exec, true);
    if (st || (st = check_decode_bf16(a.fn, p, exec, cache_seqlens))) return st;
    const size_t te = ls_token_bytes(exec);
    if ((st =
             check_decode(&a, p, state, n_state_rows, state_len, state_rows, cache_seqlens, y, te)))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, NULL, 0, p->B, p->T))) return st;
    if (ls_on_cuda(exec))
        return ls_fail(a.fn, LINSEQ_ERR_UNSUPPORTED,
                       "exec->device is CUDA; linseq_conv1d_decode runs on the CPU only");
    if ((state_rows && (st = ls_check_state_rows(a.fn, state_rows, p->B, n_state_rows))) ||
        (st = check_cache_seqlens(a.fn, cache_seqlens, p->B)))
        return st;
    conv1d_decode_plan pl = {.p = p,
                             .y = y,
                             .state = state,
                             .state_len = state_len,
                             .rows = state_rows,
                             .cache_seqlens = cache_seqlens,
                             .bf16 = te == 2};
    return decode_run(a.fn, &pl, exec, isa);
}

bool ls_conv1d_decode_rows_take(const linseq_conv1d_problem *p, linseq_pool_dtype dtype)
{
    /* W = 1 keeps no window: the gathered path gives the decode's own refusal of it */
    return dtype != LINSEQ_POOL_F16 && p->W >= 2 && span_step(p, NULL);
}

linseq_status ls_conv1d_decode_rows_isa(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                        const ls_state_rows *rows, int64_t n_rows, float *y,
                                        ls_isa isa)
{
    ls_clear_error();
    ls_args a = {.fn = "linseq_op_decode_pool"};
    linseq_status st = check_problem(&a, p, exec, true);
    if (st || (st = check_decode_bf16(a.fn, p, exec, NULL))) return st;
    float *const out[] = {y, NULL}; /* the states are the pool's */
    if ((st = ls_op_add_decode_rows(&a, &ls_op_conv1d, p, rows, n_rows, out, ls_token_bytes(exec))))
        return st;
    ls_arg_structs(&a, p, sizeof *p, NULL, 0, exec);
    if ((st = ssm_check_table(&a, exec, NULL, 0, p->B, p->T))) return st;
    if (!ls_conv1d_decode_rows_take(p, rows->dtype)) /* the pool layer asks first */
        return ls_fail(a.fn, LINSEQ_ERR_UNSUPPORTED,
                       "internal: a conv decode over rows it "
                       "does not take");
    conv1d_decode_plan pl = {
        .p = p, .y = y, .state_len = p->W - 1, .bf16 = ls_token_bytes(exec) == 2, .by_row = rows};
    return decode_run(a.fn, &pl, exec, isa);
}

linseq_status linseq_conv1d_decode(const linseq_conv1d_problem *p, const linseq_exec *exec,
                                   float *state, int64_t n_state_rows, int64_t state_len,
                                   const int64_t *state_rows, const int64_t *cache_seqlens,
                                   float *y)
{
    ls_isa isa;
    linseq_status st = ls_isa_resolve("linseq_conv1d_decode", &isa);
    return st ? st
              : ls_conv1d_decode_isa(p, exec, state, n_state_rows, state_len, state_rows,
                                     cache_seqlens, y, isa);
}
