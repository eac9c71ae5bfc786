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
    decltype(&linseq_last_error) last_error = nullptr;
};
Entries entries;

bool bound()
{
    return entries.kda_decode && entries.conv1d_decode && entries.ssm1_decode && entries.last_error;
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
    const Tensor &rows;
};

bool conv_common(const ConvCall &c)
{
    if (c.x.dim() != 3 || c.state.dim() != 3 || c.weight.dim() != 2) return false;
    const int64_t b = c.x.size(0), d = c.x.size(1), l = c.x.size(2);
    const int64_t R = c.state.size(0), L = c.state.size(2), W = c.weight.size(1);
    if (std::min({b, d, l, R, L, W}) < 1 || L < W - 1) return false;
    if (c.activation && *c.activation != "silu") return false;
    if (!strided_f32(c.x) || !dense_f32(c.state, {R, d, L}) || !dense_f32(c.weight, {d, W}) ||
        !absent_or_dense_f32(c.bias, {d}) || !valid_rows(c.rows, b, R))
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
    check(entries.conv1d_decode(&p, &exec, c.state.data_ptr<float>(), c.state.size(0),
                                c.state.size(2), c.rows.const_data_ptr<int64_t>(), seqlens,
                                y.data_ptr<float>()));
    return channel_first ? y : y.transpose(1, 2);
}

Tensor conv_state_update(const Tensor &x, const Tensor &state, const Tensor &weight,
                         const OptTensor &bias, std::optional<c10::string_view> activation,
                         const OptTensor &cache_seqlens, const Tensor &rows)
{
    const ConvCall call{x, state, weight, bias, activation, cache_seqlens, rows};
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
    const Tensor &state, &rows, &x, &dt, &A, &B, &C;
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
           valid_rows(c.rows, b, R);
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
    check(entries.ssm1_decode(&p, &exec, c.state.data_ptr<float>(), c.state.size(0),
                              c.rows.const_data_ptr<int64_t>(), y.data_ptr<float>()));
    return y;
}

Tensor mamba_state_update(const Tensor &state, const Tensor &rows, const Tensor &x,
                          const Tensor &dt, const Tensor &A, const Tensor &B, const Tensor &C,
                          const OptTensor &D, const OptTensor &z, const OptTensor &dt_bias,
                          bool dt_softplus)
{
    const ScanCall call{state, rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus};
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

Tensor kda_run(const KdaCall &c, at::ScalarType dtype)
{
    const Tensor &q = *c.q, &v = *c.v;
    linseq_kda_problem p{};
    p.B = q.size(0);
    p.T = 1;
    p.H = q.size(2);
    p.HV = v.size(2);
    p.K = q.size(3);
    p.V = v.size(3);
    /* bfloat16 storage: the library reads the same pointers as bfloat16 (exec dtype) */
    auto ptr = [](const OptTensor &t) {
        return t ? static_cast<const float *>(t->const_data_ptr()) : nullptr;
    };
    p.q = ptr(c.q);
    p.k = ptr(c.k);
    p.v = ptr(c.v);
    p.beta = ptr(c.beta);
    p.g = ptr(c.g);
    p.decay = !c.g              ? LINSEQ_DECAY_NONE
              : c.g->dim() == 4 ? LINSEQ_DECAY_PER_CHANNEL
                                : LINSEQ_DECAY_PER_HEAD;
    p.scale = c.scale ? static_cast<float>(*c.scale) : 0.0f;
    p.qk_l2norm = c.qk_l2norm;
    p.beta_is_logit = c.beta_is_logit;
    p.state_v_first = c.state_v_first;
    Tensor o = at::empty({p.B, 1, p.HV, p.V}, v.options().dtype(dtype));
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
                  c10::string_view exec_mode, int64_t chunk_size)
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
                          c10::string_view, int64_t)>();
    return general.redispatch(CPU_KEYS, q, k, v, beta, g, h0, A_log, dt_bias, state, state_rows,
                              scale, qk_l2norm, beta_is_logit, state_v_first, gate_in_kernel,
                              lower_bound, exec_mode, chunk_size);
}

} // namespace

/* Binds one entry point of the loaded liblinseq by its name without the "linseq_" prefix;
 * 0 on success, -1 for a name this library does not use. */
NATIVE_API int linseq_torch_native_bind(const char *name, void *address)
{
    struct {
        const char *name;
        void **slot;
    } slots[] = {{"kda_decode", reinterpret_cast<void **>(&entries.kda_decode)},
                 {"conv1d_decode", reinterpret_cast<void **>(&entries.conv1d_decode)},
                 {"ssm1_decode", reinterpret_cast<void **>(&entries.ssm1_decode)},
                 {"last_error", reinterpret_cast<void **>(&entries.last_error)}};
    for (auto &slot : slots)
        if (std::strcmp(name, slot.name) == 0) {
            *slot.slot = address;
            return 0;
        }
    return -1;
}

/* The names linseq_torch_native_bind takes, one per index; NULL past the last. */
NATIVE_API const char *linseq_torch_native_entry_name(int index)
{
    static const char *const names[] = {"kda_decode", "conv1d_decode", "ssm1_decode", "last_error"};
    return index >= 0 && index < 4 ? names[index] : nullptr;
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
    return 0;
}

TORCH_LIBRARY_IMPL(linseq, CPU, m)
{
    m.impl("kda_decode", &kda_decode);
    m.impl("conv_state_update", &conv_state_update);
    m.impl("mamba_state_update", &mamba_state_update);
}
