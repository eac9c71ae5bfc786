/* The argument-table rows of SSM1's and conv1d's per-token tensors in any layout: strided
 * inputs are checked as the span of memory their strides reach, so that the aliasing check
 * sees every byte a kernel may read. */
#include "core/status.h"
#include "ssm/ssm_internal.h"

/* acc += (n - 1) * stride, false on overflow past PTRDIFF_MAX elements. */
static bool add_reach(int64_t *acc, int64_t n, int64_t stride)
{
    int64_t step;
    if (__builtin_mul_overflow(n - 1, stride, &step) || __builtin_add_overflow(*acc, step, acc))
        return false;
    return *acc <= (int64_t)PTRDIFF_MAX;
}

linseq_status ssm_arg_strided(ls_args *a, const char *name, const char *strides_name,
                              const float *ptr, bool required, linseq_strides s, bool channel_first,
                              size_t elem, int64_t B, int64_t T, int64_t C, int64_t S)
{
    if (ssm_strides_zero(s)) {
        ssm_arg_dense(a, name, ptr, required, LS_IN, channel_first, elem, B, T, C, S);
        return LINSEQ_OK;
    }
    if (s.batch < 0 || s.token < 0 || s.channel < 0 || s.state < 0)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "%s = {batch %lld, token %lld, channel %lld, state %lld}; expected "
                       "strides >= 0 (in elements; 0 repeats the same elements)",
                       strides_name, (long long)s.batch, (long long)s.token, (long long)s.channel,
                       (long long)s.state);
    if (!S && s.state)
        return ls_fail(a->fn, LINSEQ_ERR_INVALID_VALUE,
                       "%s.state = %lld; expected 0 ('%s' has no state axis)", strides_name,
                       (long long)s.state, name);
    /* The last element any index reaches, plus one: the span the caller's memory must hold. */
    int64_t span = 1;
    if (!add_reach(&span, B, s.batch) || !add_reach(&span, T, s.token) ||
        !add_reach(&span, C, s.channel) || (S && !add_reach(&span, S, s.state)) ||
        span > (int64_t)(PTRDIFF_MAX / (int64_t)elem))
        return ls_fail(a->fn, LINSEQ_ERR_SIZE_OVERFLOW,
                       "%s = {batch %lld, token %lld, channel %lld, state %lld} reach past "
                       "PTRDIFF_MAX bytes from '%s'; expected strides whose span (B-1)*batch + "
                       "(T-1)*token + ... fits in memory",
                       strides_name, (long long)s.batch, (long long)s.token, (long long)s.channel,
                       (long long)s.state, name);
    ls_arg(a, name, strides_name, ptr, required, LS_IN, elem, 1, span);
    return LINSEQ_OK;
}

ls_tensor *ssm_arg_dense(ls_args *a, const char *name, const float *ptr, bool required,
                         ls_role role, bool channel_first, size_t elem, int64_t B, int64_t T,
                         int64_t C, int64_t S)
{
    if (S) {
        if (channel_first)
            return ls_arg(a, name, "B,G,N,T", ptr, required, role, elem, 4, B, C, S, T);
        return ls_arg(a, name, "B,T,G,N", ptr, required, role, elem, 4, B, T, C, S);
    }
    if (channel_first) return ls_arg(a, name, "B,D,T", ptr, required, role, elem, 3, B, C, T);
    return ls_arg(a, name, "B,T,D", ptr, required, role, elem, 3, B, T, C);
}
