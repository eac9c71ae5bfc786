"""fla-core's KDA, Gated DeltaNet and gated linear attention functions, with fla's
signatures, on linseq's kernels.

    from linseq.compat.fla import (chunk_kda, fused_recurrent_kda, chunk_gated_delta_rule,
                                   fused_recurrent_gated_delta_rule)

replaces `from fla.ops.kda import ...` and `from fla.ops.gated_delta_rule import ...`
(and fused_kda_gate, fused_gdn_gate replace the gate helpers of fla.ops.kda.gate and
fla.ops.gated_delta_rule.gate, on linseq's gate op; fused_recurrent_kda_fwd is the forward of
fla.ops.kda.fused_recurrent that serving code calls for decode, with its state pool
(ssm_state_indices, num_accepted_tokens) and in-place final state):
same positional order, defaults and keyword arguments, same return values (the output in
q's dtype from the chunked functions and in v's dtype from the recurrent ones, the final
state float32), on CPU tensors (NumPy and JAX arrays work too). Unlike fla's, the recurrent
functions have a backward (linseq's exact one). linseq.chunk_kda and
linseq.fused_recurrent_kda are these same functions: they live in linseq._fla_signatures
(over linseq._delta_rule's computation), which this module exports.

The gated linear attention functions (chunk_gla, fused_recurrent_gla, chunk_simple_gla,
fused_recurrent_simple_gla) replace fla.ops.gla's and fla.ops.simple_gla's; they run the same
C op without the delta rule (linseq._fla_gla), and GLA_ARGUMENTS lists their arguments.

Every fla argument is honoured, accepted because it does not change the result, or refused
with an error that names it; `ARGUMENTS` lists which, and why. How the options fla's kernels
have and linseq's C kernel lacks are reached (allow_neg_eigval, per value channel beta and
decay, per head decay with gk, return_intermediate_states) is said once, in
linseq._delta_rule.
"""

from .._fla_gla import ARGUMENTS as GLA_ARGUMENTS
from .._fla_gla import chunk_gla, chunk_simple_gla, fused_recurrent_gla, fused_recurrent_simple_gla
from .._fla_signatures import (ARGUMENTS, chunk_gated_delta_rule, chunk_gdn, chunk_kda,
                               fused_gdn_gate, fused_kda_gate, fused_recurrent_gated_delta_rule,
                               fused_recurrent_gdn, fused_recurrent_kda,
                               fused_recurrent_kda_fwd)
from .._fla_signatures import _recurrent_token_step  # noqa: F401 (the transformers adapters')

__all__ = ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd",
           "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn",
           "fused_recurrent_gdn",
           "fused_kda_gate", "fused_gdn_gate", "ARGUMENTS",
           "chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "fused_recurrent_simple_gla",
           "GLA_ARGUMENTS"]
