"""linseq as a Hugging Face `kernels` build (made by tools/kernels/build.py).

The functions of the packages that linear-attention and state-space models import, under
their own names, running on linseq's C kernels (CPU, PyTorch tensors):

    fla            chunk_kda, fused_recurrent_kda, chunk_gated_delta_rule,
                   fused_recurrent_gated_delta_rule
    mamba-ssm      selective_scan_fn, selective_state_update, mamba_inner_fn
    causal-conv1d  causal_conv1d_fn, causal_conv1d_update, causal_conv1d_varlen_states
    Trainium KDA   the names of linseq.compat.neuron (kda_chunk_step_exact, ...)

Each name is linseq.compat's function itself: this module only gathers them. `kernels` imports
this build under its own module name, so the linseq package inside (_linseq, with its
liblinseq.so) never meets an installed `linseq`: its PyTorch custom ops live in a namespace of
their own (OPS_NAMESPACE), and its library is the one beside it unless LINSEQ_LIBRARY names
another, as for the package.
"""

from ._linseq import version as _version
from ._linseq import _torch_ops
from ._linseq.compat import neuron as _neuron
from ._linseq.compat.causal_conv1d import (causal_conv1d_fn, causal_conv1d_update,
                                           causal_conv1d_varlen_states)
from ._linseq.compat.fla import (chunk_gated_delta_rule, chunk_kda,
                                 fused_recurrent_gated_delta_rule, fused_recurrent_kda)
from ._linseq.compat.mamba_ssm import mamba_inner_fn, selective_scan_fn, selective_state_update

__version__ = _version()
OPS_NAMESPACE = _torch_ops.NAMESPACE

globals().update({name: getattr(_neuron, name) for name in _neuron.__all__})

__all__ = ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
           "fused_recurrent_gated_delta_rule", "selective_scan_fn", "selective_state_update",
           "mamba_inner_fn", "causal_conv1d_fn", "causal_conv1d_update",
           "causal_conv1d_varlen_states", *_neuron.__all__]
