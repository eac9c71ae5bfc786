"""Drop-in surfaces: the functions other kernel libraries export, with their names, argument
order, defaults, layouts and return values, running on linseq's kernels.

    linseq.compat.fla            fla-core: chunk_kda, fused_recurrent_kda,
                                 chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    linseq.compat.mamba_ssm      mamba-ssm: selective_scan_fn, selective_state_update,
                                 mamba_inner_fn
    linseq.compat.mamba_ssd      mamba-ssm's Mamba2: mamba_chunk_scan_combined,
                                 mamba_split_conv1d_scan_combined
    linseq.compat.causal_conv1d  causal-conv1d: causal_conv1d_fn, causal_conv1d_update,
                                 causal_conv1d_varlen_states
    linseq.compat.neuron         the Trainium KDA package's function names
    linseq.compat.ejkernel       ejkernel's module-level signatures

Replacing the peer's import with linseq's is the whole change a caller makes; README's
"Drop-in surfaces" table says what differs. Each sub-module is a thin layer over linseq's C
entry points: no math is implemented twice. The sub-modules are imported on demand.
"""
