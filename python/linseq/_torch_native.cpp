/* The CPU kernels of linseq's decode custom ops (linseq::kda_decode, conv_state_update,
 * mamba_state_update) in C++, so that a decode step's call from PyTorch costs a dispatch and
 * one library call instead of Python around it.
 *
 * The ops themselves (schemas, fake kernels, autograd) stay defined in Python
 * (linseq/_torch_ops.py); this library only registers their CPU kernels, which the dispatcher
 * prefers to the Python bodies (registered as CompositeExplicitAutograd). A kernel here takes
 * the common form of its call: every tensor of the dtype and shape the library reads, sizes
 * checked against the tensors so that the library never reads past one. Anything else (another
 * dtype or layout to convert, a bad size or row to refuse with the Python path's message) goes
 * to linseq::<op>_fallback, the op's Python body under another name, which converts or refuses
 * it as before. A refusal of the library itself is a c10::ValueError with its message.
 *
 * Also the vLLM plugin's decode steps over vLLM's state pools (linseq::vllm_gdn_decode,
 * vllm_conv_update, vllm_ssd_decode), defined here: linseq.integrations.vllm calls them for the common form of
 * its decode calls, and takes any other form in Python.
 *
 * Not linked against liblinseq: linseq/_torch_native.py hands in the entry points of the
 * library the package loaded (linseq_torch_native_bind), as for the XLA FFI handlers. */
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "linseq.h"

#define NATIVE_API extern "C" __attribute__((visibility("default")))

namespace
{

using at::Tensor;
using OptTensor = std::optional<Tensor>;

/* The library's entry points, bound once before any kernel runs. */
struct Entries {
    decltype(&linseq_kda_decode) kda_decode = nullptr;
    decltype(&linseq_conv1d_decode) conv1d_decode = nullptr;
    decltype(&linseq_ssm1_decode) ssm1_decode = nullptr;
    decltype(&linseq_op_decode_pool) op_decode_pool = nullptr;
    decltype(&linseq_kda_forward) kda_forward = nullptr;
    decltype(&linseq_state_pool_row_stride) state_pool_row_stride = nullptr;
    decltype(&linseq_last_error) last_error = nullptr;
};
Entries entries;

/* Each entry point by its name without the "linseq_" prefix (linseq_torch_native_bind). */
const struct {
    const char *name;
    void **slot;
} entry_slots[] = {
    {"kda_decode", reinterpret_cast<void **>(&entries.kda_decode)},
    {"conv1d_decode", reinterpret_cast<void **>(&entries.conv1d_decode)},
    {"ssm1_decode", reinterpret_cast<void **>(&entries.ssm1_decode)},
    {"op_decode_pool", reinterpret_cast<void **>(&entries.op_decode_pool)},
    {"kda_forward", reinterpret_cast<void **>(&entries.kda_forward)},
    {"state_pool_row_stride", reinterpret_cast<void **>(&entries.state_pool_row_stride)},
    {"last_error", reinterpret_cast<void **>(&entries.last_error)}};

bool bound()
{
    for (const auto &entry : entry_slots)
        if (!*entry.slot) return false;
    return true;
}

void check(linseq_status status) { TORCH_CHECK_VALUE(status == LINSEQ_OK, entries.last_error()); }

/* ---------------------------------------------------------------------------------------- */
/* What a tensor must be for the library to read it where it lies                            */
/* ---------------------------------------------------------------------------------------- */

bool aligned(const Tensor &t)
{
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() == 0;
}

bool is_f32(const Tensor &t)
{
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && aligned(t);
}

/* A dense tensor of exactly `shape`. */
bool dense(const Tensor &t, at::ScalarType dtype, at::IntArrayRef shape)
{
    return t.device().is_cpu() && t.scalar_type() == dtype && t.sizes() == shape &&
           t.is_contiguous() && aligned(t);
}

bool dense_f32(const Tensor &t, at::IntArrayRef shape) { return dense(t, at::kFloat, shape); }

bool absent_or_dense_f32(const OptTensor &t, at::IntArrayRef shape)
{
    return !t || dense_f32(*t, shape);
}

/* A float32 view the library reads through its strides: not one whose every dimension of
 * size > 1 has stride 0 (all-zero strides are "dense" to the library). */
bool strided_f32(const Tensor &t)
{
    if (!is_f32(t)) return false;
    bool repeated = false, moves = false;
    for (int64_t i = 0; i < t.dim(); i++)
        if (t.size(i) > 1) {
            repeated = true;
            moves = moves || t.stride(i) != 0;
        }
    return !repeated || moves;
}

/* Row indices the library may be given: int64 [batch], each below `entries`, none shared
 * (negative: padding). The Python path refuses the others with its own message. */
bool valid_rows(const Tensor &rows, int64_t batch, int64_t n_rows)
{
    if (!dense(rows, at::kLong, {batch})) return false;
    const int64_t *r = rows.data_ptr<int64_t>();
    std::vector<int64_t> named;
    for (int64_t b = 0; b < batch; b++) {
        if (r[b] >= n_rows) return false;
        if (r[b] >= 0) named.push_back(r[b]);
    }
    std::sort(named.begin(), named.end());
    return std::adjacent_find(named.begin(), named.end()) == named.end();
}

/* The exec of the Python path's calls: the default chunk size and thread count, on the CPU. */
linseq_exec cpu_exec(linseq_mode mode, linseq_dtype dtype)
{
    linseq_exec exec{};
    exec.mode = mode;
    exec.chunk_size = 64;
    exec.device = LINSEQ_DEVICE_CPU;
    exec.dtype = dtype;
    return exec;
}

const float *f32_ptr(const OptTensor &t) { return t ? t->const_data_ptr<float>() : nullptr; }

/* The calls passed on to the Python bodies so far (linseq_torch_native_passed_on). */
std::atomic<int64_t> passed_on{0};

/* linseq::<op>_fallback: the Python body of the op, for a call the kernel does not take. */
c10::OperatorHandle fallback(const char *op)
{
    return c10::Dispatcher::singleton().findSchemaOrThrow(
        (std::string("linseq::") + op + "_fallback").c_str(), "");
}

const c10::DispatchKeySet CPU_KEYS(c10::DispatchKey::CPU);

/* ---------------------------------------------------------------------------------------- */
/* linseq::conv_state_update: causal_conv1d_update into a pool of conv states                */
/* ---------------------------------------------------------------------------------------- */

struct ConvCall {
    const Tensor &x, &state, &weight;
    const OptTensor &bias;
    std::optional<c10::string_view> activation;
    const OptTensor &cache_seqlens;
    const Tensor *rows; /* nullptr: request b in row b, one row per request */
};

bool conv_common(const ConvCall &c)
{
    if (c.x.dim() != 3 || c.state.dim() != 3 || c.weight.dim() != 2) return false;
    const int64_t b = c.x.size(0), d = c.x.size(1), l = c.x.size(2);
    const int64_t R = c.state.size(0), L = c.state.size(2), W = c.weight.size(1);
    if (std::min({b, d, l, R, L, W}) < 1 || L < W - 1) return false;
    if (c.activation && *c.activation != "silu") return false;
    if (!strided_f32(c.x) || !dense_f32(c.state, {R, d, L}) || !dense_f32(c.weight, {d, W}) ||
        !absent_or_dense_f32(c.bias, {d}) || !(c.rows ? valid_rows(*c.rows, b, R) : R == b))
        return false;
    if (!c.cache_seqlens) return true;
    if (!dense(*c.cache_seqlens, at::kLong, {b})) return false;
    const int64_t *seqlens = c.cache_seqlens->data_ptr<int64_t>();
    return std::all_of(seqlens, seqlens + b, [](int64_t s) { return s >= 0; });
}

Tensor conv_run(const ConvCall &c)
{
    const int64_t b = c.x.size(0), d = c.x.size(1), l = c.x.size(2);
    const bool channel_first = c.x.stride(1) >= c.x.stride(2); /* else a transposed [b,l,d] */
    linseq_conv1d_problem p{};
    p.B = b;
    p.T = l;
    p.D = d;
    p.W = c.weight.size(1);
    p.x = c.x.const_data_ptr<float>();
    p.weight = c.weight.const_data_ptr<float>();
    p.bias = f32_ptr(c.bias);
    p.activation = c.activation ? LINSEQ_ACT_SILU : LINSEQ_ACT_IDENTITY;
    p.channel_first = channel_first;
    p.x_strides = {c.x.stride(0), c.x.stride(2), c.x.stride(1), 0};
    Tensor y =
        channel_first ? at::empty({b, d, l}, c.x.options()) : at::empty({b, l, d}, c.x.options());
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_CHUNKED, LINSEQ_DTYPE_F32);
    const int64_t *seqlens = c.cache_seqlens ? c.cache_seqlens->const_data_ptr<int64_t>() : nullptr;
    const int64_t *rows = c.rows ? c.rows->const_data_ptr<int64_t>() : nullptr;
    check(entries.conv1d_decode(&p, &exec, c.state.data_ptr<float>(), c.state.size(0),
                                c.state.size(2), rows, seqlens, y.data_ptr<float>()));
    return channel_first ? y : y.transpose(1, 2);
}

Tensor conv_state_update(const Tensor &x, const Tensor &state, const Tensor &weight,
                         const OptTensor &bias, std::optional<c10::string_view> activation,
                         const OptTensor &cache_seqlens, const Tensor &rows)
{
    const ConvCall call{x, state, weight, bias, activation, cache_seqlens, &rows};
    if (bound() && conv_common(call)) return conv_run(call);
    passed_on++;
    static const auto general =
        fallback("conv_state_update")
            .typed<Tensor(const Tensor &, const Tensor &, const Tensor &, const OptTensor &,
                          std::optional<c10::string_view>, const OptTensor &, const Tensor &)>();
    return general.redispatch(CPU_KEYS, x, state, weight, bias, activation, cache_seqlens, rows);
}

/* ---------------------------------------------------------------------------------------- */
/* linseq::mamba_state_update: one SSM1 token per request into a pool [R, H, P, N]           */
/* ---------------------------------------------------------------------------------------- */

struct ScanCall {
    const Tensor &state;
    const Tensor *rows; /* nullptr: request b in row b, one row per request */
    const Tensor &x, &dt, &A, &B, &C;
    const OptTensor &D, &z, &dt_bias;
    bool dt_softplus;
};

bool scan_token_input(const Tensor &t, int64_t b, int64_t d)
{
    return t.dim() == 2 && t.size(0) == b && t.size(1) == d && strided_f32(t);
}

bool scan_common(const ScanCall &c)
{
    if (c.x.dim() != 2 || c.state.dim() != 4 || c.B.dim() != 3 || c.C.dim() != 3) return false;
    const int64_t b = c.x.size(0), d = c.x.size(1);
    const int64_t R = c.state.size(0), N = c.state.size(3);
    const int64_t gb = c.B.size(1), gc = c.C.size(1), G = std::max(gb, gc);
    if (std::min({b, d, N, R}) < 1 || c.state.size(1) * c.state.size(2) != d ||
        (gb != gc && std::min(gb, gc) != 1) || d % G != 0)
        return false;
    /* the kernel adds dt_bias only with its softplus: the Python path adds it first */
    if (c.dt_bias && !c.dt_softplus) return false;
    auto groups = [&](const Tensor &t) {
        return t.size(0) == b && t.size(2) == N && strided_f32(t);
    };
    return dense_f32(c.state, c.state.sizes()) && dense_f32(c.A, {d, N}) &&
           absent_or_dense_f32(c.D, {d}) && absent_or_dense_f32(c.dt_bias, {d}) &&
           scan_token_input(c.x, b, d) && scan_token_input(c.dt, b, d) &&
           (!c.z || scan_token_input(*c.z, b, d)) && groups(c.B) && groups(c.C) &&
           (c.rows ? valid_rows(*c.rows, b, R) : R == b);
}

/* (batch, token, channel, state) element strides of a [b, d] tensor read as [b, 1, d]. */
linseq_strides token_strides(const Tensor &t)
{
    return {t.stride(0), t.stride(1) * t.size(1), t.stride(1), 0};
}

/* B or C [b, G, N] read as [b, 1, G, N]; a single group is read by every group of the problem
 * through a zero group stride. */
linseq_strides group_strides(const Tensor &t)
{
    return {t.stride(0), t.stride(1) * t.size(1), t.size(1) > 1 ? t.stride(1) : 0, t.stride(2)};
}

Tensor scan_run(const ScanCall &c)
{
    const int64_t b = c.x.size(0), d = c.x.size(1);
    const int64_t G = std::max(c.B.size(1), c.C.size(1));
    linseq_ssm1_problem p{};
    p.B = b;
    p.T = 1;
    p.D = d;
    p.N = c.state.size(3);
    p.G = G > 1 ? G : 0;
    p.x = c.x.const_data_ptr<float>();
    p.dt = c.dt.const_data_ptr<float>();
    p.A = c.A.const_data_ptr<float>();
    p.B_proj = c.B.const_data_ptr<float>();
    p.C_proj = c.C.const_data_ptr<float>();
    p.D_skip = f32_ptr(c.D);
    p.gate = f32_ptr(c.z);
    p.dt_softplus = c.dt_softplus;
    p.dt_bias = f32_ptr(c.dt_bias);
    p.gate_activation = LINSEQ_ACT_SILU;
    p.x_strides = token_strides(c.x);
    p.dt_strides = token_strides(c.dt);
    if (c.z) p.gate_strides = token_strides(*c.z);
    p.B_strides = group_strides(c.B);
    p.C_strides = group_strides(c.C);
    Tensor y = at::empty({b, d}, c.x.options());
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_CHUNKED, LINSEQ_DTYPE_F32);
    const int64_t *rows = c.rows ? c.rows->const_data_ptr<int64_t>() : nullptr;
    check(entries.ssm1_decode(&p, &exec, c.state.data_ptr<float>(), c.state.size(0), rows,
                              y.data_ptr<float>()));
    return y;
}

Tensor mamba_state_update(const Tensor &state, const Tensor &rows, const Tensor &x,
                          const Tensor &dt, const Tensor &A, const Tensor &B, const Tensor &C,
                          const OptTensor &D, const OptTensor &z, const OptTensor &dt_bias,
                          bool dt_softplus)
{
    const ScanCall call{state, &rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus};
    if (bound() && scan_common(call)) return scan_run(call);
    passed_on++;
    static const auto general =
        fallback("mamba_state_update")
            .typed<Tensor(const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                          const Tensor &, const Tensor &, const Tensor &, const OptTensor &,
                          const OptTensor &, const OptTensor &, bool)>();
    return general.redispatch(CPU_KEYS, state, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus);
}

/* ---------------------------------------------------------------------------------------- */
/* linseq::kda_decode: one KDA / Gated DeltaNet token per request into a pool of states      */
/* ---------------------------------------------------------------------------------------- */

struct KdaCall {
    const OptTensor &q, &k, &v, &beta, &g, &h0, &A_log, &dt_bias;
    const Tensor &state;
    const OptTensor &rows;
    std::optional<double> scale;
    bool qk_l2norm, beta_is_logit, state_v_first, gate_in_kernel;
    std::optional<double> lower_bound;
};

/* bfloat16 storage when q, k, v and the beta and g given are all bfloat16 (ops.kda_bf16_storage);
 * float32 when all are float32; nullopt for any other mix (the Python path converts it). */
std::optional<at::ScalarType> kda_storage(const KdaCall &c)
{
    for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
        auto is = [&](const OptTensor &t) { return t->scalar_type() == dtype; };
        if (is(c.q) && is(c.k) && is(c.v) && (!c.beta || is(c.beta)) && (!c.g || is(c.g)))
            return dtype;
    }
    return std::nullopt;
}

bool kda_common(const KdaCall &c, at::ScalarType dtype)
{
    const Tensor &q = *c.q;
    if (q.dim() != 4 || c.v->dim() != 4 || c.state.dim() != 4) return false;
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
    const int64_t HV = c.v->size(2), V = c.v->size(3), R = c.state.size(0);
    if (T != 1 || std::min({B, H, K, HV, V, R}) < 1 || HV % H != 0) return false;
    const bool per_channel = c.g && c.g->dim() == 4;
    auto per_token = [&](const OptTensor &t, at::IntArrayRef shape) {
        return !t || dense(*t, dtype, shape);
    };
    const std::vector<int64_t> g_shape =
        per_channel ? std::vector<int64_t>{B, 1, HV, K} : std::vector<int64_t>{B, 1, HV};
    const std::vector<int64_t> row_shape =
        c.state_v_first ? std::vector<int64_t>{R, HV, V, K} : std::vector<int64_t>{R, HV, K, V};
    return per_token(c.q, {B, 1, H, K}) && per_token(c.k, {B, 1, H, K}) &&
           per_token(c.v, {B, 1, HV, V}) && per_token(c.beta, {B, 1, HV}) &&
           per_token(c.g, g_shape) && dense_f32(c.state, row_shape) &&
           (!c.rows || dense(*c.rows, at::kLong, {B}));
}

/* The options the kernel here takes: no gate in the kernel, no h0 (decode reads the pool), a
 * scale that stays a finite non-zero float32 (the Python path refuses the others by name). */
bool kda_plain_options(const KdaCall &c)
{
    if (c.gate_in_kernel || c.lower_bound || c.h0 || c.A_log || c.dt_bias) return false;
    if (!c.q || !c.k || !c.v) return false;
    if (!c.scale) return true;
    const float scale = static_cast<float>(*c.scale);
    return std::isfinite(scale) && scale != 0.0f;
}

/* A token's tensor (or none) as the library reads it: the same pointer for bfloat16 storage,
 * which the exec's dtype names. */
const float *token_ptr(const Tensor *t)
{
    return t ? static_cast<const float *>(t->const_data_ptr()) : nullptr;
}

/* The problem of one token per request over [B, H, K] q and k, [B, HV, V] v, beta and g of
 * `decay` (each with any leading axes of size 1): sizes and pointers, the options left at
 * their defaults. */
linseq_kda_problem one_token_problem(int64_t B, const Tensor &q, const Tensor &k, const Tensor &v,
                                     const Tensor *beta, const Tensor *g, linseq_decay decay)
{
    linseq_kda_problem p{};
    p.B = B;
    p.T = 1;
    p.H = q.size(-2);
    p.K = q.size(-1);
    p.HV = v.size(-2);
    p.V = v.size(-1);
    p.q = token_ptr(&q);
    p.k = token_ptr(&k);
    p.v = token_ptr(&v);
    p.beta = token_ptr(beta);
    p.g = token_ptr(g);
    p.decay = decay;
    return p;
}

/* The problem of kda_decode's call, one token per request. */
linseq_kda_problem kda_token_problem(const KdaCall &c)
{
    const linseq_decay decay = !c.g              ? LINSEQ_DECAY_NONE
                               : c.g->dim() == 4 ? LINSEQ_DECAY_PER_CHANNEL
                                                 : LINSEQ_DECAY_PER_HEAD;
    linseq_kda_problem p = one_token_problem(
        c.q->size(0), *c.q, *c.k, *c.v, c.beta ? &*c.beta : nullptr, c.g ? &*c.g : nullptr, decay);
    p.scale = c.scale ? static_cast<float>(*c.scale) : 0.0f;
    p.qk_l2norm = c.qk_l2norm;
    p.beta_is_logit = c.beta_is_logit;
    p.state_v_first = c.state_v_first;
    return p;
}

Tensor kda_run(const KdaCall &c, at::ScalarType dtype)
{
    const linseq_kda_problem p = kda_token_problem(c);
    Tensor o = at::empty({p.B, 1, p.HV, p.V}, c.v->options().dtype(dtype));
    const linseq_exec exec = cpu_exec(
        LINSEQ_MODE_RECURRENT, dtype == at::kBFloat16 ? LINSEQ_DTYPE_BF16 : LINSEQ_DTYPE_F32);
    const int64_t *rows = c.rows ? c.rows->const_data_ptr<int64_t>() : nullptr;
    check(entries.kda_decode(&p, &exec, c.state.data_ptr<float>(), c.state.size(0), rows,
                             static_cast<float *>(o.data_ptr())));
    return o;
}

Tensor kda_decode(const OptTensor &q, const OptTensor &k, const OptTensor &v, const OptTensor &beta,
                  const OptTensor &g, const OptTensor &h0, const OptTensor &A_log,
                  const OptTensor &dt_bias, const Tensor &state, const OptTensor &state_rows,
                  std::optional<double> scale, bool qk_l2norm, bool beta_is_logit,
                  bool state_v_first, bool gate_in_kernel, std::optional<double> lower_bound,
                  c10::string_view exec_mode, int64_t chunk_size, bool bf16_products)
{
    const KdaCall call(q, k, v, beta, g, h0, A_log, dt_bias, state, state_rows, scale, qk_l2norm,
                       beta_is_logit, state_v_first, gate_in_kernel, lower_bound);
    if (bound() && kda_plain_options(call)) {
        const auto dtype = kda_storage(call);
        if (dtype && kda_common(call, *dtype)) return kda_run(call, *dtype);
    }
    passed_on++;
    static const auto general =
        fallback("kda_decode")
            .typed<Tensor(const OptTensor &, const OptTensor &, const OptTensor &,
                          const OptTensor &, const OptTensor &, const OptTensor &,
                          const OptTensor &, const OptTensor &, const Tensor &, const OptTensor &,
                          std::optional<double>, bool, bool, bool, bool, std::optional<double>,
                          c10::string_view, int64_t, bool)>();
    return general.redispatch(CPU_KEYS, q, k, v, beta, g, h0, A_log, dt_bias, state, state_rows,
                              scale, qk_l2norm, beta_is_logit, state_v_first, gate_in_kernel,
                              lower_bound, exec_mode, chunk_size, bf16_products);
}

/* ---------------------------------------------------------------------------------------- */
/* vLLM's decode steps on its own pools (linseq.integrations.vllm)                           */
/* ---------------------------------------------------------------------------------------- */
/* The plugin's hot path, where its Python cost more than the kernel at batch 1: the problem
 * filled from vLLM's tensors as they are and the pool read where it lies, in one call of
 * linseq_op_decode_pool. A call of another form returns no tensor, and the plugin's Python
 * path takes it (converts it, leaves it to vLLM's own op, or refuses it by name). */

std::optional<linseq_pool_dtype> pool_dtype(at::ScalarType dtype)
{
    switch (dtype) {
    case at::kFloat: return LINSEQ_POOL_F32;
    case at::kBFloat16: return LINSEQ_POOL_BF16;
    case at::kHalf: return LINSEQ_POOL_F16;
    default: return std::nullopt;
    }
}

/* vLLM's slot indices: int32 or int64, [batch] or the [batch, 1] column, dense. */
bool slot_indices(const Tensor &slots, int64_t batch)
{
    const auto type = slots.scalar_type();
    return slots.device().is_cpu() && (type == at::kInt || type == at::kLong) &&
           slots.is_contiguous() && slots.numel() == batch &&
           (slots.dim() == 1 || (slots.dim() == 2 && slots.size(1) == 1));
}

/* The pool [slots, *row_shape] as the library reads it in place (its layout rule:
 * linseq_state_pool_row_stride), request b on row slots[b]; nullopt for another layout or
 * dtype. */
std::optional<linseq_state_pool> pool_in_place(const Tensor &pool, at::IntArrayRef row_shape,
                                               const Tensor &slots,
                                               std::optional<int64_t> pad_value = std::nullopt)
{
    const auto dtype = pool_dtype(pool.scalar_type());
    int64_t row_stride = 0;
    if (!dtype || !pool.device().is_cpu() || !aligned(pool) || pool.dim() < 1 ||
        pool.sizes().slice(1) != row_shape ||
        entries.state_pool_row_stride(static_cast<int>(pool.dim()), pool.sizes().data(),
                                      pool.strides().data(), &row_stride) != LINSEQ_OK)
        return std::nullopt;
    linseq_state_pool spec{};
    spec.data = pool.data_ptr();
    spec.n_rows = pool.size(0);
    spec.row_stride = row_stride;
    spec.dtype = *dtype;
    spec.src_rows = slots.const_data_ptr();
    spec.index_bits = static_cast<int>(slots.element_size() * 8);
    spec.has_pad_value = pad_value.has_value();
    spec.pad_value = pad_value.value_or(0);
    return spec;
}

template <typename Index> bool counts_up(const Tensor &offsets)
{
    const Index *c = offsets.const_data_ptr<Index>();
    for (int64_t i = 0; i < offsets.numel(); i++)
        if (c[i] != i) return false;
    return true;
}

/* cu_seqlens absent, or 0, 1, ..., batch: one token per request. */
bool one_token_each(const OptTensor &cu_seqlens, int64_t batch)
{
    if (!cu_seqlens) return true;
    const Tensor &cu = *cu_seqlens;
    if (!cu.device().is_cpu() || cu.dim() != 1 || cu.numel() != batch + 1 || !cu.is_contiguous())
        return false;
    return cu.scalar_type() == at::kInt    ? counts_up<int32_t>(cu)
           : cu.scalar_type() == at::kLong ? counts_up<int64_t>(cu)
                                           : false;
}

/* A dense per-token tensor of `dtype` holding `count` items of shape `item` (its last
 * dimensions), whatever its leading dimensions: vLLM's [1, batch, ...] or [batch, ...]. */
bool dense_items(const Tensor &t, at::ScalarType dtype, int64_t count, at::IntArrayRef item)
{
    const int64_t lead = t.dim() - static_cast<int64_t>(item.size());
    if (!t.device().is_cpu() || t.scalar_type() != dtype || lead < 0 || !t.is_contiguous() ||
        !aligned(t))
        return false;
    int64_t n = count;
    for (size_t i = 0; i < item.size(); i++) {
        if (t.size(lead + static_cast<int64_t>(i)) != item[i]) return false;
        n *= item[i];
    }
    return t.numel() == n;
}

/* A layer's parameter of n values as float32: where it lies, or a bfloat16 one widened into
 * `widened`; nullptr for another form. */
const float *param_f32(const Tensor &t, int64_t n, std::vector<float> &widened)
{
    if (!t.device().is_cpu() || t.numel() != n || !t.is_contiguous()) return nullptr;
    if (t.scalar_type() == at::kFloat) return aligned(t) ? t.const_data_ptr<float>() : nullptr;
    if (t.scalar_type() != at::kBFloat16) return nullptr;
    const at::BFloat16 *h = t.const_data_ptr<at::BFloat16>();
    widened.assign(h, h + n);
    return widened.data();
}

linseq_dtype token_dtype(at::ScalarType t)
{
    return t == at::kBFloat16 ? LINSEQ_DTYPE_BF16 : LINSEQ_DTYPE_F32;
}

/* linseq::vllm_gdn_decode: vLLM's fused_sigmoid_gating_delta_rule_update at one token per
 * request. q, k [(1,) B, H, K], v [(1,) B, HV, V], a, b [B, HV] all bfloat16 or all float32;
 * the decay -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) in the kernel; request i
 * on row slots[i] (negative: padding) of the pool [rows, HV, K, V]. Returns [o [B,1,HV,V] in
 * v's dtype], or nothing where the call has another form. */
std::vector<Tensor> vllm_gdn_decode(const Tensor &A_log, const Tensor &dt_bias, const Tensor &q,
                                    const Tensor &k, const Tensor &v, const Tensor &a,
                                    const Tensor &b, const Tensor &pool, const Tensor &slots,
                                    const OptTensor &cu_seqlens, bool qk_l2norm, double l2norm_eps)
{
    if (!bound() || a.dim() != 2 || q.dim() < 2 || v.dim() < 2) return {};
    const int64_t B = a.size(0), HV = a.size(1), H = q.size(-2), K = q.size(-1), V = v.size(-1);
    const at::ScalarType dtype = v.scalar_type();
    if ((dtype != at::kFloat && dtype != at::kBFloat16) || std::min({B, HV, H, K, V}) < 1 ||
        HV % H != 0 || !dense_items(q, dtype, B, {H, K}) || !dense_items(k, dtype, B, {H, K}) ||
        !dense_items(v, dtype, B, {HV, V}) || !dense_items(a, dtype, B, {HV}) ||
        !dense_items(b, dtype, B, {HV}) || !slot_indices(slots, B) ||
        !one_token_each(cu_seqlens, B))
        return {};
    std::vector<float> A_log_f32, dt_bias_f32;
    linseq_kda_problem p = one_token_problem(B, q, k, v, &b, &a, LINSEQ_DECAY_PER_HEAD);
    p.A_log = param_f32(A_log, HV, A_log_f32);
    p.dt_bias = param_f32(dt_bias, HV, dt_bias_f32);
    const auto spec = pool_in_place(pool, {HV, K, V}, slots);
    if (!p.A_log || !p.dt_bias || !spec) return {};
    p.gate_in_kernel = true;
    p.beta_is_logit = true;
    p.qk_l2norm = qk_l2norm;
    p.l2norm_eps = static_cast<float>(l2norm_eps);
    Tensor o = at::empty({B, 1, HV, V}, v.options());
    float *const outputs[] = {static_cast<float *>(o.data_ptr()), nullptr};
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_DEFAULT, token_dtype(dtype));
    check(entries.op_decode_pool("kda", &p, &exec, &*spec, outputs));
    return {o};
}

/* linseq::vllm_conv_update: vLLM's causal_conv1d_update at one token per request over its
 * default conv-state layout (memory [rows, W-1, D], the tensor [rows, D, W-1]): x [B, D]
 * bfloat16 or float32 (its channels contiguous, its rows any distance apart), taps float32 [W, D] (the plugin's copy of the layer's weight), bias
 * [D] float32, bfloat16 or none; request i on row slots[i] (negative or pad_value: padding).
 * Returns [y [B, D] in x's dtype], or nothing where the call has another form. */
std::vector<Tensor> vllm_conv_update(const Tensor &x, const Tensor &conv_states, const Tensor &taps,
                                     const OptTensor &bias, bool silu, const Tensor &slots,
                                     std::optional<int64_t> pad_value)
{
    if (!bound() || x.dim() != 2 || taps.dim() != 2 || conv_states.dim() != 3) return {};
    const int64_t B = x.size(0), D = x.size(1), W = taps.size(0);
    const at::ScalarType dtype = x.scalar_type();
    const Tensor pool = conv_states.transpose(1, 2);
    const bool bf16_on_half = dtype == at::kBFloat16 && pool.scalar_type() == at::kHalf;
    /* x's rows may lie apart (the layer's slice of a wider projection): read where they lie */
    const bool rows_apart = x.stride(0) >= D && (x.stride(1) == 1 || D == 1);
    if ((dtype != at::kFloat && dtype != at::kBFloat16) || bf16_on_half || B < 1 || D < 1 ||
        W < 2 || !x.device().is_cpu() || !aligned(x) || !rows_apart || !dense_f32(taps, {W, D}) ||
        !slot_indices(slots, B))
        return {};
    std::vector<float> bias_f32;
    linseq_conv1d_problem p{};
    p.bias = bias ? param_f32(*bias, D, bias_f32) : nullptr;
    const auto spec = pool_in_place(pool, {W - 1, D}, slots, pad_value);
    if ((bias && !p.bias) || !spec) return {};
    p.B = B;
    p.T = 1;
    p.D = D;
    p.W = W;
    p.x = static_cast<const float *>(x.const_data_ptr());
    if (!x.is_contiguous()) p.x_strides = {x.stride(0), x.stride(0), 1, 0};
    p.weight = taps.const_data_ptr<float>();
    p.activation = silu ? LINSEQ_ACT_SILU : LINSEQ_ACT_IDENTITY;
    p.state_tap_major = true;
    p.weight_tap_major = true;
    Tensor y = at::empty({B, D}, x.options());
    float *const outputs[] = {static_cast<float *>(y.data_ptr()), nullptr};
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_DEFAULT, token_dtype(dtype));
    check(entries.op_decode_pool("causal_conv1d", &p, &exec, &*spec, outputs));
    return {y};
}

/* A per-head tensor the layer broadcast over its last `spread` dimensions with stride 0
 * (vLLM's decode expands dt, dt_bias and A over headdim, and A over dstate) as its [.., H]
 * values; nullopt where they vary along those dimensions. */
std::optional<Tensor> per_head(const Tensor &t, int64_t spread)
{
    Tensor h = t;
    for (int64_t i = 0; i < spread; i++) {
        if (h.dim() < 1 || (h.size(-1) != 1 && h.stride(-1) != 0)) return std::nullopt;
        h = h.select(-1, 0);
    }
    return h;
}

/* A floating tensor of `shape` as dense float32 values: where it lies, or a float32 copy
 * kept in `held`; nullptr for another shape or dtype. */
const float *floats_of(const Tensor &t, at::IntArrayRef shape, Tensor &held)
{
    const auto type = t.scalar_type();
    if (!t.device().is_cpu() || t.sizes() != shape ||
        (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf))
        return nullptr;
    if (type == at::kFloat && t.is_contiguous() && aligned(t)) return t.const_data_ptr<float>();
    held = t.to(at::kFloat).contiguous();
    return held.const_data_ptr<float>();
}

/* The SSD skip D as vLLM passes it ([H], or [H, P] broadcast over P or not): its float32
 * values and whether they are per channel; nullopt for another form. */
std::optional<bool> skip_of(const OptTensor &D, int64_t H, int64_t P, linseq_ssd_problem &p,
                            Tensor &held)
{
    if (!D) return false;
    Tensor d = *D;
    if (d.dim() == 2 && d.size(0) == H && d.size(1) == P && d.stride(1) == 0) d = d.select(1, 0);
    const bool per_channel = d.dim() == 2;
    p.D_skip = per_channel ? floats_of(d, {H, P}, held) : floats_of(d, {H}, held);
    if (!p.D_skip) return std::nullopt;
    return per_channel;
}

/* The Mamba2 decode step's tensors, float32, kept alive for the library call. */
struct SsdHeld {
    Tensor x, dt, A, B, C, D, z, dt_bias;
};

/* The problem of vLLM's Mamba2 decode step: x, z [B, H, P]; dt [B, H(, P)], A [H(, P, N)],
 * dt_bias [H(, P)] per head; B, C [B, G, N]; the pool [rows, H, P, N]. False where the call
 * has another form. */
bool ssd_decode_problem(const Tensor &state, const Tensor &x, const Tensor &dt, const Tensor &A,
                        const Tensor &Bp, const Tensor &Cp, const OptTensor &D,
                        const OptTensor &dt_bias, const OptTensor &z, bool dt_softplus,
                        linseq_ssd_problem &p, SsdHeld &held)
{
    if (state.dim() != 4 || x.dim() != 3 || Bp.dim() != 3 || (dt_bias && !dt_softplus))
        return false;
    const int64_t B = x.size(0), H = x.size(1), P = x.size(2), N = state.size(3);
    const int64_t G = Bp.size(1);
    const auto dt_h = dt.dim() == 3 ? per_head(dt, 1) : std::optional<Tensor>(dt);
    const auto A_h = A.dim() == 3 ? per_head(A, 2) : std::optional<Tensor>(A);
    const auto bias_h =
        !dt_bias || dt_bias->dim() == 1 ? std::optional<Tensor>(dt_bias) : per_head(*dt_bias, 1);
    if (std::min({B, H, P, N, G}) < 1 || H % G != 0 || !dt_h || !A_h || (dt_bias && !bias_h))
        return false;
    p.B = B;
    p.T = 1;
    p.H = H;
    p.P = P;
    p.N = N;
    p.G = G;
    p.x = floats_of(x, {B, H, P}, held.x);
    p.dt = floats_of(*dt_h, {B, H}, held.dt);
    p.A = floats_of(*A_h, {H}, held.A);
    p.B_proj = floats_of(Bp, {B, G, N}, held.B);
    p.C_proj = floats_of(Cp, {B, G, N}, held.C);
    p.z = z ? floats_of(*z, {B, H, P}, held.z) : nullptr;
    p.dt_bias = dt_bias ? floats_of(*bias_h, {H}, held.dt_bias) : nullptr;
    p.dt_softplus = dt_softplus;
    const auto per_channel = skip_of(D, H, P, p, held.D);
    if (!per_channel) return false;
    p.D_per_channel = *per_channel;
    return p.x && p.dt && p.A && p.B_proj && p.C_proj && (!z || p.z) && (!dt_bias || p.dt_bias);
}

/* linseq::vllm_ssd_decode: vLLM's Mamba2 decode step (its SSU dispatcher's
 * selective_state_update) at one token per request: request i reads row slots[i] of the pool
 * [rows, H, P, N] and writes row dst_slots[i] (none: the same; negative or pad_value:
 * padding, output 0). The output goes into out [B, H, P] where given (returned), else into a
 * new tensor in x's dtype. Nothing where the call has another form. */
std::vector<Tensor> vllm_ssd_decode(const Tensor &state, const Tensor &x, const Tensor &dt,
                                    const Tensor &A, const Tensor &B, const Tensor &C,
                                    const OptTensor &D, const OptTensor &dt_bias,
                                    const OptTensor &z, bool dt_softplus, const Tensor &slots,
                                    const OptTensor &dst_slots, std::optional<int64_t> pad_value,
                                    const OptTensor &out, const OptTensor &cu_seqlens)
{
    linseq_ssd_problem p{};
    SsdHeld held;
    if (!bound() || !ssd_decode_problem(state, x, dt, A, B, C, D, dt_bias, z, dt_softplus, p, held))
        return {};
    const std::vector<int64_t> tokens{p.B, p.H, p.P};
    const bool moved = dst_slots && !dst_slots->is_same(slots);
    if (!slot_indices(slots, p.B) || !one_token_each(cu_seqlens, p.B) ||
        (moved &&
         (!slot_indices(*dst_slots, p.B) || dst_slots->scalar_type() != slots.scalar_type())) ||
        (out && (!out->device().is_cpu() || out->sizes() != tokens)))
        return {};
    auto spec = pool_in_place(state, {p.H, p.P, p.N}, slots, pad_value);
    if (!spec) return {};
    if (moved) spec->dst_rows = dst_slots->const_data_ptr();
    Tensor y = at::empty({p.B, 1, p.H, p.P}, x.options().dtype(at::kFloat));
    float *const outputs[] = {y.data_ptr<float>(), nullptr};
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_DEFAULT, LINSEQ_DTYPE_F32);
    check(entries.op_decode_pool("ssd", &p, &exec, &*spec, outputs));
    if (!out) return {y.view(tokens).to(x.scalar_type())};
    out->copy_(y.view(tokens));
    return {*out};
}

/* linseq::kda_token_step: fla's recurrent call at one token per sequence for inference, from an
 * initial state h0 [B, HV, K, V] it leaves as it is: [o [B, 1, HV, V], a new float32 final
 * state], by the library's recurrent forward, which runs it as a decode step from h0's rows
 * into the new state's (no copy of h0 first). float32 tokens of kda_decode's forms; nothing
 * for another form (the caller decodes on a copy of h0 instead). */
std::vector<Tensor> kda_token_step(const Tensor &q, const Tensor &k, const Tensor &v,
                                   const Tensor &beta, const OptTensor &g, const Tensor &h0,
                                   std::optional<double> scale, bool qk_l2norm, bool beta_is_logit)
{
    const OptTensor q_(q), k_(k), v_(v), beta_(beta), none;
    const KdaCall call(q_, k_, v_, beta_, g, none, none, none, h0, none, scale, qk_l2norm,
                       beta_is_logit, false, false, std::nullopt);
    if (!bound() || !kda_plain_options(call) || kda_storage(call) != at::kFloat ||
        !kda_common(call, at::kFloat) || h0.size(0) != q.size(0))
        return {};
    linseq_kda_problem p = kda_token_problem(call);
    p.h0 = h0.const_data_ptr<float>();
    Tensor o = at::empty({p.B, 1, p.HV, p.V}, v.options());
    Tensor ht = at::empty(h0.sizes(), h0.options());
    const linseq_exec exec = cpu_exec(LINSEQ_MODE_RECURRENT, LINSEQ_DTYPE_F32);
    check(entries.kda_forward(&p, &exec, o.data_ptr<float>(), ht.data_ptr<float>()));
    return {o, ht};
}

/* ---------------------------------------------------------------------------------------- */
/* The drop-ins' decode calls in their peers' shapes                                         */
/* ---------------------------------------------------------------------------------------- */
/* A model's decode step makes these calls once per layer and token; their Python checks and
 * views cost more than the kernel at batch 1. Each takes the common form (float32, one state
 * row per request, the shapes checked here) and returns nothing for any other, which the
 * drop-in's Python then checks, converts or refuses by name. Both run without autograd, as
 * their peers do (the drop-ins call them only for plain tensors outside tracing). */

/* linseq::mamba1_token_step: mamba-ssm's selective_state_update in Mamba1's shapes: state
 * [b, d, N] updated in place; x, dt, z [b, d]; A [d, N]; B, C [b, N]; D, dt_bias [d].
 * [y [b, d]], or nothing. */
std::vector<Tensor> mamba1_token_step(const Tensor &state, const Tensor &x, const Tensor &dt,
                                      const Tensor &A, const Tensor &B, const Tensor &C,
                                      const OptTensor &D, const OptTensor &z,
                                      const OptTensor &dt_bias, bool dt_softplus)
{
    if (!bound() || state.dim() != 3 || B.dim() != 2 || C.dim() != 2 || x.dim() != 2 ||
        B.size(0) != x.size(0) || C.size(0) != x.size(0))
        return {};
    /* [b, 1, d, N] and [b, 1, N]: the pool and groups of mamba_state_update's form */
    const Tensor pool = state.unsqueeze(1), B_groups = B.unsqueeze(1), C_groups = C.unsqueeze(1);
    const ScanCall call{pool, nullptr, x, dt, A, B_groups, C_groups, D, z, dt_bias, dt_softplus};
    if (!scan_common(call)) return {};
    return {scan_run(call)};
}

/* linseq::conv_token_step: causal-conv1d's causal_conv1d_update without cache_seqlens and
 * conv_state_indices: x [b, d] or [b, d, l]; conv_state [b, d, L] (L >= W-1) shifted in
 * place; weight [d, W]; bias [d]. [out in x's shape], or nothing. */
std::vector<Tensor> conv_token_step(const Tensor &x, const Tensor &conv_state, const Tensor &weight,
                                    const OptTensor &bias, bool silu)
{
    if (!bound() || (x.dim() != 2 && x.dim() != 3)) return {};
    const Tensor x3 = x.dim() == 2 ? x.unsqueeze(2) : x;
    const OptTensor none;
    const std::optional<c10::string_view> activation =
        silu ? std::optional<c10::string_view>("silu") : std::nullopt;
    const ConvCall call{x3, conv_state, weight, bias, activation, none, nullptr};
    if (!conv_common(call)) return {};
    const Tensor y = conv_run(call);
    return {x.dim() == 2 ? y.squeeze(2) : y};
}

} // namespace

/* Binds one entry point of the loaded liblinseq by its name without the "linseq_" prefix;
 * 0 on success, -1 for a name this library does not use. */
NATIVE_API int linseq_torch_native_bind(const char *name, void *address)
{
    for (const auto &entry : entry_slots)
        if (std::strcmp(name, entry.name) == 0) {
            *entry.slot = address;
            return 0;
        }
    return -1;
}

/* The names linseq_torch_native_bind takes, one per index; NULL past the last. */
NATIVE_API const char *linseq_torch_native_entry_name(int index)
{
    const int count = static_cast<int>(sizeof entry_slots / sizeof entry_slots[0]);
    return index >= 0 && index < count ? entry_slots[index].name : nullptr;
}

/* How many calls the kernels have passed on to the ops' Python bodies. */
NATIVE_API int64_t linseq_torch_native_passed_on(void) { return passed_on.load(); }

/* sizeof a struct this library fills, by its C name (0: unknown), so that the loader can
 * refuse a liblinseq whose layout differs from the header this was compiled with. */
NATIVE_API int64_t linseq_torch_native_struct_size(const char *type)
{
    if (std::strcmp(type, "linseq_exec") == 0) return sizeof(linseq_exec);
    if (std::strcmp(type, "linseq_kda_problem") == 0) return sizeof(linseq_kda_problem);
    if (std::strcmp(type, "linseq_conv1d_problem") == 0) return sizeof(linseq_conv1d_problem);
    if (std::strcmp(type, "linseq_ssm1_problem") == 0) return sizeof(linseq_ssm1_problem);
    if (std::strcmp(type, "linseq_ssd_problem") == 0) return sizeof(linseq_ssd_problem);
    if (std::strcmp(type, "linseq_state_pool") == 0) return sizeof(linseq_state_pool);
    return 0;
}

/* The ops defined here, not in Python: the vLLM plugin's steps and the drop-ins' token steps,
 * called only from linseq's own code, never with a gradient or under tracing. */
TORCH_LIBRARY_FRAGMENT(linseq, m)
{
    m.def("kda_token_step(Tensor q, Tensor k, Tensor v, Tensor beta, Tensor? g, Tensor h0, "
          "float? scale, bool qk_l2norm, bool beta_is_logit) -> Tensor[]");
    m.def("vllm_gdn_decode(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, Tensor a, "
          "Tensor b, Tensor(a!) pool, Tensor slots, Tensor? cu_seqlens, bool qk_l2norm, "
          "float l2norm_eps) -> Tensor[]");
    m.def("vllm_conv_update(Tensor x, Tensor(a!) conv_states, Tensor taps, Tensor? bias, "
          "bool silu, Tensor slots, int? pad_value) -> Tensor[]");
    m.def("vllm_ssd_decode(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
          "Tensor? D, Tensor? dt_bias, Tensor? z, bool dt_softplus, Tensor slots, "
          "Tensor? dst_slots, int? pad_value, Tensor(b!)? out, Tensor? cu_seqlens) -> Tensor[]");
    m.def("mamba1_token_step(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, "
          "Tensor C, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus) -> Tensor[]");
    m.def("conv_token_step(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
          "bool silu) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(linseq, CPU, m)
{
    m.impl("kda_token_step", &kda_token_step);
    m.impl("mamba1_token_step", &mamba1_token_step);
    m.impl("conv_token_step", &conv_token_step);
    m.impl("vllm_gdn_decode", &vllm_gdn_decode);
    m.impl("vllm_conv_update", &vllm_conv_update);
    m.impl("vllm_ssd_decode", &vllm_ssd_decode);
    m.impl("kda_decode", &kda_decode);
    m.impl("conv_state_update", &conv_state_update);
    m.impl("mamba_state_update", &mamba_state_update);
}
