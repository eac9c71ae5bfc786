"""vLLM's Mamba1 layers (Mamba, FalconMamba) on linseq, for vLLM's CPU build: a vLLM plugin.

    pip install "linseq[vllm]"    # registers the plugin: vLLM calls register() at start-up
    LINSEQ_VLLM=0 vllm serve ...  # installed but left off

    import linseq.integrations.vllm as linseq_vllm
    linseq_vllm.enable()          # by hand, without the entry point (same effect)
    linseq_vllm.disable()         # back to vLLM's own functions

Why: vLLM's CPU build cannot run a Mamba or FalconMamba model: its prefill scan
(`selective_scan_fn`) calls a CUDA/ROCm-only custom op, and its CPU decode step
(`selective_state_update`) indexes the state as Mamba2's [slots, heads, dim, dstate].
Routed, the prefill scan runs on linseq's SSM1 op over vLLM's own state pool
(linseq.ops.forward_pool: packed prompts by query_start_loc, the int32 slot of each prompt,
vLLM's null block as padding, has_initial_state for a prompt continued over several steps),
and the decode step on the same op's decode step over the pool (linseq.ops.decode_pool).
vLLM's CPU causal conv is left as it is.

Not covered: a bfloat16 model on a CPU with AVX512-BF16 (or Arm bf16), where vLLM
prepacks the conv weight (width 4) into a layout its Mamba1 layer then cannot reshape (an
IndexError in vLLM's layer before any kernel runs); float32 models run.

Why the mixer module's globals are rebound: vLLM's Mamba1 layer (MambaMixer) calls the
functions it imported into its own module at import time. vLLM's out-of-tree hook for the
layer (`PluggableLayer.register_oot`) replaces the whole layer class, which would mean a
second copy of the layer's forward, and only for layers built after the plugin was loaded.
Rebinding the two names the layer calls is the narrowest change that survives vLLM's
structure, as linseq.integrations.transformers does for transformers' model modules. A
call with tensors off the CPU goes to vLLM's function.

One thing more, not a kernel: a batch that mixes decodes and prefills reaches the layer's
out_proj as a transposed view, which vLLM's CPU GEMMs refuse whatever ran the scan. The
plugin registers (register_oot) a MambaMixer subclass that only adds a pre-hook on out_proj
giving it unit-stride rows; it applies to models built after enable().
"""

import functools
import importlib
import inspect
import logging
import os

__all__ = ["register", "enable", "disable", "ROUTES", "OPT_OUT_VARIABLE"]

_log = logging.getLogger(__name__)

OPT_OUT_VARIABLE = "LINSEQ_VLLM"   # "0": register() leaves vLLM as it is

_MIXER = "vllm.model_executor.layers.mamba.mamba_mixer"
_PREFIX_CACHING_ARGS = ("block_idx_first_scheduled_token", "block_idx_last_scheduled_token",
                        "initial_state_idx")


# ------------------------------------------------------------------------------------------
# The pool as NumPy sees it
# ------------------------------------------------------------------------------------------

def _numpy_pool(pool):
    """vLLM's state pool [slots, dim, dstate] (a view of its cache pages) as a NumPy array on
    the same memory, or None for a dtype NumPy lacks (bfloat16)."""
    import torch
    if pool.dtype not in (torch.float32, torch.float16):
        return None
    return pool.detach().numpy()


def _on_pool(pool, src, dst, pad_value, run):
    """run(numpy pool, src rows, dst rows, pad_value) on vLLM's pool where NumPy can see it;
    otherwise on a float32 copy of the rows src and dst name (pad_value marks padding),
    written back after the step."""
    import torch
    arr = _numpy_pool(pool)
    if arr is not None:
        return run(arr, src.numpy(), dst.numpy(), pad_value)
    both = torch.cat([src, dst])
    used = both != pad_value
    named, local_index = torch.unique(both[used].long(), return_inverse=True)
    local = torch.zeros((max(named.numel(), 1),) + tuple(pool.shape[1:]))
    local[:named.numel()] = pool[named].to(torch.float32)
    local_rows = torch.full_like(both, -1)   # negative: padding to the library
    local_rows[used] = local_index.to(both.dtype)
    local_src, local_dst = local_rows[:src.numel()], local_rows[src.numel():]
    out = run(local.numpy(), local_src.numpy(), local_dst.numpy(), None)
    pool[named] = local[:named.numel()].to(pool.dtype)
    return out


def _rows(indices, name):
    """vLLM's slot indices, [batch] or the [batch, 1] column it passes without speculative
    decoding, as a contiguous [batch]."""
    import torch
    if indices.dim() == 2 and indices.shape[1] == 1:
        indices = indices[:, 0]
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected int32 or int64 slot indices [batch] or [batch, 1], "
                         f"got {indices.dtype} {list(indices.shape)}")
    return indices.contiguous()


# ------------------------------------------------------------------------------------------
# Adapters: vLLM's signatures, linseq's SSM1 op over vLLM's pool
# ------------------------------------------------------------------------------------------

def _tokens(t):
    """A [dim, tokens] tensor of vLLM's packed layout as linseq's [1, tokens, dim]."""
    return None if t is None else t.detach().transpose(0, 1)[None]


def _selective_scan(u, ssm_states, delta, A, B, C, D=None, z=None, delta_bias=None,
                    delta_softplus=False, query_start_loc=None, cache_indices=None,
                    has_initial_state=None, null_block_id=0, **prefix_caching):
    """vLLM's prefill scan: u, delta, z [dim, tokens] of the prompts packed by
    query_start_loc [prompts + 1]; B, C [dstate, tokens] (or [1, dstate, tokens]); A
    [dim, dstate]; D, delta_bias [dim]; ssm_states [slots, dim, dstate], each prompt's final
    state written to its slot cache_indices[i] (null_block_id: padding), started from that
    slot where has_initial_state[i]. The output goes into z (delta without z), returned."""
    import numpy as np
    import torch

    from .. import ops
    given = [n for n in _PREFIX_CACHING_ARGS if prefix_caching.get(n) is not None]
    if given:
        raise NotImplementedError(f"{given[0]}: linseq does not run vLLM's prefix caching of "
                                  f"Mamba states (mamba_cache_mode 'none' runs)")
    if u.dim() != 2 or query_start_loc is None or cache_indices is None:
        raise ValueError(f"u: expected vLLM's packed [dim, tokens] prompts with "
                         f"query_start_loc and cache_indices, got u {list(u.shape)}")
    B, C = (P[0] if P.dim() == 3 else P for P in (B, C))
    rows = _rows(cache_indices, "cache_indices")
    # vLLM's None: no prompt has a state yet (to forward_pool, None means every one has)
    has = (np.zeros(rows.shape[0], np.bool_) if has_initial_state is None
           else has_initial_state.detach().numpy())
    arrays = dict(x=_tokens(u), dt=_tokens(delta), A=A.detach(), B=_tokens(B), C=_tokens(C),
                  D=None if D is None else D.detach(), gate=_tokens(z),
                  dt_bias=None if delta_bias is None else delta_bias.detach())

    def run(pool, src, dst, pad_value):
        return ops.forward_pool("ssm1", arrays, pool, src, dst, has,
                                cu_seqlens=query_start_loc.numpy().astype(np.int64),
                                pad_value=pad_value, dt_softplus=bool(delta_softplus),
                                activation="silu")

    (y,) = _on_pool(ssm_states, rows, rows, null_block_id, run)
    out = delta if z is None else z
    out.copy_(torch.from_numpy(y)[0].transpose(0, 1))
    return out


def _state_update(state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False,
                  state_batch_indices=None, dst_state_batch_indices=None, null_block_id=0,
                  out=None, **speculative):
    """vLLM's decode step (its dispatcher's order: D, dt_bias, z): state [slots, dim,
    dstate]; x, dt, z [batch, dim]; B, C [batch, dstate]; A [dim, dstate]; D, dt_bias
    [dim]; request i reads slot
    state_batch_indices[i] and writes dst_state_batch_indices[i] (null_block_id: padding,
    output 0). The output goes into out [batch, dim] (a new tensor without it), returned."""
    import torch

    from .. import ops
    if speculative.get("num_accepted_tokens") is not None or \
            speculative.get("cu_seqlens") is not None:
        raise NotImplementedError("num_accepted_tokens: linseq's route of vLLM's Mamba1 "
                                  "decode takes one token per request")
    if state.dim() != 3 or x.dim() != 2 or state_batch_indices is None:
        raise ValueError(f"state: expected vLLM's Mamba1 pool [slots, dim, dstate] with "
                         f"[batch, dim] tokens and state_batch_indices, got state "
                         f"{list(state.shape)}, x {list(x.shape)}")
    src = _rows(state_batch_indices, "state_batch_indices")
    dst = src if dst_state_batch_indices is None else _rows(dst_state_batch_indices,
                                                            "dst_state_batch_indices")
    arrays = dict(x=x.detach()[:, None], dt=dt.detach()[:, None], A=A.detach(),
                  B=B.detach()[:, None], C=C.detach()[:, None],
                  D=None if D is None else D.detach(),
                  gate=None if z is None else z.detach()[:, None],
                  dt_bias=None if dt_bias is None else dt_bias.detach())

    def run(pool, src, dst, pad_value):
        return ops.decode_pool("ssm1", arrays, pool, src, dst, pad_value=pad_value,
                               dt_softplus=bool(dt_softplus), activation="silu")

    (y,) = _on_pool(state, src, dst, null_block_id, run)
    y = torch.from_numpy(y)[:, 0]
    if out is None:
        return y.to(x.dtype)
    out.copy_(y)
    return out


# ------------------------------------------------------------------------------------------
# The layer: one pre-hook on its output projection
# ------------------------------------------------------------------------------------------

def _unit_stride_rows(projection, args):
    """The output projection's input with unit-stride rows, as vLLM's CPU GEMMs (oneDNN,
    the packed small-GEMM kernel) require: a batch of decodes and prefills reaches it as a
    [tokens, dim] transposed view of the two outputs concatenated, refused as it lies."""
    x = args[0]
    if x.is_cpu and x.dim() == 2 and x.stride(-1) != 1:
        return (x.contiguous(), *args[1:])
    return None


_layer_class = {}   # "MambaMixer" -> linseq's subclass, once made


def _mixer_subclass():
    """vLLM's MambaMixer with the pre-hook on its out_proj: no method of vLLM's replaced."""
    if not _layer_class:
        from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer

        class LinseqMambaMixer(MambaMixer):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.out_proj.register_forward_pre_hook(_unit_stride_rows)

        _layer_class["MambaMixer"] = LinseqMambaMixer
    return _layer_class["MambaMixer"]


def _register_layer():
    """Registers the subclass through vLLM's out-of-tree hook for the layer (for the layers
    built from now on); one that another plugin registered is left alone."""
    try:
        from vllm.model_executor.custom_op import op_registry_oot
        from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
    except Exception as exc:
        _log.debug("linseq: MambaMixer's pre-hook skipped: %s", exc)
        return False
    ours = _mixer_subclass()
    if op_registry_oot.get("MambaMixer", ours) is not ours:
        _log.debug("linseq: MambaMixer's pre-hook skipped: another out-of-tree MambaMixer")
        return False
    if "MambaMixer" not in op_registry_oot:
        MambaMixer.register_oot(ours, name="MambaMixer")
    return True


def _unregister_layer():
    if "MambaMixer" in _layer_class:
        from vllm.model_executor.custom_op import op_registry_oot
        if op_registry_oot.get("MambaMixer") is _layer_class["MambaMixer"]:
            del op_registry_oot["MambaMixer"]


# vLLM module -> function name -> linseq adapter
ROUTES = {_MIXER: {"selective_scan_fn": _selective_scan,
                   "selective_state_update": _state_update}}


# ------------------------------------------------------------------------------------------
# Rebinding
# ------------------------------------------------------------------------------------------

_outside = {}     # (module, name) -> vLLM's function, found there before linseq's went in
_installed = {}   # (module, name) -> the routed function linseq put there


def _routed(adapter, original, qualified):
    """The function installed: the adapter for a call whose tensors are all on the CPU,
    vLLM's function for any other."""
    import torch

    @functools.wraps(original)
    def routed(*args, **kwargs):
        on_cpu = all(t.is_cpu for t in (*args, *kwargs.values())
                     if isinstance(t, torch.Tensor))
        return (adapter if on_cpu else original)(*args, **kwargs)
    routed.linseq_route = qualified
    return routed


def _takes_as_given(adapter, original):
    """True when every parameter the adapter names is one vLLM's function has, at the same
    position (a vLLM release that changed a signature is skipped, not miscalled)."""
    ours = [p.name for p in inspect.signature(adapter).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD]
    theirs = list(inspect.signature(inspect.unwrap(original)).parameters)
    return theirs[:len(ours)] == ours


def enable():
    """Route vLLM's Mamba1 scan and decode step to linseq (idempotent). Returns the
    "module.function" names routed; a module or function this vLLM lacks, or whose
    signature changed, is skipped (logged at debug level)."""
    routed = []
    for module_name, functions in ROUTES.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # vLLM missing, or a release without this module
            _log.debug("linseq: %s skipped: %s", module_name, exc)
            continue
        for name, adapter in functions.items():
            key = (module_name, name)
            current = getattr(module, name, None)
            if current is None:
                _log.debug("linseq: %s.%s skipped: not defined", *key)
                continue
            if current is not _installed.get(key):
                _outside[key] = current
            if not _takes_as_given(adapter, _outside[key]):
                _log.debug("linseq: %s.%s skipped: its signature changed", *key)
                continue
            if key not in _installed or current is not _installed[key]:
                _installed[key] = _routed(adapter, _outside[key], ".".join(key))
            setattr(module, name, _installed[key])
            routed.append(".".join(key))
    if routed and _register_layer():
        routed.append(f"{_MIXER}.MambaMixer.out_proj (pre-hook)")
    return tuple(routed)


def disable():
    """Put back vLLM's functions where linseq's are installed. Returns the names restored."""
    restored = []
    for key, fn in _installed.items():
        module = importlib.import_module(key[0])
        if getattr(module, key[1], None) is fn:
            setattr(module, key[1], _outside[key])
            restored.append(".".join(key))
    _unregister_layer()
    return tuple(restored)


def register():
    """The `vllm.general_plugins` entry point: vLLM calls it in every process it starts
    (more than once is harmless). LINSEQ_VLLM=0 leaves vLLM's functions in place."""
    if os.environ.get(OPT_OUT_VARIABLE, "1").strip().lower() in ("0", "false", "off", "no"):
        _log.info("linseq: %s=0, vLLM's Mamba1 layers left as they are", OPT_OUT_VARIABLE)
        return ()
    routed = enable()
    _log.info("linseq: routed %s", ", ".join(routed) or "nothing (no Mamba1 layer found)")
    return routed
