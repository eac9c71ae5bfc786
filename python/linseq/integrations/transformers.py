"""Hugging Face transformers' linear-attention, scan and conv kernels on linseq (CPU).

    import linseq.integrations.transformers as linseq_hf
    linseq_hf.enable()        # every supported model module now calls linseq
    model = AutoModelForCausalLM.from_pretrained(...)   # before or after: both work
    linseq_hf.disable()       # back to what transformers had chosen

    with linseq_hf.routing("torch"):   # transformers' own PyTorch functions (a reference)
        ...

Which functions: the module-level kernel functions of Kimi Linear (KDA), Qwen3-Next,
Qwen3.5 and Qwen3.5-MoE (Gated DeltaNet), Mamba and FalconMamba (Mamba1), Mamba2, Bamba,
GraniteMoeHybrid, NemotronH, FalconH1 and Zamba2 (Mamba2's SSD), and LFM2 and LFM2-MoE
(their gated short conv), all listed in ROUTES. Each
adapter takes exactly the arguments the transformers function takes and calls linseq's
drop-ins (linseq.compat.fla, .mamba_ssm, .mamba_ssd, .causal_conv1d); the [B,D,T] conv and scan
tensors reach them as the model's views, and the conv and SSM cache states are updated in
place as transformers' functions update them. Packed sequences: the flash-style
`cu_seq_lens_q` keyword the models pass through (and the `cu_seqlens` the Qwen layers derive
from it) keeps the sequences apart in the conv and in the delta rule, where transformers'
PyTorch path refuses or ignores them. A call with tensors off the CPU goes where
transformers would have sent it; a CPU call linseq does not run goes to transformers'
PyTorch function: float64 tensors (linseq computes in float32; a float64 model keeps its
float64 path) and a conv activation other than silu.

Why the module globals are rebound here: transformers 5.2x resolves these functions once, at
import, with `use_kernel_func_from_hub_with_fallback` (the `kernels` hub, else the original
package, else the PyTorch path), and the layers call the module globals. Its public hooks
for replacing them (`KernelConfig`, `use_kernelized_func`, `kernels.kernelize`) need
`kernels` >= 0.18.2, which this combination lacks (the newest on the index is 0.17.2, so
transformers treats `kernels` as unavailable); for fla's names, fla's own backend dispatch
is the other route. So this module, and only this module, assigns the globals (and puts
back the originals). A newer `kernels` alone would not change that for the CPU:
transformers 5.24's `KernelConfig` takes no "cpu" device, and `kernels.kernelize` replaces
layer classes (`kernel.layers.<name>`) rather than these functions; a mapping registered
with `kernels.register_kernel_mapping` for the "cpu" device is the closest public route.
"""

import contextlib
import functools
import importlib
import inspect
import itertools
import logging

__all__ = ["enable", "disable", "routing", "ROUTES"]

_log = logging.getLogger(__name__)


class _NotOnLinseq(Exception):
    """Raised by an adapter for a call linseq does not run: the call goes to the function
    transformers had resolved."""


# ------------------------------------------------------------------------------------------
# The drop-ins, looked up at call time (so a test can count the calls)
# ------------------------------------------------------------------------------------------

_DROP_INS = {}   # "fla" -> linseq.compat.fla, ...: imported with the first route made


def _compat(name):
    """The drop-in module, looked up in a dict (which torch.compile traces, unlike an
    import)."""
    return _DROP_INS[name]


_CHUNK_SIZES = (16, 32, 64, 128)
_CONV_ACTIVATIONS = (None, "silu", "swish")


def _chunk_size(chunk_size):
    """The chunk size changes only the order of linseq's sums, not the result: one it lacks
    runs as 64."""
    return chunk_size if chunk_size in _CHUNK_SIZES else 64


def _packed_offsets(kwargs):
    """cu_seqlens of packed sequences: the delta rule's own keyword (the Qwen layers pass
    cu_seqlens=kwargs.pop("cu_seq_lens_q")) or the flash-style keyword the model forwards
    (Kimi passes its keywords through as they are)."""
    cu = kwargs.get("cu_seqlens")
    return kwargs.get("cu_seq_lens_q") if cu is None else cu


def _seq_idx(kwargs, x):
    """causal-conv1d's seq_idx [1, T] from the model's keywords: seq_idx as given, else one
    index per packed sequence of cu_seq_lens_q (which covers x's one row of T tokens)."""
    seq_idx = kwargs.get("seq_idx")
    cu = kwargs.get("cu_seq_lens_q")
    if seq_idx is not None or cu is None:
        return seq_idx
    import torch
    cu = cu.to(torch.int64).reshape(-1)
    batch, _, seqlen = x.shape
    # the offsets' values are checked eagerly only: under torch.compile reading them would
    # break the graph
    if batch != 1 or cu.numel() < 2 or (not torch.compiler.is_compiling() and (
            int(cu[0]) != 0 or int(cu[-1]) != seqlen)):
        raise ValueError(f"cu_seq_lens_q: expected offsets 0..{seqlen} of the packed sequences "
                         f"of one row (hidden_states [1, dim, seqlen]), got {cu.tolist()} "
                         f"with hidden_states {list(x.shape)}")
    # token t is in sequence i where cu[i] <= t < cu[i+1]: a [1, seqlen] result whose shape
    # does not depend on the offsets' values (repeat_interleave's does)
    return torch.searchsorted(cu[1:], torch.arange(seqlen, device=cu.device), right=True)[None]


# ------------------------------------------------------------------------------------------
# Adapters: the transformers functions' signatures, linseq's drop-ins
# ------------------------------------------------------------------------------------------

def _conv_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """causal_conv1d_fn: hidden_states [B,D,T] (a transposed [B,T,D] projection in these
    models, read in place); weight [D,W]; returns [B,D,T] in hidden_states' dtype."""
    if activation not in _CONV_ACTIVATIONS:
        raise _NotOnLinseq
    return _compat("causal_conv1d").causal_conv1d_fn(
        hidden_states, weight, bias, seq_idx=_seq_idx(kwargs, hidden_states),
        activation=activation)


def _conv_update(hidden_states, conv_state, weight, bias=None, activation=None):
    """causal_conv1d_update: hidden_states [B,D,T]; conv_state [B,D,W] shifted in place."""
    if activation not in _CONV_ACTIVATIONS:
        raise _NotOnLinseq
    return _compat("causal_conv1d").causal_conv1d_update(
        hidden_states, conv_state, weight, bias, activation)


def _kda_chunk(query, key, value, g, beta, chunk_size=64, initial_state=None,
               output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """Kimi's chunk_kimi_delta_attention: q, k, v [B,T,H,D]; g [B,T,H,K] log decay; beta
    [B,T,H]; initial_state [N,H,K,V]. Returns (o in q's dtype, final state float32 or None)."""
    o, state = _compat("fla").chunk_kda(
        query, key, value, g, beta, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=_packed_offsets(kwargs), chunk_size=_chunk_size(chunk_size))
    return o.to(query.dtype), state


def _recurrent(function, query, key, value, g, beta, initial_state, output_final_state,
               qk_l2norm, kwargs):
    """A decode call of fla's recurrent `function` (fused_recurrent_kda or
    fused_recurrent_gated_delta_rule): its token step first (fla._recurrent_token_step, past
    the function's keyword checks), the function for any call the step does not take; o in
    query's dtype."""
    fla, cu_seqlens = _compat("fla"), _packed_offsets(kwargs)
    o, state = (cu_seqlens is None and fla._recurrent_token_step(
        query, key, value, g, beta, initial_state, output_final_state, qk_l2norm)) or \
        getattr(fla, function)(query, key, value, g=g, beta=beta, initial_state=initial_state,
                               output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=qk_l2norm, cu_seqlens=cu_seqlens)
    return (o if o.dtype == query.dtype else o.to(query.dtype)), state


def _kda_recurrent(query, key, value, g, beta, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel=False, **kwargs):
    """Kimi's recurrent_kimi_delta_attention (decode): as _kda_chunk, token by token."""
    return _recurrent("fused_recurrent_kda", query, key, value, g, beta, initial_state,
                      output_final_state, use_qk_l2norm_in_kernel, kwargs)


def _gdn_chunk(query, key, value, g, beta, chunk_size=64, initial_state=None,
               output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """Qwen's torch_chunk_gated_delta_rule: q, k [B,T,H,K]; v [B,T,HV,V] (HV a multiple of
    H); g, beta [B,T,HV]. Returns (o in q's dtype, final state float32 or None)."""
    o, state = _compat("fla").chunk_gated_delta_rule(
        query, key, value, g, beta, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=_packed_offsets(kwargs), chunk_size=_chunk_size(chunk_size))
    return o.to(query.dtype), state


def _gdn_recurrent(query, key, value, g, beta, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, **kwargs):
    """Qwen's torch_recurrent_gated_delta_rule (decode): as _gdn_chunk, token by token."""
    return _recurrent("fused_recurrent_gated_delta_rule", query, key, value, g, beta,
                      initial_state, output_final_state, use_qk_l2norm_in_kernel, kwargs)


def _mamba_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None,
                delta_softplus=False, return_last_state=False, use_mambapy=False,
                use_associative_scan=False, **kwargs):
    """Mamba's mamba_selective_scan: hidden_states, dt, z [B,D,T]; B, C [B,N,T] views.
    use_mambapy / use_associative_scan choose among transformers' PyTorch scans: unused."""
    return _compat("mamba_ssm").selective_scan_fn(
        hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


def _mamba_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None,
                        dt_softplus=False, z=None, **kwargs):
    """Mamba's mamba_selective_state_update (its order: D, dt_bias, dt_softplus, z, unlike
    mamba-ssm's): state [B,D,N] updated in place; returns [B,D]."""
    return _compat("mamba_ssm").selective_state_update(
        state, hidden_states, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)


def _mamba_inner(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                 out_proj_weight, out_proj_bias, A, B=None, C=None, D=None, delta_bias=None,
                 delta_softplus=True, b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None,
                 b_c_dt_rms_eps=1e-6, **kwargs):
    """Mamba's mamba_inner_fn, the fused training-time mixer (transformers' own returns None
    and the layer runs unfused): xz [B,2D,T]; returns [B,T,hidden]."""
    return _compat("mamba_ssm").mamba_inner_fn(
        xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
        out_proj_bias, A, B, C, D, delta_bias=delta_bias, delta_softplus=delta_softplus,
        b_rms_weight=b_rms_weight, c_rms_weight=c_rms_weight, dt_rms_weight=dt_rms_weight,
        b_c_dt_rms_eps=b_c_dt_rms_eps)


def _mamba2_chunk(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None,
                  initial_states=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                  return_final_states=False, **kwargs):
    """Mamba2's mamba2_chunk_scan: hidden_states [B,T,H,P], dt [B,T,H], B and C [B,T,G,N];
    on linseq's SSD through mamba-ssm's mamba_chunk_scan_combined. Packed sequences
    (seq_idx, or cu_seq_lens_q as DataCollatorWithFlattening passes them) restart the
    state, which transformers' own PyTorch scan does not. A z gate (which that scan ignores)
    goes to it, so that both paths compute the same."""
    if kwargs.get("z") is not None:
        raise _NotOnLinseq
    heads_first = hidden_states.flatten(2).transpose(1, 2)   # [B, H*P, T]: _seq_idx's layout
    return _compat("mamba_ssd").mamba_chunk_scan_combined(
        hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
        initial_states=initial_states, seq_idx=_seq_idx(kwargs, heads_first),
        dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states)


def _mamba2_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None,
                         dt_softplus=False, z=None, **kwargs):
    """Mamba2's mamba2_selective_state_update: state [B,H,P,N] updated in place; x, dt
    [B,H,P] (dt and dt_bias repeated over P, A over P and N, as mamba-ssm takes them)."""
    return _compat("mamba_ssm").selective_state_update(
        state, hidden_states, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)


_CONV = {"causal_conv1d_fn": _conv_fn, "causal_conv1d_update": _conv_update}
_KDA = {"chunk_kimi_delta_attention": _kda_chunk,
        "recurrent_kimi_delta_attention": _kda_recurrent}
_GDN = {"torch_chunk_gated_delta_rule": _gdn_chunk,
        "torch_recurrent_gated_delta_rule": _gdn_recurrent}
_MAMBA1 = {"mamba_selective_scan": _mamba_scan,
           "mamba_selective_state_update": _mamba_state_update}
_MAMBA2 = {**_CONV, "mamba2_chunk_scan": _mamba2_chunk,
           "mamba2_selective_state_update": _mamba2_state_update}

# model module -> transformers function name -> linseq adapter
ROUTES = {
    "transformers.models.kimi_linear.modeling_kimi_linear": {**_CONV, **_KDA},
    "transformers.models.qwen3_next.modeling_qwen3_next": {**_CONV, **_GDN},
    "transformers.models.qwen3_5.modeling_qwen3_5": {**_CONV, **_GDN},
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe": {**_CONV, **_GDN},
    "transformers.models.mamba.modeling_mamba": {**_CONV, **_MAMBA1,
                                                 "mamba_inner_fn": _mamba_inner},
    # Not FalconMamba's mamba_inner_fn: mamba-ssm's fused mixer (and linseq's) RMS-norms
    # delta after its projection (over dim), transformers' unfused FalconMamba layer before
    # it (over the projection rank), so routing it would make training differ from
    # transformers' own path and from inference; the unfused layer runs on linseq's scan
    # and conv instead.
    "transformers.models.falcon_mamba.modeling_falcon_mamba": {**_CONV, **_MAMBA1},
    # Mamba2's mixer (SSD), in Mamba2 and the hybrids built on it. Not their fused training
    # mixer (mamba2_split_conv1d_scan_combined, a stub in transformers), although
    # linseq.compat.mamba_ssd has it: the layers hand it no padding mask, so on a batch with
    # padding before real tokens it runs the padding's conv outputs (silu of the conv bias)
    # into the state, where the unfused layer zeroes them; and FalconH1 calls it with
    # norm_before_gate=False whatever its config says. Routed, training would differ from
    # transformers' own path and from inference; training runs the unfused layer on
    # linseq's conv and scan instead (equal where the fused one would be: no padding)
    **{f"transformers.models.{m}.modeling_{m}": _MAMBA2
       for m in ("mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2")},
    # LFM2's short conv: the layer masks the padding, gates (B*x before the conv, C* after)
    # and concatenates the cached conv state in front of a multi-token chunk itself; only the
    # conv (no activation) and the decode step's in-place state update are linseq's
    **{f"transformers.models.{m}.modeling_{m}": _CONV for m in ("lfm2", "lfm2_moe")},
}


# ------------------------------------------------------------------------------------------
# Rebinding
# ------------------------------------------------------------------------------------------

_resolved = {}       # (module, name) -> transformers' function, as found before any rebinding
_linseq_fns = {}     # (module, name) -> the routed function installed by "linseq"

# What decides the function a module global holds, so that enable(), disable() and routing()
# blocks compose in any order: the innermost open routing() block that covers it, else
# "linseq" while enabled, else the function from outside linseq (transformers' choice, or
# whatever another library put there), which is what disable() and a block's exit put back.
_outside = {}        # (module, name) -> the function found there that linseq did not install
_installed = {}      # (module, name) -> the function linseq last installed there
_enabled = {}        # (module, name) -> adapter, while enable() is in effect
_blocks = []         # the open routing() blocks, outermost first: [kind, routes]


def _tensors(args, kwargs):
    import torch
    return [t for t in itertools.chain(args, kwargs.values()) if isinstance(t, torch.Tensor)]


def _routed(adapter, resolved, qualified):
    """The function installed for "linseq": the adapter; a call with tensors off the CPU goes
    to the function transformers had resolved (fla / mamba-ssm / causal-conv1d where
    installed), a CPU call linseq declines (float64 or complex tensors: linseq computes in
    float32; an activation it lacks) to transformers' PyTorch function."""
    import torch
    for name in ("fla", "mamba_ssm", "mamba_ssd", "causal_conv1d"):
        _DROP_INS.setdefault(name, importlib.import_module(f"linseq.compat.{name}"))
    torch_function = inspect.unwrap(resolved)
    declined = (torch.float64, torch.complex64, torch.complex128)

    @functools.wraps(resolved)
    def routed(*args, **kwargs):
        tensors = _tensors(args, kwargs)
        if not all(t.is_cpu for t in tensors):
            return resolved(*args, **kwargs)
        if not any(t.dtype in declined for t in tensors):
            try:
                return adapter(*args, **kwargs)
            except _NotOnLinseq:
                pass
        return torch_function(*args, **kwargs)
    routed.linseq_route = qualified
    return routed


def _same_parameters(adapter, reference):
    """True when the adapter takes the reference's parameters, by name, order and kind (a
    transformers release that changed a signature is skipped, not miscalled)."""
    def named(fn):
        return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()
                if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return named(adapter) == named(reference)


def _available():
    """{(module name, function name): adapter} for the routes the installed transformers
    has, each function's original recorded; what is missing is logged (debug) and skipped."""
    found = {}
    for module_name, functions in ROUTES.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # not in this transformers, or transformers missing
            _log.debug("linseq: %s skipped: %s", module_name, exc)
            continue
        for name, adapter in functions.items():
            key = (module_name, name)
            if key not in _resolved:
                current = getattr(module, name, None)
                if current is None:
                    _log.debug("linseq: %s.%s skipped: not defined", module_name, name)
                    continue
                _resolved[key] = current
            if not _same_parameters(adapter, inspect.unwrap(_resolved[key])):
                _log.debug("linseq: %s.%s skipped: its signature changed", module_name, name)
                continue
            found[key] = adapter
    return found


def _function_for(kind, key, adapter):
    if kind == "torch":   # transformers' own PyTorch function, under its decorator
        return inspect.unwrap(_resolved[key])
    if key not in _linseq_fns:
        _linseq_fns[key] = _routed(adapter, _resolved[key], ".".join(key))
    return _linseq_fns[key]


def _adopt(key):
    """Records the module's current function as the outside one, unless linseq put it there
    (a function someone else installed since is adopted too)."""
    current = getattr(importlib.import_module(key[0]), key[1])
    if key not in _installed or current is not _installed[key]:
        _outside[key] = current


def _apply(key, adapter):
    """Installs the function that the open blocks and enable() decide for key."""
    kind = next((k for k, routes in reversed(_blocks) if key in routes), None)
    if kind is None and key in _enabled:
        kind = "linseq"
    fn = _outside[key] if kind is None else _function_for(kind, key, adapter)
    setattr(importlib.import_module(key[0]), key[1], fn)
    _installed[key] = fn


def enable():
    """Route every supported transformers kernel function to linseq (idempotent). Imports
    the model modules of ROUTES that the installed transformers has; a missing one is
    skipped (logged at debug level). Returns the "module.function" names routed. Inside a
    routing() block the block's choice holds until it exits; linseq's routes hold from then
    on, until disable()."""
    routes = _available()
    for key, adapter in routes.items():
        _adopt(key)
        _enabled[key] = adapter
        _apply(key, adapter)
    return tuple(".".join(key) for key in routes)


def disable():
    """Put back what enable() replaced (inside a routing() block: once the block exits).
    Returns the "module.function" names restored."""
    restored = tuple(".".join(key) for key in _enabled)
    enabled = list(_enabled.items())
    _enabled.clear()
    for key, adapter in enabled:
        _adopt(key)
        _apply(key, adapter)
    return restored


@contextlib.contextmanager
def routing(kind):
    """Within the block, the supported functions are linseq's ("linseq", as enable()) or
    transformers' own PyTorch functions ("torch", also where fla or mamba-ssm are installed:
    the reference for tests and benchmarks), whatever enable() or disable() do inside it; on
    exit the enclosing block's choice, else enable()'s, else the outside functions, hold
    again. Blocks nest."""
    if kind not in ("linseq", "torch"):
        raise ValueError(f"kind: expected 'linseq' or 'torch', got {kind!r}")
    routes = _available()
    for key in routes:
        _adopt(key)
    block = [kind, routes]
    _blocks.append(block)
    try:
        for key, adapter in routes.items():
            _apply(key, adapter)
        yield tuple(".".join(key) for key in routes)
    finally:
        _blocks[:] = [b for b in _blocks if b is not block]
        for key, adapter in routes.items():
            _adopt(key)
            _apply(key, adapter)
