"""The options of each op as a frozen value, checked when it is made: what a front end passes
to a backend beside the arrays, hashable (JAX caches a function per option set) and
comparable (torch custom ops take its fields as schema arguments).

Each class builds its op's NumPy inputs object (ops.KdaInputs, ...) over arrays given as a
dict by the op table's input names: inputs(arrays, cu_seqlens, bf16=False), bf16=True where
the call may keep bfloat16 storage (KDA's inference forward and decode); run() gives the
call's exec settings (ops.make_exec(**opts.exec_settings()))."""

import dataclasses
import sys
from typing import Optional

from . import ops


@dataclasses.dataclass(frozen=True)
class KdaOptions:
    scale: Optional[float] = None
    qk_l2norm: bool = False
    beta_is_logit: bool = False
    state_v_first: bool = False
    gate_in_kernel: bool = False
    lower_bound: Optional[float] = None
    mode: str = "chunked"
    chunk_size: int = 64
    # a permission for the chunked forward to run the output's products, and the chunked
    # backward those of the per-token gradients, on bf16 operands (exec->products,
    # include/linseq.h); every other call computes as without it
    bf16_products: bool = False

    def __post_init__(self):
        # refused here, before any framework sees them, and kept as the float32 the library
        # reads (a JAX scalar becomes a Python float)
        object.__setattr__(self, "scale", ops.scale_option(self.scale))
        object.__setattr__(self, "lower_bound", ops.lower_bound_option(self.lower_bound))
        ops.make_exec(self.mode, self.chunk_size)

    def inputs(self, arrays, cu_seqlens, bf16=False):
        """ops.KdaInputs over NumPy-convertible arrays (a dict by the table's input names).
        bf16=True (the inference forward and decode) keeps bfloat16 storage when
        ops.kda_bf16_storage says so."""
        a = arrays
        return ops.KdaInputs(a["q"], a["k"], a["v"], a["beta"], a["g"], h0=a["h0"],
                             cu_seqlens=cu_seqlens, scale=self.scale, qk_l2norm=self.qk_l2norm,
                             beta_is_logit=self.beta_is_logit, state_v_first=self.state_v_first,
                             gate_in_kernel=self.gate_in_kernel, A_log=a["A_log"],
                             dt_bias=a["dt_bias"], lower_bound=self.lower_bound, bf16=bf16)

    def exec_settings(self):
        """The exec settings of the call: keywords of ops.make_exec and of the ops
        functions."""
        return {"mode": self.mode, "chunk_size": self.chunk_size,
                "bf16_products": bool(self.bf16_products)}


@dataclasses.dataclass(frozen=True)
class Ssm1Options:
    activation: Optional[str] = None   # a name of ops.ACTIVATIONS; None = silu
    dt_softplus: bool = False
    channel_first: bool = False        # x, dt, gate [B,D,T], B and C [B,(G,)N,T] (mamba-ssm's)

    def inputs(self, arrays, cu_seqlens, bf16=False):
        a = arrays
        return ops.Ssm1Inputs(a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], gate=a["gate"],
                              h0=a["h0"], cu_seqlens=cu_seqlens, dt_softplus=self.dt_softplus,
                              dt_bias=a["dt_bias"], activation=self.activation,
                              channel_first=self.channel_first)

    def exec_settings(self):
        return {}


@dataclasses.dataclass(frozen=True)
class ConvOptions:
    activation: Optional[str] = None   # None = identity
    channel_first: bool = False        # x and y [B,D,T] (causal-conv1d's)

    def inputs(self, arrays, cu_seqlens, bf16=False):
        a = arrays
        return ops.Conv1dInputs(a["x"], a["weight"], a["bias"], conv_state=a["conv_state"],
                                cu_seqlens=cu_seqlens, activation=self.activation,
                                channel_first=self.channel_first)

    def exec_settings(self):
        return {}


@dataclasses.dataclass(frozen=True)
class GateOptions:
    lower_bound: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "lower_bound", ops.lower_bound_option(self.lower_bound))

    def inputs(self, arrays, cu_seqlens=None, bf16=False):
        return ops.GateInputs(arrays["g_raw"], arrays["A_log"], arrays["dt_bias"],
                              self.lower_bound)

    def exec_settings(self):
        return {}


def kernel_activation(act_fn):
    """The in-kernel activation name for a known framework activation (None: silu), else
    None (the caller then applies act_fn itself)."""
    if act_fn is None:
        return "silu"
    if isinstance(act_fn, str):
        name = act_fn.lower()
        if name not in ops.ACTIVATIONS:
            # "gelu" alone is refused: torch's default is the erf form, jax's the tanh one
            raise ValueError(f"act_fn: expected a callable or one of {sorted(ops.ACTIVATIONS)}"
                             f", got {act_fn!r}")
        return name
    torch = sys.modules.get("torch")
    if torch is not None:
        fn = torch.nn.functional
        table = {fn.silu: "silu", torch.sigmoid: "sigmoid", fn.sigmoid: "sigmoid",
                 torch.relu: "relu", fn.relu: "relu"}
        if act_fn in table:
            return table[act_fn]
        mods = {torch.nn.SiLU: "silu", torch.nn.Sigmoid: "sigmoid", torch.nn.ReLU: "relu"}
        if type(act_fn) in mods:
            return mods[type(act_fn)]
        if isinstance(act_fn, torch.nn.GELU) and act_fn.approximate == "tanh":
            return "gelu_tanh"
    jax = sys.modules.get("jax")
    if jax is not None:
        # jax.nn.gelu's default is the tanh approximation, the kernel's gelu
        table = {jax.nn.silu: "silu", jax.nn.swish: "silu", jax.nn.sigmoid: "sigmoid",
                 jax.nn.relu: "relu", jax.nn.gelu: "gelu_tanh"}
        try:
            if act_fn in table:
                return table[act_fn]
        except TypeError:  # unhashable callable
            return None
    return None
