"""fla-core's KDA and Gated DeltaNet functions, with fla's signatures, on linseq's kernels.

    from linseq.compat.fla import (chunk_kda, fused_recurrent_kda, chunk_gated_delta_rule,
                                   fused_recurrent_gated_delta_rule)

replaces `from fla.ops.kda import ...` and `from fla.ops.gated_delta_rule import ...`
(and fused_kda_gate, fused_gdn_gate replace the gate helpers of fla.ops.kda.gate and
fla.ops.gated_delta_rule.gate, on linseq's gate op):
same positional order, defaults and keyword arguments, same return values (the output in
q's dtype from the chunked functions and in v's dtype from the recurrent ones, the final
state float32), on CPU tensors (NumPy and JAX arrays work too). Unlike fla's, the recurrent
functions have a backward (linseq's exact one). linseq.chunk_kda and
linseq.fused_recurrent_kda are these same functions: they live in linseq._fla_signatures
(over linseq._delta_rule's computation), which this module exports.

Every fla argument is honoured, accepted because it does not change the result, or refused
with an error that names it; `ARGUMENTS` below lists which, and why. How the options fla's
kernels have and linseq's C kernel lacks are reached:

- allow_neg_eigval: beta is 2 * sigmoid(logit), computed before the kernel in the caller's
  framework (so its gradient is the framework's).
- Per value channel beta [B,T,HV,V] and GDN's per value channel decay gv [B,T,HV,V]: each
  value channel of a delta rule is a delta rule of its own, so the problem runs as HV*V value
  heads of size 1 (decay g + gv_j per head, or g + gk + gv_j per key channel), and is folded
  back. Token by token that is the plain problem's arithmetic; in chunks the in-chunk work
  grows V times (every value head of size 1 has its own chunk matrices). With a per key
  channel decay (KDA's g, GDN's gk) the expanded decay is a [B,T,HV*V,K] array, V times
  the size of gk.
- A per head decay together with gk (GDN's recurrent g and gk): their sum is the per channel
  decay; with use_gate_in_kernel the gate is linseq's gate op (kda_decay) before the sum.
- return_intermediate_states (chunk_kda): the state at the start of every chunk, each sequence
  run chunk by chunk from its initial state (one more forward, in pieces); no gradient, as
  in fla.
"""

from .._fla_signatures import (ARGUMENTS, chunk_gated_delta_rule, chunk_gdn, chunk_kda,
                               fused_gdn_gate, fused_kda_gate, fused_recurrent_gated_delta_rule,
                               fused_recurrent_gdn, fused_recurrent_kda)

__all__ = ["chunk_kda", "fused_recurrent_kda", "chunk_gated_delta_rule",
           "fused_recurrent_gated_delta_rule", "chunk_gdn", "fused_recurrent_gdn",
           "fused_kda_gate", "fused_gdn_gate", "ARGUMENTS"]
