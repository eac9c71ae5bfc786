"""Each reference case as a call of the public API, in NumPy, PyTorch or JAX.

`run(case, framework, variant)` returns every output and gradient of the case, computed
the way a user of that framework would: the forward through the seed-style function, the
gradients through linseq.ops (NumPy), loss.backward() (PyTorch) or jax.vjp under jax.jit.
"""

import numpy as np

import linseq
from linseq import ops


def _gla_call(case, variant):
    """A KDA case without beta: fla's GLA (decay per channel) or simple GLA (per head)."""
    from linseq.compat import fla
    m = case.meta
    scale = None if m.get("scale_is_default", True) else m["scale"]
    cu = case.get("cu_seqlens")
    per_channel = m["decay"] == "per_channel"

    def fn(q, k, v, g, h0=None):
        if variant == "chunked":
            f = fla.chunk_gla if per_channel else fla.chunk_simple_gla
        else:
            f = fla.fused_recurrent_gla if per_channel else fla.fused_recurrent_simple_gla
        return f(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True,
                 cu_seqlens=cu)

    def numpy_grads(inputs, upstream):
        kin = ops.KdaInputs(inputs["q"], inputs["k"], inputs["v"], None, inputs["g"],
                            h0=inputs.get("h0"), cu_seqlens=cu, scale=scale)
        return ops.kda_backward(kin, upstream["d_o"], upstream.get("d_ht"), mode=variant)

    return (["q", "k", "v", "g", "h0"], fn, ["o", "ht"], ["d_o", "d_ht"], numpy_grads)


def _kda_call(case, variant):
    m = case.meta
    if "beta" not in m["inputs"]:
        return _gla_call(case, variant)
    scale = None if m.get("scale_is_default", True) else m["scale"]
    l2 = m["use_qk_l2norm"]
    cu = case.get("cu_seqlens")

    def fn(q, k, v, beta, g, h0=None):
        if variant == "ejkernel":
            return linseq.kda(q, k, v, beta, g, softmax_scale=scale, initial_state=h0,
                              use_qk_l2norm=l2)
        f = linseq.chunk_kda if variant == "chunked" else linseq.fused_recurrent_kda
        return f(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                 use_qk_l2norm_in_kernel=l2, cu_seqlens=cu)

    def numpy_grads(inputs, upstream):
        mode = "recurrent" if variant == "recurrent" else "chunked"
        kin = ops.KdaInputs(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], inputs["g"],
                            h0=inputs.get("h0"), cu_seqlens=cu, scale=scale, qk_l2norm=l2)
        return ops.kda_backward(kin, upstream["d_o"], upstream.get("d_ht"), mode=mode)

    return (["q", "k", "v", "beta", "g", "h0"], fn, ["o", "ht"], ["d_o", "d_ht"], numpy_grads)


def _ssm1_call(case, variant):
    def fn(x, A, B, C, D, dt, gate=None, h0=None):
        y, h, _ = linseq.state_space_v1(x, A, B, C, D, dt, gate=gate, initial_state=h0)
        return y, h

    def numpy_grads(inputs, upstream):
        sin = ops.Ssm1Inputs(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"],
                             inputs["D"], gate=inputs.get("gate"), h0=inputs.get("h0"))
        return ops.ssm1_backward(sin, upstream["d_y"], upstream.get("d_hT"))

    return (["x", "A", "B", "C", "D", "dt", "gate", "h0"], fn, ["y", "hT"], ["d_y", "d_hT"],
            numpy_grads)


def _conv_call(case, variant):
    act = case.meta["activation"]

    def fn(x, weight, bias=None, conv_state=None):
        return linseq.causal_conv1d(x, weight, bias, activation=act, conv_state=conv_state)

    def numpy_grads(inputs, upstream):
        cin = ops.Conv1dInputs(inputs["x"], inputs["weight"], inputs.get("bias"),
                               conv_state=inputs.get("conv_state"), activation=act)
        return ops.conv1d_backward(cin, upstream["d_y"])

    return (["x", "weight", "bias", "conv_state"], fn, ["y", "conv_state_out"], ["d_y", None],
            numpy_grads)


def _gate_call(case, variant):
    lb = case.meta.get("lower_bound")

    def fn(g_raw, A_log, dt_bias):
        return (linseq.kda_decay(g_raw, A_log, dt_bias, lower_bound=lb),)

    def numpy_grads(inputs, upstream):
        gin = ops.GateInputs(inputs["g_raw"], inputs["A_log"], inputs["dt_bias"], lb)
        return ops.kda_gate_backward(gin, upstream["d_g"])

    return (["g_raw", "A_log", "dt_bias"], fn, ["g"], ["d_g"], numpy_grads)


CALLS = {"kda": _kda_call, "ssm1": _ssm1_call, "causal_conv1d": _conv_call,
         "kda_gate": _gate_call}


def supported(meta):
    """Whether the calls above express the case: the generated cases (tests/refgen) also
    cover options these framework-style signatures do not take (GVA, V-first states, beta
    logits, the in-kernel gate, no decay, SSM1 groups and in-kernel softplus, other gate
    activations, packed SSM1 and conv sequences, a gradient at an absent initial state or
    through the final conv state); the C tests run those."""
    op, m = meta["op"], meta
    inputs, grads = set(m["inputs"]), set(m.get("grads", []))
    at_absent = {"dh0": "h0", "dconv_state": "conv_state", "dA_log": "A_log",
                 "ddt_bias": "dt_bias"}
    if any(g in grads and i not in inputs for g, i in at_absent.items()):
        return False
    if op == "kda" and "beta" not in inputs:  # gated linear attention: fla's signatures
        return (m.get("decay") in ("per_channel", "per_head") and not m["use_qk_l2norm"] and
                (m.get("HV") or m["H"]) == m["H"] and not m.get("state_v_first") and
                not m.get("gate_in_kernel"))
    if op == "kda":
        return (m.get("decay") in ("per_channel", "per_head") and
                (m.get("HV") or m["H"]) == m["H"] and not m.get("state_v_first") and
                not m.get("beta_is_logit") and not m.get("gate_in_kernel"))
    if op == "ssm1":
        return (not m.get("G") and not m.get("dt_softplus") and "D" in inputs and
                "cu_seqlens" not in inputs and
                (m.get("gate_activation") or m.get("activation") or "silu") == "silu")
    if op == "causal_conv1d":
        return ("cu_seqlens" not in inputs and "d_conv_state_out" not in m["upstream_grads"]
                and m.get("activation") in (None, "silu"))
    return True

# the gradient file of each input
GRAD_NAME = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg", "h0": "dh0",
             "x": "dx", "A": "dA", "B": "dB", "C": "dC", "D": "dD", "dt": "ddt",
             "gate": "dgate", "weight": "dweight", "bias": "dbias",
             "conv_state": "dconv_state", "g_raw": "dg_raw", "A_log": "dA_log",
             "dt_bias": "ddt_bias"}


def frameworks(op):
    """The frameworks a case of op runs in: every one through an op's own front end; NumPy
    alone through linseq.ops.run, the path of an op of the table that has none (the
    template EMA, forward-only)."""
    return ["numpy", "torch", "jax"] if op in CALLS else ["numpy"]


def _table_run(case):
    """A case of an op without a front end of its own, through linseq.ops.run: the table's
    inputs by name, its options from meta.json's keys that name one of the op's options."""
    op = case.meta["op"]
    desc = linseq._lib.op_desc(op)
    keys = {o["key"] for o in desc["options"]}
    options = {k: v for k, v in case.meta.items() if k in keys and v is not None}
    # the sizes meta.json gives (G is not in a plain dims text: B [B,T,G,N] or [B,T,N])
    sizes = {s["name"]: case.meta[s["name"]] for s in desc["sizes"] if s["name"] in case.meta}
    arrays = {n: case.get(n) for n in case.meta["inputs"] if n != "cu_seqlens"}
    cu = case.get("cu_seqlens") if "cu_seqlens" in case.meta["inputs"] else None
    outs = linseq.ops.run(op, arrays, sizes, cu_seqlens=cu, **options)
    names = [t["name"] for t in desc["tensors"] if t["role"] == "output"]
    result = {n: o for n, o in zip(names, outs) if n in case}
    if case.meta.get("grads"):  # an op with a backward and no front end: the table's backward
        grads = linseq.ops.backward(op, arrays,
                                    {n: case.get(n) for n in case.meta["upstream_grads"]},
                                    sizes, cu_seqlens=cu, **options)
        result.update({n: g for n, g in grads.items() if n in case})
    return result


def run(case, framework, variant):
    """{name: NumPy array} for every output and gradient file of the case."""
    if case.meta["op"] not in CALLS:
        assert framework == "numpy", case.meta["op"]
        return _table_run(case)
    names, fn, out_names, up_names, numpy_grads = CALLS[case.meta["op"]](case, variant)
    inputs = {n: case.get(n) for n in names if n in case}
    upstream = {u: case.get(u) for u in up_names if u is not None and u in case}
    result = {}
    if framework == "numpy":
        outs = fn(**inputs)
        grads = numpy_grads(inputs, upstream)
        result.update({GRAD_NAME[n]: grads[GRAD_NAME[n]] for n in inputs})
    elif framework == "torch":
        import torch
        tensors = {n: torch.tensor(a, requires_grad=True) for n, a in inputs.items()}
        outs = fn(**tensors)
        loss = 0
        for out, up in zip(outs, up_names):
            if up is not None and up in upstream:
                loss = loss + (out * torch.from_numpy(upstream[up])).sum()
        loss.backward()
        result.update({GRAD_NAME[n]: t.grad.numpy() for n, t in tensors.items()})
        outs = [o.detach().numpy() for o in outs]
    else:
        import jax
        import jax.numpy as jnp
        order = list(inputs)

        def positional(*arrays):
            return fn(**dict(zip(order, arrays)))

        outs, vjp = jax.vjp(jax.jit(positional), *[jnp.asarray(inputs[n]) for n in order])
        cts = tuple(jnp.asarray(upstream[u]) if u is not None and u in upstream
                    else jnp.zeros_like(o) for o, u in zip(outs, up_names))
        grads = jax.jit(vjp)(cts)
        result.update({GRAD_NAME[n]: np.asarray(g) for n, g in zip(order, grads)})
        outs = [np.asarray(o) for o in outs]
    for name, out in zip(out_names, outs):
        if name in case:
            result[name] = out
    return result
