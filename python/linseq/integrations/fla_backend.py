"""linseq as a backend of fla-core's kernel dispatch (fla.backends), for CPU tensors.

fla-core routes some of its entry points through `fla.backends.dispatch`: before running its
own (Triton, GPU-only) kernels it asks each registered backend, in priority order, whether
it takes the call. After `register()`, linseq's backend takes every call whose tensors are
all on the CPU and runs it on linseq.compat.fla (no math here); any other call (CUDA, NPU,
meta tensors, fla's own context parallelism) is declined and reaches fla's kernels as before.

    import linseq.integrations.fla_backend as fla_backend
    fla_backend.register()
    from fla.ops.kda import chunk_kda          # CPU tensors now run on linseq

The dispatched entry points fla-core 0.6 has, and what takes them here:

    fla.ops.kda.chunk_kda                           (its own registry)   chunk_kda
    fla.ops.kda.fused_recurrent_kda -> fused_recurrent_kda_fwd  ('kda')  fused_recurrent_kda_fwd
    fla.ops.kda.gate.fused_kda_gate                 ('kda')              fused_kda_gate
    fla.ops.gated_delta_rule.chunk_gated_delta_rule ('gated_delta_rule') chunk_gated_delta_rule

fla's fused_recurrent_gated_delta_rule is not dispatched in fla-core 0.6 (it calls its Triton
kernel directly), so it cannot be taken over here: call linseq.compat.fla's of the same name.
Where fla-core is installed, transformers (5.2x) binds Kimi Linear's and Qwen3-Next's kernel
functions to fla's at import, so after `register()` those models' KDA steps and Gated DeltaNet
chunks run here on the CPU too. Set FLA_LINSEQ=0 to switch the backend off without
unregistering it. `calls` counts the calls the backend took, by function name.
"""

import collections

BACKEND_TYPE = "linseq"

calls = collections.Counter()

# fla's arguments that are its own GPU machinery: a call that sets one is left to fla
_GRAPH_KEYWORDS = ("use_graph", "max_num_seqs")

_backend_class = None


def _tensors(args, kwargs):
    import torch
    return [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


def _on_cpu(args, kwargs):
    """(accepted, reason) for fla's verifier protocol: every tensor argument on the CPU."""
    devices = sorted({t.device.type for t in _tensors(args, kwargs)})
    if devices != ["cpu"]:
        return False, f"linseq runs CPU tensors only, got tensors on {devices}"
    return True, None


def _make_backend_class():
    from fla.backends import BaseBackend

    from ..compat import fla as compat

    class LinseqBackend(BaseBackend):
        """fla's entry points on linseq.compat.fla, for calls with CPU tensors only."""

        backend_type = BACKEND_TYPE
        env_var = "FLA_LINSEQ"
        # before every GPU backend: it declines all but CPU tensors, so it never takes
        # their calls
        priority = 1

        # -- chunk_kda ---------------------------------------------------------------------
        def chunk_kda_verifier(self, *args, **kwargs):
            if kwargs.get("cp_context") is not None:
                return False, "fla's cp_context is fla's own context parallelism"
            if kwargs.get("use_graph"):
                return False, "use_graph is CUDA/NPU graph capture"
            return _on_cpu(args, kwargs)

        def chunk_kda(self, *args, **kwargs):
            calls["chunk_kda"] += 1
            for name in _GRAPH_KEYWORDS:
                kwargs.pop(name, None)
            return compat.chunk_kda(*args, **kwargs)

        # -- fused_recurrent_kda (its forward, which fla dispatches) ----------------------
        def fused_recurrent_kda_fwd_verifier(self, *args, **kwargs):
            return _on_cpu(args, kwargs)

        def fused_recurrent_kda_fwd(self, *args, **kwargs):
            calls["fused_recurrent_kda"] += 1
            return compat.fused_recurrent_kda_fwd(*args, **kwargs)

        # -- fused_kda_gate -----------------------------------------------------------------
        def fused_kda_gate_verifier(self, *args, **kwargs):
            return _on_cpu(args, kwargs)

        def fused_kda_gate(self, *args, **kwargs):
            calls["fused_kda_gate"] += 1
            return compat.fused_kda_gate(*args, **kwargs)

        # -- chunk_gated_delta_rule -----------------------------------------------------------
        def chunk_gated_delta_rule_verifier(self, *args, **kwargs):
            if kwargs.get("cp_context") is not None:
                return False, "fla's cp_context is fla's own context parallelism"
            return _on_cpu(args, kwargs)

        def chunk_gated_delta_rule(self, *args, **kwargs):
            calls["chunk_gated_delta_rule"] += 1
            return compat.chunk_gated_delta_rule(*args, **kwargs)

    return LinseqBackend


def register():
    """Registers linseq's backend with fla's dispatch for the entry points above; calling
    it again changes nothing (fla keeps one backend per type and entry point). Needs fla-core
    (ImportError otherwise). Returns the backend class."""
    global _backend_class
    from fla import backends
    from fla.ops.kda import chunk as kda_chunk

    if _backend_class is None:
        _backend_class = _make_backend_class()
    for entry_point in (kda_chunk.chunk_kda, "kda", "gated_delta_rule"):
        backends.register(entry_point)(_backend_class)
    return _backend_class
