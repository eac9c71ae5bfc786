"""vLLM's Mamba1 layers (Mamba, FalconMamba), Gated DeltaNet layers (Qwen3-Next, Qwen3.5) and
Mamba2 layers (Mamba2, FalconH1, GraniteMoeHybrid, NemotronH, Zamba2) on linseq, for
vLLM's CPU build: a vLLM plugin.

    pip install "linseq[vllm]"      # registers the plugin: vLLM calls register() at start-up
    LINSEQ_VLLM=0 vllm serve ...    # installed but left off
    LINSEQ_VLLM=all vllm serve ...  # the GDN and Mamba2 layers too (by default only Mamba1's)
    LINSEQ_VLLM=mamba1,mamba2 ...   # the families named (mamba1, gdn, mamba2)

    import linseq.integrations.vllm as linseq_vllm
    linseq_vllm.enable()            # by hand, without the entry point (same effect)
    linseq_vllm.enable("all")       # with the GDN and Mamba2 layers
    linseq_vllm.disable()           # back to vLLM's own functions

Mamba1. vLLM's CPU build cannot run a Mamba or FalconMamba model: its prefill scan
(`selective_scan_fn`) calls a CUDA/ROCm-only custom op, and its CPU decode step
(`selective_state_update`) indexes the state as Mamba2's [slots, heads, dim, dstate].
Routed, the prefill scan runs on linseq's SSM1 op over vLLM's own state pool
(linseq.ops.forward_pool: packed prompts by query_start_loc, the int32 slot of each prompt,
vLLM's null block as padding, has_initial_state for a prompt continued over several steps),
and the decode step on the same op's decode step over the pool (linseq.ops.decode_pool).
vLLM's CPU causal conv of the Mamba1 layer (a PyTorch function) is left as it is. vLLM's
prefix caching in its align mode runs as it is: the engine schedules prompts in whole blocks
and keeps each block's final state itself, so the scan sees a continued prompt
(has_initial_state); a call with per-block state indices (block_idx_*) is refused by name.

Gated DeltaNet (family "gdn", routed only when asked: LINSEQ_VLLM=all or gdn, or
enable("all")). Its state is exact in float32 where vLLM's ops run in bfloat16 (their
decode state is 2-6e-3 off float64), but small models decode at about vLLM's tokens/s
through it (docs/performance.md, served tables), so vLLM's ops stay the default.
vLLM's CPU GDN layer runs its own C++ ops, which it calls as attributes of
vllm._custom_ops; routed, they run on linseq's KDA op (per-head decay) over vLLM's pool
[slots, HV, K, V] in place: the chunked prefill of the packed prompts
(chunk_gated_delta_rule_cpu: each prompt from its slot, its final state back there; the
layer zeroes the slots of new prompts first; on bfloat16 prompts, on a CPU where that
is faster (bf16_products_pay: AMD's with AVX512-BF16), the products only the output reads
take bf16 operands, as vLLM's kernels compute in bf16, the states float32's bits all the
same), the decode step with the gate fused
(fused_sigmoid_gating_delta_rule_update_cpu: decay -exp(A_log) softplus(a + dt_bias) and
beta = sigmoid(b) in linseq's kernel), the speculative decode step
(fused_sigmoid_gating_delta_rule_update_spec_cpu: from the slot of the last accepted token,
the state after each draft token to that token's slot), and the layer's causal conv
(causal_conv1d_fwd_cpu, causal_conv1d_update_cpu: the weight vLLM prepacked unpacked, the
conv state in vLLM's layouts). Each call passes vLLM's pool tensors to the library's
pool functions as they lie (data pointer, row stride, dtype; the conv state as the tap-major
pool it is) with vLLM's int32 slot tensors, its problem struct from a template per shapes
and options (_pool_call); a pool the library cannot read in place runs on a float32 copy
of the rows named. The decode step and the decode conv of the common form (tensors as vLLM
passes them, its default conv-state layout) go to C++ steps instead where linseq's C++
kernels are loaded (linseq::vllm_gdn_decode, vllm_conv_update: the same library call
without the Python around it, which cost more than the kernel at batch 1). q and k are
l2-normalised with vLLM's eps (1e-5). A call an adapter does not cover (another layout, a
conv buffer widened for speculative decoding, a varying number of draft tokens) runs on
vLLM's op, as does a call with tensors off the CPU.
On a CPU without AVX512-BF16, vLLM's GDN layer runs its PyTorch conv instead, left as it is.

Mamba2 (family "mamba2", routed only when asked: LINSEQ_VLLM=all or mamba2, or
enable("all")). vLLM's Mamba2 layer (MambaMixer2) calls five functions it imported into its
module, rebound there. Its prefill scan (mamba_chunk_scan_combined_varlen) runs on linseq's
SSD op: the layer itself gathers each prompt's state from its pool (zeros for a new prompt)
and writes the final states the scan returns back to the pool, so the scan's pool is the
tensor it returns, [prompts, heads, headdim, dstate] in the state dtype, which the library
fills in place (a bfloat16 one included, each state rounded once). Its decode step
(selective_state_update, vLLM's SSU dispatcher) runs on the SSD op's decode over vLLM's
pool [slots, heads, headdim, dstate] in place, vLLM's null block and negative slots as
padding; dt, dt_bias and A, which the layer expands over headdim with stride 0, are taken per
head, and a call whose values differ along headdim is declined. Its conv (causal_conv1d_fn,
causal_conv1d_update) runs on linseq's causal conv op with the layer's [dim, width] weight
and the conv state in vLLM's layouts, as the GDN conv does. Prefix caching in vLLM's align
mode, which vLLM's CPU build cannot run on its own (its scan ignores
return_intermediate_states, and its store_prefill_checkpoint is a Triton kernel): the scan
returns the state at each chunk end (the library's forward_pool_blocks, vLLM's chunks as its
blocks), and store_prefill_checkpoint keeps the checkpoints in the pools with PyTorch
indexing. Declined (vLLM's op runs): speculative decoding (num_accepted_tokens), and chunk
layouts other than vLLM's (chunk ends at multiples of chunk_size). The decode step and the
decode conv of the common form go to the C++ steps (linseq::vllm_ssd_decode,
vllm_conv_update) where they are loaded. Per
call against vLLM's own functions (tools/perf/vllm_calls.py: one thread, 24 heads of
64, dstate 128, a bfloat16 pool) the prefill scan ran 1.0-1.6x as fast as vLLM's, the conv
3-17x, the decode step 1.02-1.26x on an Intel Xeon (0.93-1.01x on an AMD EPYC before the
bf16 rounding instruction). vLLM's ops stay the default here (opt-in family, as every route
of an op vLLM runs itself).

Padding: linseq leaves a request whose slot is negative (vLLM's PAD_SLOT_ID) or vLLM's null
block untouched, its output 0.

Not covered: a bfloat16 Mamba1 model on a CPU with AVX512-BF16 (or Arm bf16), where vLLM
prepacks the conv weight (width 4) into a layout its Mamba1 layer then cannot reshape (an
IndexError in vLLM's layer before any kernel runs); float32 Mamba1 models run. vLLM's GDN
layer runs in bfloat16 only.

Why module globals are rebound: vLLM's layers call the functions they imported into their
own modules at import time (the Mamba1 mixer), or vllm._custom_ops' functions by attribute
(the GDN layer). vLLM's out-of-tree hook for a layer (`PluggableLayer.register_oot`)
replaces the whole layer class, which would mean a second copy of the layer's forward, and
only for layers built after the plugin was loaded. Rebinding the names the layer calls is
the narrowest change that survives vLLM's structure, as linseq.integrations.transformers
does for transformers' model modules.

One thing more, not a kernel: a batch that mixes decodes and prefills reaches the Mamba1
layer's out_proj as a transposed view, which vLLM's CPU GEMMs refuse whatever ran the scan.
The plugin registers (register_oot) a MambaMixer subclass that only adds a pre-hook on
out_proj giving it unit-stride rows; it applies to models built after enable().
"""

import functools
import importlib
import inspect
import logging
import os

__all__ = ["register", "enable", "disable", "families_from", "ROUTES", "DEFAULT_FAMILIES",
           "OPT_OUT_VARIABLE", "PRODUCTS_VARIABLE", "bf16_products_pay"]

_log = logging.getLogger(__name__)

OPT_OUT_VARIABLE = "LINSEQ_VLLM"   # which families register() routes ("0": none)

_MIXER = "vllm.model_executor.layers.mamba.mamba_mixer"
_MIXER2 = "vllm.model_executor.layers.mamba.mamba_mixer2"
_CUSTOM_OPS = "vllm._custom_ops"
_PREFIX_CACHING_ARGS = ("block_idx_first_scheduled_token", "block_idx_last_scheduled_token",
                        "initial_state_idx")


# ------------------------------------------------------------------------------------------
# The pool as NumPy sees it
# ------------------------------------------------------------------------------------------

def _numpy_pool(pool):
    """vLLM's state pool [slots, ...] (a view of its cache pages) as a NumPy array on the same
    memory, or None where linseq cannot read it in place: a dtype NumPy lacks (bfloat16), or
    rows that are not C-contiguous (the conv state's default layout, [slots, width-1, dim]
    seen as [slots, dim, width-1])."""
    import torch
    if pool.dtype not in (torch.float32, torch.float16) or pool.dim() < 2 or \
            not pool[0].is_contiguous():
        return None
    return pool.detach().numpy()


def _on_pool(pool, src, dst, pad_value, run):
    """run(numpy pool, src rows, dst rows, pad_value) on vLLM's pool where NumPy can see it;
    otherwise on a float32 copy of the rows src and dst name (pad_value and negative rows
    mark padding), written back after the step."""
    import torch
    arr = _numpy_pool(pool)
    if arr is not None:
        return run(arr, src.numpy(), dst.numpy(), pad_value)
    both = torch.cat([src, dst])
    used = both >= 0 if pad_value is None else (both >= 0) & (both != pad_value)
    named, local_index = torch.unique(both[used].long(), return_inverse=True)
    local = torch.zeros((max(named.numel(), 1),) + tuple(pool.shape[1:]))
    local[:named.numel()] = pool[named].to(torch.float32)
    local_rows = torch.full_like(both, -1)   # negative: padding to the library
    local_rows[used] = local_index.to(both.dtype)
    local_src, local_dst = local_rows[:src.numel()], local_rows[src.numel():]
    out = run(local.numpy(), local_src.numpy(), local_dst.numpy(), None)
    pool[named] = local[:named.numel()].to(pool.dtype)
    return out


# ------------------------------------------------------------------------------------------
# The pool contract on vLLM's own tensors: one call per step, no copy of the pool
# ------------------------------------------------------------------------------------------

# torch dtype name -> linseq_pool_dtype (include/linseq.h): vLLM keeps its states in the
# model's dtype (bfloat16) unless told otherwise, which the library reads widened in place
_POOL_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
_POOL_FUNCTIONS = ("decode_pool", "decode_tokens_pool", "forward_pool")
_problem_templates = {}   # (function, op, options, input shapes, sequences) -> _Template
_exec = {}                # (bf16 tokens, bf16 products) -> the exec of pool calls


class _Template:
    """What a pool call's problem depends on besides its tensors' addresses, from one call
    checked in full by linseq.ops.TableInputs (every input's shape against the library's op
    table under these sizes and options): the problem struct's bytes, the struct fields of
    the inputs, the outputs' shapes, the state rows' shape."""

    def __init__(self, function, op, arrays, cu_seqlens, options):
        import numpy as np

        from .. import _lib, ops
        # the shapes are what is checked: bfloat16 tensors are checked as float32 ones
        given = {n: a.float().numpy() for n, a in arrays.items() if a is not None}
        inputs = ops.TableInputs(op, given, None if cu_seqlens is None
                                 else cu_seqlens.numpy().astype(np.int64), None, options)
        roles = _lib.op_desc(op)["decode"]
        self.problem_class = type(inputs.problem)
        self.problem_bytes = bytes(inputs.problem)
        self.fields = {t["name"]: t["field"] for t in _lib.op_tensors(op, "input")}
        self.token = {t["name"] for t in _lib.op_tensors(op, "input") if t.get("token")}
        names = [t["name"] for t in _lib.op_tensors(op, "output")]
        self.outputs = [inputs.shapes[n] for n in names]
        self.token_outputs = [bool(t.get("token")) for t in _lib.op_tensors(op, "output")]
        self.state_out = names.index(roles["state_out"])
        self.row_shape = inputs.shapes[roles["state"]][1:]
        self.state_count = inputs.shapes[roles["state"]][0]   # requests or sequences
        self.dst_count = self.state_count * (getattr(inputs.problem, "T", 1)
                                             if function == "decode_tokens_pool" else 1)


def _template(function, op, arrays, cu_seqlens, options):
    # an adapter names its arrays and options in one order: no sorting on the hot path
    key = (function, op, tuple(options.items()), tuple(arrays),
           tuple(None if a is None else a.shape for a in arrays.values()),
           None if cu_seqlens is None else cu_seqlens.numel())
    template = _problem_templates.get(key)
    if template is None:
        if len(_problem_templates) > 4096:   # prefill shapes of many step sizes
            _problem_templates.clear()
        template = _problem_templates[key] = _Template(function, op, arrays, cu_seqlens,
                                                                options)
    return template


def _pool_layout(pool, row_shape):
    """(data pointer, row stride in elements, linseq_pool_dtype) of vLLM's pool tensor
    [slots, *row_shape] as it lies, or None where the library cannot read it there: another
    dtype, or a layout the library's rule refuses (linseq_state_pool_row_stride: rows not
    C-contiguous, or closer than a row)."""
    _, _, _lib, _ = _modules()
    dtype = _POOL_DTYPES.get(str(pool.dtype).rpartition(".")[2])
    if dtype is None or tuple(pool.shape[1:]) != tuple(row_shape) or not pool.is_cpu:
        return None
    row_stride = _lib.state_pool_row_stride(pool.shape, pool.stride())
    return None if row_stride is None else (pool.data_ptr(), row_stride, dtype)


def _pool_call(function, op, arrays, pool, src, dst=None, *, pad_value=None,
               has_initial_state=None, cu_seqlens=None, bf16_products=False, blocks=None,
               **options):
    """linseq.ops' `function` (decode_pool, decode_tokens_pool, forward_pool, or
    forward_pool_blocks with blocks = (block_size, block_rows [sequences, max_blocks],
    computed_tokens [sequences]) of src's dtype: include/linseq.h) of op on
    vLLM's pool tensor in place, its rows where they lie: arrays {the table's input name:
    a C-contiguous float32 tensor or None; the op's per-token inputs may all be bfloat16
    instead, which the library then reads as they are (exec dtype bf16: an op that does not
    take them refuses the call by name), its per-token outputs bfloat16 too}; src, dst the
    int32 or int64 slot tensors as vLLM
    passes them (dst None: src; [B*T] for decode_tokens_pool); has_initial_state a bool
    tensor, cu_seqlens an integer one (forward_pool); bf16_products: the chunked forward's
    output products on bf16 operands (exec->products), for a caller that computes in bf16
    (the arrays may be float32 all the same). The problem struct and its checks come
    from a template per shapes and options (_Template); the library checks the rest (the
    pool's span, every index, cu_seqlens). Returns the outputs but the state (float32
    tensors; None where absent), or None, before anything is written, where the pool's
    layout is not one the library reads in place."""
    ctypes, torch, _lib, ops = _modules()
    template = _template("forward_pool" if blocks else function, op, arrays, cu_seqlens,
                         options)
    token_dtype = _token_dtype(template, arrays)
    layout = _pool_layout(pool, template.row_shape)
    if layout is None:
        return None
    if src.dtype not in (torch.int32, torch.int64) or not src.is_contiguous() or \
            src.shape != (template.state_count,) or dst is not None and (
                dst.dtype != src.dtype or not dst.is_contiguous() or
                dst.shape != (template.dst_count,)):
        raise ValueError(f"slot indices: expected contiguous int32 or int64 src "
                         f"[{template.state_count}] and dst [{template.dst_count}] of one "
                         f"type, got src {src.dtype} {list(src.shape)}" +
                         ("" if dst is None else f", dst {dst.dtype} {list(dst.shape)}"))
    problem = template.problem_class.from_buffer_copy(template.problem_bytes)
    for name, a in arrays.items():
        if a is not None:
            setattr(problem, template.fields[name], a.data_ptr())
    kept = [arrays, src, dst]
    if cu_seqlens is not None:
        cu = cu_seqlens.to(torch.int64).contiguous()
        problem.cu_seqlens = cu.data_ptr()
        kept.append(cu)
    has = None
    if has_initial_state is not None:
        has = has_initial_state.to(torch.bool).contiguous()
        if has.shape != (template.state_count,):
            raise ValueError(f"has_initial_state: expected [{template.state_count}] booleans, "
                             f"got {list(has.shape)}")
    outs = [None if s is None or i == template.state_out else
            torch.empty(s, dtype=token_dtype if template.token_outputs[i] else torch.float32)
            for i, s in enumerate(template.outputs)]
    ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[None if o is None or o.numel() == 0
                                                    else o.data_ptr() for o in outs])
    data, row_stride, dtype = layout
    spec = _lib.StatePool(data=data, n_rows=pool.shape[0], row_stride=row_stride, dtype=dtype,
                          src_rows=src.data_ptr(),
                          dst_rows=None if dst is None else dst.data_ptr(),
                          index_bits=src.element_size() * 8,
                          has_pad_value=pad_value is not None,
                          pad_value=0 if pad_value is None else int(pad_value))
    settings = (token_dtype == torch.bfloat16, bool(bf16_products))
    if settings not in _exec:
        _exec[settings] = ops.make_exec(mode="default", bf16=settings[0],
                                        bf16_products=settings[1])
    call = getattr(_lib.lib, f"linseq_op_{function}")
    head = (op.encode(), ctypes.byref(problem), ctypes.byref(_exec[settings]),
            ctypes.byref(spec))
    if function == "forward_pool":
        _lib.check(call(*head, None if has is None else has.data_ptr(), ptrs))
    elif function == "forward_pool_blocks":
        block_size, block_rows, computed = blocks
        if block_rows.dtype != src.dtype or computed.dtype != src.dtype or \
                block_rows.dim() != 2 or not block_rows.is_contiguous() or \
                block_rows.shape[0] != template.state_count or \
                computed.shape != (template.state_count,) or not computed.is_contiguous():
            raise ValueError(f"block_rows, computed_tokens: expected contiguous {src.dtype} "
                             f"[{template.state_count}, max_blocks] and "
                             f"[{template.state_count}], got {block_rows.dtype} "
                             f"{list(block_rows.shape)} and {computed.dtype} "
                             f"{list(computed.shape)}")
        _lib.check(call(*head, None if has is None else has.data_ptr(), int(block_size),
                        block_rows.data_ptr(), block_rows.shape[1], computed.data_ptr(),
                        ptrs))
    else:
        _lib.check(call(*head, ptrs))
    del kept
    return [o for i, o in enumerate(outs) if i != template.state_out]


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
                                  f"Mamba states by per-block indices (mamba_cache_mode "
                                  f"'none' and 'align' run)")
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
# Adapters: vLLM CPU's Gated DeltaNet ops (Qwen3-Next, Qwen3.5) and their conv, on linseq
# ------------------------------------------------------------------------------------------

class _Declined(Exception):
    """Raised by an adapter, before it writes anything, for a call whose arguments it does
    not take (a layout or option linseq's route does not cover): vLLM's own op runs it."""


GDN_L2NORM_EPS = 1e-5   # vLLM CPU's GDN kernels: q / sqrt(sum q^2 + eps), likewise k


_loaded = []   # (ctypes, torch, linseq._lib, linseq.ops), imported on the first pool call
_steps = []    # {step name: its C++ kernel} of the steps the C++ library takes


def _modules():
    """The modules a pool call uses, imported once (an import statement per call costs
    microseconds of the call's few tens)."""
    if not _loaded:
        import ctypes

        import torch

        from .. import _lib, ops
        _loaded.append((ctypes, torch, _lib, ops))
    return _loaded[0]


def _native_step(name):
    """The C++ kernel of linseq::<name> (vllm_gdn_decode, vllm_conv_update, vllm_ssd_decode;
    linseq's _torch_native.cpp), or None where the C++ kernels are not loaded: a step of the common
    form in one library call, without the Python of the pool call (_pool_call). It returns
    [output], or [] for a call of another form, which the Python path takes."""
    if not _steps:
        from .. import _torch_native
        _steps.append({n: _torch_native.defined_here(n)
                       for n in ("vllm_gdn_decode", "vllm_conv_update", "vllm_ssd_decode")})
    return _steps[0][name]


def _token_tensors(*tensors):
    """vLLM's per-token tensors as the library reads them: as they are (C-contiguous) where
    every one is bfloat16, the model's dtype, which the KDA and conv kernels take in place of
    float32 with the same arithmetic on the widened values; float32 copies otherwise."""
    import torch
    if all(t.dtype == torch.bfloat16 and t.is_cpu for t in tensors):
        return [t.detach().contiguous() for t in tensors]
    return [_f32(t) for t in tensors]


def _token_dtype(template, arrays):
    """The dtype of the call's per-token tensors (float32, or bfloat16 where every one is),
    after checking that each array is a C-contiguous CPU tensor of its kind's dtype."""
    import torch
    tokens = {arrays[n].dtype for n in template.token if arrays.get(n) is not None}
    token_dtype = torch.bfloat16 if tokens == {torch.bfloat16} else torch.float32
    for name, a in arrays.items():
        want = token_dtype if name in template.token else torch.float32
        if a is not None and (a.dtype != want or not a.is_contiguous() or not a.is_cpu):
            raise ValueError(f"{name}: expected a C-contiguous {str(want)[6:]} CPU tensor "
                             f"(per-token tensors all float32 or all bfloat16, the others "
                             f"float32), got {a.dtype} {list(a.shape)} strides "
                             f"{list(a.stride())}")
    return token_dtype


def _f32(t):
    """A tensor (bfloat16 included) as a C-contiguous float32 tensor (no copy where it is
    one), None as None."""
    import torch
    return None if t is None else t.detach().to(torch.float32).contiguous()


def _on_vllms_pool(function, op, arrays, pool, src, dst=None, *, pad_value=None,
                   has_initial_state=None, cu_seqlens=None, bf16_products=False, **options):
    """linseq.ops' `function` of op on vLLM's pool where it lies (_pool_call); where the
    library cannot read the pool in place, on a float32 copy of the rows named (_on_pool,
    float32 products: bf16_products is a permission). Returns the outputs but the state,
    float32 tensors."""
    import numpy as np
    import torch

    from .. import ops
    out = _pool_call(function, op, arrays, pool, src, dst, pad_value=pad_value,
                     has_initial_state=has_initial_state, cu_seqlens=cu_seqlens,
                     bf16_products=bf16_products, **options)
    if out is not None:
        return out
    given = {n: None if a is None else _f32(a).numpy() for n, a in arrays.items()}

    def run(rows_pool, src_rows, dst_rows, pad):
        if function == "forward_pool":
            return ops.forward_pool(
                op, given, rows_pool, src_rows, dst_rows,
                None if has_initial_state is None else has_initial_state.numpy(),
                cu_seqlens=None if cu_seqlens is None else cu_seqlens.numpy().astype(np.int64),
                pad_value=pad, **options)
        if function == "decode_tokens_pool":
            return ops.decode_tokens_pool(op, given, rows_pool, src_rows,
                                          dst_rows.reshape(src_rows.shape[0], -1),
                                          pad_value=pad, **options)
        return ops.decode_pool(op, given, rows_pool, src_rows, dst_rows, pad_value=pad,
                               **options)

    outs = _on_pool(pool, src, src if dst is None else dst, pad_value, run)
    return [None if o is None else torch.from_numpy(o) for o in outs]


PRODUCTS_VARIABLE = "LINSEQ_VLLM_PRODUCTS"   # bf16 or f32: the GDN prefill's, whatever the CPU
_products_choice = []   # [whether bf16 products pay], decided on first use


def bf16_products_pay(cpuinfo="/proc/cpuinfo"):
    """Whether the GDN prefill of bfloat16 prompts runs the output's products on bf16
    operands (exec->products) on this CPU: where its bf16 dot product (vdpbf16ps) is faster
    than float32 FMAs, AMD's (on Zen 5 the chunked forward ran 1.06-1.12x as fast), not on
    Intel's, where it runs at about half the FMA rate and the forward took 1.28x the time
    (docs/performance.md); nowhere without AVX512-BF16. Decided once, from the vendor and
    flags in `cpuinfo`; LINSEQ_VLLM_PRODUCTS=bf16 or f32 decides instead."""
    if not _products_choice:
        forced = os.environ.get(PRODUCTS_VARIABLE, "").strip().lower()
        if forced not in ("", "bf16", "f32"):
            raise ValueError(f"{PRODUCTS_VARIABLE}={forced!r}: expected bf16 or f32 (or unset: "
                             f"by the CPU)")
        _products_choice.append(forced == "bf16" if forced else _amd_with_bf16(cpuinfo))
    return _products_choice[0]


def _amd_with_bf16(cpuinfo):
    """True when the first processor `cpuinfo` lists is AMD's and has AVX512-BF16."""
    vendor, flags = "", ()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = value.split()
                    break
    except OSError:
        return False
    return vendor == "AuthenticAMD" and "avx512_bf16" in flags


def _gdn_gate_options(use_qk_l2norm_in_kernel, eps=GDN_L2NORM_EPS):
    return dict(decay="per_head", use_qk_l2norm=bool(use_qk_l2norm_in_kernel),
                l2norm_eps=float(eps))


def _chunk_gated_delta_rule(query, key, value, g, beta, initial_state, output_final_state,
                            cu_seqlens, head_first, use_qk_l2norm_in_kernel,
                            initial_state_indices, eps=GDN_L2NORM_EPS):
    """vLLM's GDN prefill: query, key [1, tokens, H, K], value [1, tokens, HV, V] of the
    prompts packed by cu_seqlens; g [1, tokens, HV] (log decay) and beta [1, tokens, HV] from
    its gating op; initial_state the pool [slots, HV, K, V]. Prompt i starts from slot
    initial_state_indices[i] (vLLM's layer zeroes the slots of new prompts first) and its
    final state goes back there. Returns (o [1, tokens, HV, V] in value's dtype, the pool)."""
    import torch
    if head_first or not output_final_state or query.dim() != 4 or query.shape[0] != 1 or \
            cu_seqlens is None:
        raise _Declined
    rows = _rows(initial_state_indices, "initial_state_indices")
    q, k, v, beta, g = _token_tensors(query, key, value, beta, g)
    arrays = dict(q=q, k=k, v=v, beta=beta, g=g)
    # vLLM's kernels compute in bf16 on bf16 prompts: the output's products may too, where
    # that is faster on this CPU
    bf16_products = value.dtype == torch.bfloat16 and bf16_products_pay()
    (o,) = _on_vllms_pool("forward_pool", "kda", arrays, initial_state, rows,
                          cu_seqlens=cu_seqlens, bf16_products=bf16_products,
                          **_gdn_gate_options(use_qk_l2norm_in_kernel, eps))
    return o.to(value.dtype), initial_state


def _gated_tokens(A_log, dt_bias, q, k, v, a, b, batch, tokens):
    """The fused-gate KDA inputs of vLLM's decode ops: q, k [(1,) batch*tokens, H, K], v
    [(1,) batch*tokens, HV, V], a, b [batch*tokens, HV] (raw gate input, beta logits) as
    linseq's [batch, tokens, ...] tensors (_token_tensors), A_log and dt_bias float32."""
    def per_request(t, like):
        return t.view(batch, tokens, *like.shape[-2 if like.dim() >= 3 else -1:])
    given = (q, k, v, b, a)
    q_, k_, v_, b_, a_ = (per_request(t, like) for t, like in zip(_token_tensors(*given), given))
    return dict(q=q_, k=k_, v=v_, beta=b_, g=a_, A_log=_f32(A_log), dt_bias=_f32(dt_bias))


def _check_softplus(softplus_beta, softplus_threshold):
    """linseq's gate is softplus with beta 1; vLLM's threshold (x itself above it) differs
    from it by less than exp(-threshold), nothing in float32 from 20 on."""
    if softplus_beta != 1.0 or softplus_threshold < 20.0:
        raise _Declined


_one_each = {}   # (batch, dtype) -> tensor 0, 1, ..., batch


def _one_token_each(cu_seqlens, batch):
    """Whether cu_seqlens is 0, 1, ..., batch (None: vLLM's decode without it), compared
    with one kept tensor of that batch size."""
    if cu_seqlens is None:
        return True
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() != batch + 1:
        return False
    torch = _modules()[1]
    key = (batch, cu_seqlens.dtype)
    steps = _one_each.get(key)
    if steps is None:
        if len(_one_each) > 1024:
            _one_each.clear()
        steps = _one_each[key] = torch.arange(batch + 1, dtype=cu_seqlens.dtype)
    return torch.equal(cu_seqlens if cu_seqlens.is_cpu else cu_seqlens.cpu(), steps)


def _gated_delta_update(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                        initial_state_indices, cu_seqlens, use_qk_l2norm_in_kernel,
                        softplus_beta=1.0, softplus_threshold=20.0):
    """vLLM's GDN decode step with its gate fused: one token per request (cu_seqlens
    0, 1, ..., batch), request i read from and written to slot initial_state_indices[i]
    (negative: padding, output 0) of the pool [slots, HV, K, V]; the decay
    -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) computed in linseq's kernel.
    Returns o [batch, 1, HV, V] in v's dtype."""
    _check_softplus(softplus_beta, softplus_threshold)
    step = _native_step("vllm_gdn_decode")
    if step is not None:
        taken = step(A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices,
                     cu_seqlens, bool(use_qk_l2norm_in_kernel), GDN_L2NORM_EPS)
        if taken:
            return taken[0]
    batch = a.shape[0]
    if not _one_token_each(cu_seqlens, batch):
        raise _Declined   # several tokens per request: vLLM's kernel runs them
    rows = _rows(initial_state_indices, "initial_state_indices")
    arrays = _gated_tokens(A_log, dt_bias, q, k, v, a, b, batch, 1)
    (o,) = _on_vllms_pool("decode_pool", "kda", arrays, initial_state_source, rows,
                          gate_in_kernel=True, beta_is_logit=True,
                          **_gdn_gate_options(use_qk_l2norm_in_kernel))
    return o.to(v.dtype)


def _gated_delta_update_spec(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                             spec_state_indices, num_accepted_tokens, cu_seqlens,
                             use_qk_l2norm_in_kernel, softplus_beta=1.0,
                             softplus_threshold=20.0):
    """vLLM's speculative GDN decode: request i runs its draft tokens (the same count T for
    every request here) from slot spec_state_indices[i, num_accepted_tokens[i] - 1], the
    state after its token t going to slot spec_state_indices[i, t] (what a rollback resumes
    from). Returns o [1, batch*T, HV, V] in v's dtype."""
    import torch

    _check_softplus(softplus_beta, softplus_threshold)
    batch = spec_state_indices.shape[0]
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if batch == 0 or lengths.numel() != batch or not torch.all(lengths == lengths[0]) or \
            not 1 <= int(lengths[0]) <= spec_state_indices.shape[1] or \
            bool(torch.any(num_accepted_tokens < 1)):
        raise _Declined
    tokens = int(lengths[0])
    slots = spec_state_indices.contiguous()
    src = slots.gather(1, num_accepted_tokens.long()[:, None] - 1)[:, 0].contiguous()
    dst = slots[:, :tokens].contiguous().view(-1)
    arrays = _gated_tokens(A_log, dt_bias, q, k, v, a, b, batch, tokens)
    (o,) = _on_vllms_pool("decode_tokens_pool", "kda", arrays, initial_state_source, src, dst,
                          gate_in_kernel=True, beta_is_logit=True,
                          **_gdn_gate_options(use_qk_l2norm_in_kernel))
    return o.reshape(1, batch * tokens, *o.shape[2:]).to(v.dtype)


_conv_unpacking = {}   # packed weight shape -> the flat packed position of each weight
# (what, id(parameter)) -> (the parameter, kept so that its id is not reused while it is a
# key, its version counter and data pointer when copied, the copy of it the library reads)
_layer_copies = {}


def _layer_copy(what, param, make):
    """make(param), made once per layer parameter and kind of copy `what` (a parameter does
    not change while the layer serves; its version counter and data pointer tell if it
    did). Found by the parameter's identity, which the entry holds, so that the lookup in
    each decode call costs one dictionary read and three comparisons."""
    held = _layer_copies.get((what, id(param)))
    if held is None or held[0] is not param or held[1] != param._version or \
            held[2] != param.data_ptr():
        if len(_layer_copies) > 4096:   # parameters of engines gone
            _layer_copies.clear()
        held = _layer_copies[(what, id(param))] = (param, param._version, param.data_ptr(),
                                                   make(param))
    return held[3]


def _unpacked_conv_weight(packed):
    """The [dim, width] conv weight from the layout vLLM's causal_conv1d_weight_pack gives
    it (on CPUs with AVX512-BF16 vLLM packs the layer's weight at load time). The layout is
    learnt from vLLM's own pack of two probes whose values name each weight's position
    (integers below 256, exact in bfloat16); one that is not a permutation is declined."""
    import torch
    import vllm._custom_ops as vllm_ops
    shape = tuple(packed.shape)
    if shape not in _conv_unpacking:
        n = packed.numel()
        position = torch.arange(n).view(shape)
        low, high = (vllm_ops.causal_conv1d_weight_pack(p.to(torch.bfloat16).contiguous())
                     for p in (position % 256, position // 256))
        held = (high.double() * 256 + low.double()).long().reshape(-1)
        if not torch.equal(torch.sort(held).values, torch.arange(n)):
            raise _Declined
        where = torch.empty_like(held)
        where[held] = torch.arange(n)
        _conv_unpacking[shape] = where
    return packed.reshape(-1)[_conv_unpacking[shape]].view(shape)


def _conv_taps(weight, is_weight_packed):
    """The conv weight as float32 [width, dim] (linseq's weight_tap_major: a tap's weights
    contiguous, what the decode step reads in place), made once per layer weight (it does
    not change while the layer serves; its version counter tells if it did); a packed one
    unpacked first."""
    def taps(weight):
        rows = _unpacked_conv_weight(weight) if is_weight_packed else weight
        return _f32(rows.detach().reshape(rows.shape[0], rows.shape[-1]).t())
    return _layer_copy(("taps", bool(is_weight_packed)), weight, taps)


def _conv_bias(bias):
    """The conv bias as float32 (a bfloat16 one widened once per layer), None as None."""
    return None if bias is None else _layer_copy("float32", bias, _f32)


def _conv_pool(conv_states, width):
    """vLLM's conv-state pool [slots, dim, width-1] as linseq's pool and its layout option:
    its default layout, [slots, width-1, dim] memory seen transposed, as the tap-major pool
    it is; otherwise as given. A buffer of another width (speculative decoding) is
    declined."""
    if conv_states is None or conv_states.dim() != 3 or conv_states.shape[-1] != width - 1:
        raise _Declined
    if conv_states.stride(1) == 1 and conv_states.shape[1] > 1:
        return conv_states.transpose(1, 2), True
    return conv_states, False


def _conv_forward(x, weight, bias, conv_states, query_start_loc, cache_indices,
                  has_initial_state, silu_activation, is_weight_packed):
    """vLLM's CPU causal conv over packed prompts: x [dim, tokens] by query_start_loc;
    conv_states [slots, dim, width-1] (any strides); prompt i continues from slot
    cache_indices[i] where has_initial_state[i] (None: nowhere), from zeros otherwise, and
    leaves its last width-1 inputs there (negative: padding). Returns [dim, tokens]."""
    if x.dim() != 2 or query_start_loc is None or cache_indices is None:
        raise _Declined
    return _conv_prefill_on_pool(x, _conv_taps(weight, is_weight_packed), bias, conv_states,
                                 query_start_loc, _rows(cache_indices, "cache_indices"),
                                 has_initial_state, silu_activation, pad_value=None)


def _conv_prefill_on_pool(x, taps, bias, conv_states, query_start_loc, rows,
                          has_initial_state, silu, pad_value):
    """The packed prompts' conv (x [dim, tokens]) with float32 taps [width, dim] over vLLM's
    conv-state pool, prompt i on slot rows[i]; has_initial_state None: none has a state yet.
    Returns [dim, tokens] in x's dtype."""
    import torch
    pool, tap_major = _conv_pool(conv_states, taps.shape[0])
    has = (torch.zeros(rows.shape[0], dtype=torch.bool) if has_initial_state is None
           else has_initial_state)
    (tokens,) = _token_tensors(x.transpose(0, 1))   # bfloat16 x read as it is
    arrays = dict(x=tokens[None], weight=taps, bias=_f32(bias))
    (y,) = _on_vllms_pool("forward_pool", "causal_conv1d", arrays, pool, rows,
                          pad_value=pad_value, has_initial_state=has,
                          cu_seqlens=query_start_loc,
                          activation="silu" if silu else "identity",
                          state_tap_major=tap_major, weight_tap_major=True)
    return y[0].to(x.dtype).transpose(0, 1)


def _conv_update(x, conv_states, weight, bias, silu_activation, conv_state_indices,
                 is_weight_packed, num_accepted_tokens=None):
    """vLLM's CPU causal conv decode step: x [batch, dim] one token per request, request i
    on slot conv_state_indices[i] (negative: padding) of conv_states [slots, dim, width-1].
    Returns [batch, dim]."""
    if num_accepted_tokens is not None or x.dim() != 2 or conv_state_indices is None:
        raise _Declined
    return _conv_step(x, conv_states, _conv_taps(weight, is_weight_packed), bias,
                      silu_activation, conv_state_indices, pad_value=None)


def _conv_step(x, conv_states, taps, bias, silu, indices, pad_value):
    """The decode conv of x [batch, dim] over vLLM's conv-state pool, request i on slot
    indices[i]: the C++ step where it takes the call, else the Python path."""
    step, bias = _native_step("vllm_conv_update"), _conv_bias(bias)
    if step is not None:
        taken = step(x, conv_states, taps, bias, bool(silu), indices, pad_value)
        if taken:
            return taken[0]
    return _conv_step_on_pool(x, conv_states, taps, bias, silu,
                              _rows(indices, "conv_state_indices"), pad_value=pad_value)


def _conv_step_on_pool(x, conv_states, taps, bias, silu, rows, pad_value):
    """One token per request (x [batch, dim]) of the conv with float32 taps [width, dim] over
    vLLM's conv-state pool, request i on slot rows[i]. Returns [batch, dim] in x's dtype."""
    pool, tap_major = _conv_pool(conv_states, taps.shape[0])
    # bfloat16 x and y the library's one-token step takes over tap-major states only
    (tokens,) = _token_tensors(x) if tap_major else (_f32(x),)
    arrays = dict(x=tokens[:, None], weight=taps, bias=_f32(bias))
    (y,) = _on_vllms_pool("decode_pool", "causal_conv1d", arrays, pool, rows,
                          pad_value=pad_value, activation="silu" if silu else "identity",
                          state_tap_major=tap_major, weight_tap_major=True)
    return y[:, 0].to(x.dtype)


# ------------------------------------------------------------------------------------------
# Adapters: vLLM CPU's Mamba2 layer (MambaMixer2: Mamba2, FalconH1, GraniteMoeHybrid, NemotronH,
# Zamba2) on linseq's SSD op and its conv
# ------------------------------------------------------------------------------------------

_DT_UNLIMITED = (0.0, float("inf"))   # Mamba2's dt_limit when the layer sets none
_FLOAT32_MAX = 3.4028234663852886e38


def _per_head(t, name, heads, broadcast_dims):
    """A per-head tensor the layer broadcast over its last broadcast_dims dimensions (stride
    0: vLLM's decode expands dt, dt_bias and A to [.., heads, headdim(, dstate)]) as the
    [.., heads] tensor it came from; one whose values differ along them is declined."""
    if t.dim() >= broadcast_dims + 1 and t.shape[t.dim() - broadcast_dims - 1] == heads and \
            all(t.stride(d) == 0 or t.shape[d] == 1
                for d in range(t.dim() - broadcast_dims, t.dim())):
        return t[(Ellipsis,) + (0,) * broadcast_dims]
    raise _Declined(f"{name}: per-channel values (linseq's SSD takes one per head)")


def _ssd_dt_options(dt, dt_bias, dt_softplus, dt_limit):
    """(dt as float32, dt_bias for linseq or None, the SSD options) of vLLM's dt handling:
    dt + dt_bias (added with or without the softplus), softplus with dt_softplus, clamped to
    dt_limit unless it is (0, inf). linseq adds dt_bias only inside the softplus."""
    dt = _f32(dt)
    options = dict(dt_softplus=bool(dt_softplus))
    if dt_bias is not None and not dt_softplus:
        dt, dt_bias = dt + _f32(dt_bias), None
    low, high = (float(v) for v in dt_limit)
    if (low, high) != _DT_UNLIMITED:
        options.update(dt_min=low, dt_max=min(high, _FLOAT32_MAX))
    return dt, _f32(dt_bias), options


def _ssd_skip(D, heads, headdim):
    """vLLM's D ([heads], or [heads, headdim] broadcast or not) as linseq's D and
    D_per_channel."""
    if D is None:
        return None, False
    if D.dim() == 2 and D.shape == (heads, headdim) and D.stride(1) == 0:
        D = D[:, 0]
    if D.shape == (heads,):
        return _f32(D), False
    if D.shape == (heads, headdim):
        return _f32(D), True
    raise ValueError(f"D: expected [{heads}] or [{heads}, {headdim}], got {list(D.shape)}")


def _ssd_chunk_scan(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens,
                    last_chunk_indices, seq_idx, out, D=None, z=None, dt_bias=None,
                    initial_states=None, dt_softplus=False, dt_limit=_DT_UNLIMITED,
                    return_intermediate_states=False, state_dtype=None):
    """vLLM's Mamba2 prefill (mamba_chunk_scan_combined_varlen): x, z [tokens, heads,
    headdim] and dt [tokens, heads] of the prompts packed by cu_seqlens [prompts + 1]; B, C
    [tokens, groups, dstate]; A, dt_bias [heads]; D [heads] or [heads, headdim];
    initial_states [prompts, heads, headdim, dstate] (None: every prompt from zeros; the
    layer gathers them from its pool, zeros for new prompts). The output goes into out
    [tokens, heads, headdim]; returns the final states [prompts, heads, headdim, dstate] in
    state_dtype (x's without it), which the layer writes to its pool; with
    return_intermediate_states (prefix caching in vLLM's align mode) the state after each
    chunk of cu_chunk_seqlens instead, [chunks, heads, headdim, dstate], prompt i's final
    state at last_chunk_indices[i] (vLLM's CPU kernel returns the final states alone there,
    which the layer cannot index). The returned tensor is the pool the library runs on, in
    place, a bfloat16 one included. linseq takes its own chunks within vLLM's (the same
    values within float32 rounding)."""
    import torch
    if x.dim() != 3 or cu_seqlens is None or cu_seqlens.dim() != 1 or out is None:
        raise ValueError(f"x: expected vLLM's packed [tokens, heads, headdim] prompts with "
                         f"cu_seqlens [prompts + 1] and out, got x {list(x.shape)}")
    tokens, heads, headdim = x.shape
    if B.dim() != 3 or B.shape[0] != tokens or C.shape != B.shape or A.shape != (heads,) or \
            out.shape != x.shape:
        raise ValueError(f"B, C: expected [{tokens}, groups, dstate], A [{heads}], out "
                         f"{list(x.shape)}; got B {list(B.shape)}, C {list(C.shape)}, "
                         f"A {list(A.shape)}, out {list(out.shape)}")
    prompts, dstate = cu_seqlens.shape[0] - 1, B.shape[2]
    blocks, n_rows = None, prompts
    rows = torch.arange(prompts, dtype=torch.int64)
    if return_intermediate_states:
        block_rows, computed, rows = _chunk_state_rows(cu_seqlens, cu_chunk_seqlens,
                                                       last_chunk_indices, chunk_size)
        blocks, n_rows = (chunk_size, block_rows, computed), cu_chunk_seqlens.shape[0] - 1
    states = torch.empty(n_rows, heads, headdim, dstate, dtype=state_dtype or x.dtype)
    if initial_states is not None:
        if initial_states.shape != (prompts,) + states.shape[1:]:
            raise ValueError(f"initial_states: expected {[prompts] + list(states.shape[1:])}, "
                             f"got {list(initial_states.shape)}")
        states[rows] = initial_states.to(states.dtype)
    has = torch.full((prompts,), initial_states is not None, dtype=torch.bool)
    dt, bias, options = _ssd_dt_options(dt, dt_bias, dt_softplus, dt_limit)
    skip, per_channel = _ssd_skip(D, heads, headdim)
    arrays = dict(x=_f32(x)[None], dt=dt[None], A=_f32(A), B=_f32(B)[None], C=_f32(C)[None],
                  D=skip, z=None if z is None else _f32(z)[None], dt_bias=bias)
    # float32 products: vLLM's scan computes in float32 and rounds y once, as this does
    if blocks is None:
        (y,) = _on_vllms_pool("forward_pool", "ssd", arrays, states, rows,
                              has_initial_state=has, cu_seqlens=cu_seqlens,
                              D_per_channel=per_channel, **options)
    else:   # the states tensor is this function's own: the library reads it in place
        (y,) = _pool_call("forward_pool_blocks", "ssd", arrays, states, rows,
                          has_initial_state=has, cu_seqlens=cu_seqlens, blocks=blocks,
                          D_per_channel=per_channel, **options)
    out.copy_(y[0])
    return states


def _chunk_state_rows(cu_seqlens, cu_chunk_seqlens, last_chunk_indices, chunk_size):
    """vLLM's chunks (cu_chunk_seqlens [chunks + 1] token offsets; prompt i's chunks end
    at last_chunk_indices[i]) as the library's block boundaries, for the state after each
    chunk. vLLM ends a prompt's chunks at multiples of chunk_size counted from the start of
    its prompt, so every chunk but the first and last is chunk_size long: with block_size =
    chunk_size and computed_tokens[i] = chunk_size - (its first chunk's length) (mod
    chunk_size), the library's boundaries inside the prompt are its chunks' ends. Returns
    (block_rows [prompts, max_blocks], computed_tokens [prompts], final rows [prompts]),
    int64: the state after prompt i's j-th chunk goes to that chunk's row (its index in
    cu_chunk_seqlens), its final state to its last chunk's. Another layout is declined
    (vLLM's function runs)."""
    import torch
    cu, ends, last = (t.tolist() for t in (cu_seqlens, cu_chunk_seqlens, last_chunk_indices))
    if len(last) != len(cu) - 1 or chunk_size < 1:
        raise _Declined("last_chunk_indices: not one per prompt")
    counts, computed, first = [], [], 0
    for i, final in enumerate(last):
        lengths = [ends[c + 1] - ends[c] for c in range(first, min(final, len(ends) - 2) + 1)]
        if not lengths or first + len(lengths) - 1 != final or ends[first] != cu[i] or \
                ends[final + 1] != cu[i + 1] or \
                not all(0 < n <= chunk_size for n in lengths) or \
                any(n != chunk_size for n in lengths[1:-1]):
            raise _Declined(f"cu_chunk_seqlens: prompt {i}'s chunks do not end at multiples "
                            f"of chunk_size {chunk_size} (the layout linseq maps)")
        counts.append(len(lengths))
        computed.append((chunk_size - lengths[0]) % chunk_size)
        first = final + 1
    if first != len(ends) - 1:
        raise _Declined("cu_chunk_seqlens: chunks past the last prompt's")
    block_rows = torch.full((len(last), max([1] + [n - 1 for n in counts])), -1,
                            dtype=torch.int64)
    for i, (n, final) in enumerate(zip(counts, last)):
        block_rows[i, :n - 1] = torch.arange(final - n + 1, final)
    return (block_rows, torch.tensor(computed, dtype=torch.int64),
            torch.tensor(last, dtype=torch.int64))


def _store_prefill_checkpoint(checkpoint, chunk_idx, x, conv_state, chunk_states, ssm_state,
                              query_start_loc, *, state_len):
    """vLLM's store_prefill_checkpoint (the Mamba2 layer's prefix caching in align mode), on
    the CPU, where vLLM's is a Triton kernel its CPU build cannot run: each prefill prompt i
    with a checkpoint (checkpoint.checkpoint_offsets[i] > 0 tokens into this step's part of
    it) keeps, in block checkpoint.state_indices[i], the state_len conv inputs before that
    token (x [dim, tokens] from query_start_loc[i], oldest first) in conv_state's first
    state_len positions ([blocks, dim, >= state_len]) and the SSD state after chunk
    chunk_idx[i] of chunk_states (_ssd_chunk_scan's intermediate states) in ssm_state."""
    import torch
    offsets = checkpoint.checkpoint_offsets.tolist()
    blocks, chunks = checkpoint.state_indices.tolist(), chunk_idx.tolist()
    starts = query_start_loc.tolist()
    for i, offset in enumerate(offsets):
        if offset <= 0:
            continue
        if offset < state_len:   # align mode schedules whole blocks: not reached
            raise ValueError(f"checkpoint_offsets[{i}] = {offset}: expected >= state_len "
                             f"{state_len} (the conv inputs before it are this step's)")
        end = starts[i] + offset
        with torch.no_grad():
            conv_state[blocks[i], :, :state_len] = x[:, end - state_len:end]
            ssm_state[blocks[i]] = chunk_states[chunks[i]].reshape(ssm_state.shape[1:])


def _ssd_state_update(state, x, dt, A, B, C, D=None, dt_bias=None, z=None,
                      dt_softplus=False, state_batch_indices=None,
                      dst_state_batch_indices=None, null_block_id=0, out=None,
                      num_accepted_tokens=None, cu_seqlens=None, **unused):
    """vLLM's Mamba2 decode step (its SSU dispatcher's selective_state_update): one token per
    request over the pool state [slots, heads, headdim, dstate] in place; x, z [batch,
    heads, headdim]; dt [batch, heads(, headdim)], dt_bias [heads(, headdim)] and A
    [heads(, headdim, dstate)] per head (the layer expands them with stride 0); B, C
    [batch, groups, dstate]; D [heads] or [heads, headdim]. Request i reads slot
    state_batch_indices[i] and writes dst_state_batch_indices[i] (null_block_id or
    negative: padding, output 0, no state touched). The output goes into out [batch,
    heads, headdim] (a new tensor in x's dtype without it), returned. Speculative decoding
    (num_accepted_tokens, several tokens per request) is declined."""
    if num_accepted_tokens is not None:
        raise _Declined("num_accepted_tokens: speculative decoding is vLLM's kernel's")
    step = _native_step("vllm_ssd_decode")
    if step is not None and state_batch_indices is not None:
        taken = step(state, x, dt, A, B, C, D, dt_bias, z, bool(dt_softplus),
                     state_batch_indices, dst_state_batch_indices, null_block_id, out,
                     cu_seqlens)
        if taken:
            return taken[0]
    if state.dim() != 4 or x.dim() != 3 or state_batch_indices is None:
        raise _Declined("state: a pool other than [slots, heads, headdim, dstate] with "
                        "[batch, heads, headdim] tokens")
    batch, heads, headdim = x.shape
    if not _one_token_each(cu_seqlens, batch):
        raise _Declined("cu_seqlens: several tokens per request")
    if tuple(state.shape[1:3]) != (heads, headdim) or B.dim() != 3 or B.shape[0] != batch or \
            C.shape != B.shape or B.shape[2] != state.shape[3]:
        raise ValueError(f"state, B, C: expected [slots, {heads}, {headdim}, dstate] and "
                         f"[{batch}, groups, dstate], got state {list(state.shape)}, "
                         f"B {list(B.shape)}, C {list(C.shape)}")
    dt = _per_head(dt, "dt", heads, 1) if dt.dim() == 3 else dt
    A = _per_head(A, "A", heads, 2) if A.dim() == 3 else A
    if dt_bias is not None and dt_bias.dim() == 2:
        dt_bias = _per_head(dt_bias, "dt_bias", heads, 1)
    if dt.shape != (batch, heads) or A.shape != (heads,) or \
            dt_bias is not None and dt_bias.shape != (heads,):
        raise ValueError(f"dt, A, dt_bias: expected [{batch}, {heads}], [{heads}] and "
                         f"[{heads}] (or broadcast over headdim), got dt {list(dt.shape)}, "
                         f"A {list(A.shape)}" + ("" if dt_bias is None else
                                                 f", dt_bias {list(dt_bias.shape)}"))
    src = _rows(state_batch_indices, "state_batch_indices")
    # the layer passes one tensor as both: in place, without a second copy of the slots
    dst = None if dst_state_batch_indices is None or \
        dst_state_batch_indices is state_batch_indices else \
        _rows(dst_state_batch_indices, "dst_state_batch_indices")
    dt, bias, options = _ssd_dt_options(dt, dt_bias, dt_softplus, _DT_UNLIMITED)
    skip, per_channel = _ssd_skip(D, heads, headdim)
    arrays = dict(x=_f32(x)[:, None], dt=dt[:, None], A=_f32(A), B=_f32(B)[:, None],
                  C=_f32(C)[:, None], D=skip, z=None if z is None else _f32(z)[:, None],
                  dt_bias=bias)
    (y,) = _on_vllms_pool("decode_pool", "ssd", arrays, state, src, dst,
                          pad_value=null_block_id, D_per_channel=per_channel, **options)
    if out is None:
        return y[:, 0].to(x.dtype)
    out.copy_(y[:, 0])
    return out


def _silu_from(activation, name="activation"):
    """vLLM's conv activation (None, "silu", "swish", or a bool) as whether to apply silu."""
    if activation in (None, False, True, "silu", "swish"):
        return activation not in (None, False)
    raise ValueError(f"{name}: expected None, 'silu', 'swish' or a bool, got {activation!r}")


def _mixer2_conv_forward(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                         has_initial_state=None, activation="silu", pad_slot_id=-1,
                         **unused):
    """The Mamba2 layer's prefill conv (vLLM's CPU causal_conv1d_fn): x [dim, tokens] of the
    prompts packed by query_start_loc, weight [dim, width] as the layer holds it;
    conv_states [slots, dim, width-1] (any strides); prompt i on slot cache_indices[i]
    (None: slot i; pad_slot_id or negative: padding), from it where has_initial_state[i]
    (None: from zeros). Returns [dim, tokens] in x's dtype."""
    import torch
    if x.dim() != 2 or weight.dim() != 2 or query_start_loc is None:
        raise _Declined("x: a layout other than [dim, tokens] with a [dim, width] weight")
    prompts = query_start_loc.shape[0] - 1
    rows = (torch.arange(prompts, dtype=torch.int32) if cache_indices is None
            else _rows(cache_indices, "cache_indices"))
    return _conv_prefill_on_pool(x, _conv_taps(weight, False), bias, conv_states,
                                 query_start_loc, rows, has_initial_state,
                                 _silu_from(activation),
                                 pad_value=None if pad_slot_id is None or pad_slot_id < 0
                                 else pad_slot_id)


def _mixer2_conv_update(x, conv_state, weight, bias=None, activation=None,
                        conv_state_indices=None, query_start_loc=None, pad_slot_id=None,
                        **kwargs):
    """The Mamba2 layer's decode conv (vLLM's CPU causal_conv1d_update): x [batch, dim] one
    token per request, request i on slot conv_state_indices[i] of conv_state [slots, dim,
    width-1]; padding: pad_slot_id (None: the null_block_id keyword, else vLLM's null
    block) or negative. Speculative decoding (num_accepted_tokens, query_start_loc) is
    declined. Returns [batch, dim] in x's dtype."""
    if kwargs.get("num_accepted_tokens") is not None or query_start_loc is not None:
        raise _Declined("num_accepted_tokens: speculative decoding is vLLM's kernel's")
    if x.dim() != 2 or weight.dim() != 2 or conv_state_indices is None:
        raise _Declined("x: a layout other than [batch, dim] with slot indices")
    if pad_slot_id is None:
        pad_slot_id = kwargs.get("null_block_id")
    if pad_slot_id is None:
        from vllm.v1.attention.backends.utils import NULL_BLOCK_ID
        pad_slot_id = NULL_BLOCK_ID
    return _conv_step(x, conv_state, _conv_taps(weight, False), bias, _silu_from(activation),
                      conv_state_indices, pad_value=pad_slot_id)


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


# vLLM module -> function name -> linseq adapter. The GDN layer (and, for its conv, any CPU
# layer) calls vLLM's CPU ops as attributes of vllm._custom_ops at call time; the Mamba
# layers call the names they imported into their own modules.
# family -> {module: {function: adapter}}
ROUTES = {"mamba1": {_MIXER: {"selective_scan_fn": _selective_scan,
                              "selective_state_update": _state_update}},
          "gdn": {_CUSTOM_OPS: {"chunk_gated_delta_rule_cpu": _chunk_gated_delta_rule,
                                "fused_sigmoid_gating_delta_rule_update_cpu":
                                    _gated_delta_update,
                                "fused_sigmoid_gating_delta_rule_update_spec_cpu":
                                    _gated_delta_update_spec,
                                "causal_conv1d_fwd_cpu": _conv_forward,
                                "causal_conv1d_update_cpu": _conv_update}},
          "mamba2": {_MIXER2: {"mamba_chunk_scan_combined_varlen": _ssd_chunk_scan,
                               "store_prefill_checkpoint": _store_prefill_checkpoint,
                               "selective_state_update": _ssd_state_update,
                               "causal_conv1d_fn": _mixer2_conv_forward,
                               "causal_conv1d_update": _mixer2_conv_update}}}
# What register() routes unless LINSEQ_VLLM names more: the layers vLLM's CPU build cannot
# run. The GDN and Mamba2 routes replace ops vLLM runs itself: a choice, LINSEQ_VLLM=all,
# gdn or mamba2 (the GDN route is exact in float32 where vLLM's ops run in bfloat16, at
# vLLM's decode tokens/s on the small models measured; the Mamba2 route faster there,
# docs/performance.md).
DEFAULT_FAMILIES = ("mamba1",)


def families_from(value):
    """The families a LINSEQ_VLLM value names: unset, "1" or "on": DEFAULT_FAMILIES; "0",
    "off", "false" or "no": none; "all": every family of ROUTES; else a comma-separated list
    of family names (an unknown name is refused by name)."""
    value = (value or "1").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return DEFAULT_FAMILIES
    if value in ("0", "off", "false", "no"):
        return ()
    if value == "all":
        return tuple(ROUTES)
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in ROUTES]
    if unknown:
        raise ValueError(f"{OPT_OUT_VARIABLE}: unknown family {unknown[0]!r}; expected 0, 1, "
                         f"all or a comma-separated list of {', '.join(ROUTES)}")
    return names


# ------------------------------------------------------------------------------------------
# Rebinding
# ------------------------------------------------------------------------------------------

_outside = {}     # (module, name) -> vLLM's function, found there before linseq's went in
_installed = {}   # (module, name) -> the routed function linseq put there


def _routed(adapter, original, qualified):
    """The function installed: the adapter for a call whose tensors are all on the CPU,
    vLLM's function for any other, and for one the adapter declines. The check and the
    adapter run with tensor subclasses' __torch_function__ off: vLLM's parameters
    (BasevLLMParameter) override it only to pass each call on, yet that makes every read of
    one (its device, version, shape) a Python call, 5-10 us of a decode call in a serving
    step; vLLM's function, where it runs, runs as called."""
    import torch

    tensor, plain = torch.Tensor, torch._C.DisableTorchFunctionSubclass

    def on_cpu(values):
        for t in values:
            if isinstance(t, tensor) and not t.is_cpu:
                return False
        return True

    @functools.wraps(original)
    def routed(*args, **kwargs):
        with plain():
            if on_cpu(args) and on_cpu(kwargs.values()):
                try:
                    return adapter(*args, **kwargs)
                except _Declined as declined:
                    _log.debug("linseq: %s declined: %s", qualified, declined)
        return original(*args, **kwargs)
    routed.linseq_route = qualified
    return routed


def _takes_as_given(adapter, original):
    """True when every parameter the adapter names is one vLLM's function has, at the same
    position (a vLLM release that changed a signature is skipped, not miscalled)."""
    ours = [p.name for p in inspect.signature(adapter).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD]
    theirs = list(inspect.signature(inspect.unwrap(original)).parameters)
    return theirs[:len(ours)] == ours


def enable(families=DEFAULT_FAMILIES):
    """Route the layers of `families` (names of ROUTES, or "all") to linseq: "mamba1" vLLM's
    Mamba1 scan and decode step, "gdn" its CPU GDN and conv ops, "mamba2" the Mamba2 layer's
    scan, decode step and conv (idempotent; other families are left as they are). Returns
    the "module.function" names routed; a module or function this vLLM lacks, or whose
    signature changed, is skipped (logged at debug level)."""
    families = families_from(families) if isinstance(families, str) else tuple(families)
    unknown = [f for f in families if f not in ROUTES]
    if unknown:
        raise ValueError(f"families: unknown family {unknown[0]!r}; expected names of "
                         f"{', '.join(ROUTES)}")
    routed = []
    for module_name, functions in _routes_of(families):
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
    if "mamba1" in families and routed and _register_layer():
        routed.append(f"{_MIXER}.MambaMixer.out_proj (pre-hook)")
    return tuple(routed)


def _routes_of(families):
    """(module, {function: adapter}) of each family in turn."""
    return [(module, functions) for family in families
            for module, functions in ROUTES[family].items()]


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
    (more than once is harmless). Routes the families LINSEQ_VLLM names (families_from:
    by default Mamba1's; LINSEQ_VLLM=0 leaves vLLM's functions in place)."""
    families = families_from(os.environ.get(OPT_OUT_VARIABLE))
    if not families:
        _log.info("linseq: %s=0, vLLM's layers left as they are", OPT_OUT_VARIABLE)
        return ()
    routed = enable(families)
    _log.info("linseq: routed %s", ", ".join(routed) or "nothing (no Mamba or GDN op found)")
    return routed
