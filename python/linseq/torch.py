"""PyTorch front end: the public functions bound to PyTorch, with torch.autograd and
torch.compile support.

Each function is linseq's (api) with every call sent to the PyTorch backend (_torch_backend):
every op is a torch.library custom op with a fake implementation and its autograd registered,
so `loss.backward()` reaches linseq's C backward and torch.compile(fullgraph=True) traces the
functions without a graph break (each runs as a non-strict traced block, where the custom ops
are what lands in the graph). Tensors must be on the CPU; contiguous float32 tensors reach the
kernels without a copy. `run` is the one generic entry the others are written over: any op of
the library's table by name, its arrays by the table's names, its options as keywords.
"""

import functools

import torch

from . import _torch_ops, api
from ._backends import bind_framework
from ._compile_blocks import bind_torch, nonstrict_trace
from ._options import kernel_activation
from ._torch_backend import TorchBackend

_NONSTRICT_TRACE = nonstrict_trace(torch) if _torch_ops.AVAILABLE else None


def _public(fn):
    """A public function of api bound to this backend. Under torch.compile, Dynamo does not
    trace its Python (the checks of the options build ctypes structs, the backend is
    imported by name): it runs as a non-strict traced block, where the custom ops are what
    lands in the graph, so there is no graph break."""
    bound = bind_framework("torch", fn)
    return _NONSTRICT_TRACE(bound) if _NONSTRICT_TRACE else bound


run = _public(api.run)
kda = _public(api.kda)
kernel_delta_attention = _public(api.kernel_delta_attention)
kda_decay = _public(api.kda_decay)
chunk_kda = _public(api.chunk_kda)
fused_recurrent_kda = _public(api.fused_recurrent_kda)
kda_decode = _public(api.kda_decode)
causal_conv1d = _public(api.causal_conv1d)
_state_space_v1 = _public(api.state_space_v1)
_state_space_v2 = _public(api.state_space_v2)
_ssv2_scan = _public(api._ssv2_scan)


@functools.wraps(api.state_space_v1)
def state_space_v1(hidden_states, A, B, C, D, dt, gate=None, initial_state=None,
                   conv_state=None, act_fn=None, **kwargs):
    args = (hidden_states, A, B, C, D, dt)
    if act_fn is None or isinstance(act_fn, str) or not _compiling():
        return _state_space_v1(*args, gate, initial_state, conv_state, act_fn, **kwargs)
    # under torch.compile a callable cannot enter the non-strict block: a function the
    # kernel knows goes in by its name, any other is applied here, in the traced graph
    # (without a gate act_fn is not used)
    name = kernel_activation(act_fn) if gate is not None else "silu"
    if name is not None:
        return _state_space_v1(*args, gate, initial_state, conv_state, name, **kwargs)
    y, h, conv_state = _state_space_v1(*args, None, initial_state, conv_state, None, **kwargs)
    y = y * act_fn(gate)
    return TorchBackend.cast(y, hidden_states), h, conv_state


@functools.wraps(api.state_space_v2)
def state_space_v2(x, A, B, C, D, dt, gate=None, initial_state=None, conv_state=None,
                   n_groups=1, act_fn=None, use_gated_rmsnorm=False, rmsnorm_eps=1e-5,
                   precision=None, **kwargs):
    args = (x, A, B, C, D, dt, gate, initial_state, conv_state, n_groups)
    options = dict(use_gated_rmsnorm=use_gated_rmsnorm, rmsnorm_eps=rmsnorm_eps, **kwargs)
    if not _compiling():
        return _state_space_v2(*args, act_fn, precision=precision, **options)
    # under torch.compile a callable (or a matmul precision, which is ignored) cannot enter
    # the non-strict block: silu goes in by its name; any other gate is applied here, in the
    # traced graph (without a gate act_fn is not used)
    act = api._ssv2_activation(act_fn)
    if gate is None or act == "silu":
        return _state_space_v2(*args, "silu", **options)
    for name in set(kwargs) - {"platform", "cfg"}:
        raise TypeError(f"state_space_v2() got an unexpected keyword argument {name!r}")
    api._ssv2_check_options(kwargs.get("platform"), rmsnorm_eps)
    y, h = _ssv2_scan(x, A, B, C, D, dt, gate, initial_state, n_groups, False)
    y = api._ssv2_gate(y, gate, act, use_gated_rmsnorm, rmsnorm_eps, TorchBackend)
    return TorchBackend.cast(y, x), TorchBackend.cast(h, x), conv_state


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return bool(compiler and hasattr(compiler, "is_compiling") and compiler.is_compiling())


# The functions that take arrays of any framework (linseq.chunk_kda, linseq.compat.fla's),
# defined before torch was imported, become compilable blocks now (or at their first call)
bind_torch(torch)
