"""ops.kda_forward(bf16_products=True): the chunked forward's output products on bfloat16
operands (exec->products, include/linseq.h). The final state is the default call's bit for
bit; o is within a bf16 bound of a float64 recurrence of its own; the C call receives
LINSEQ_PRODUCTS_BF16; the recurrent mode ignores the option. KdaOptions.bf16_products carries
it from every framework, and fla's chunk signatures take it as a keyword, for the training
forward and the backward too (whose gradients tests/test_kda_bf16_grads.c judges against
float64)."""

import numpy as np
import pytest

from linseq import ops


def _problem(seed=0, B=1, T=150, H=2, K=64, V=48):
    r = np.random.default_rng(seed)
    q, k = r.standard_normal((B, T, H, K)), r.standard_normal((B, T, H, K))
    v = r.standard_normal((B, T, H, V))
    beta = r.uniform(0.1, 0.9, (B, T, H))
    g = -r.uniform(0.0, 0.1, (B, T, H))
    h0 = 0.1 * r.standard_normal((B, H, K, V))
    return [x.astype(np.float32) for x in (q, k, v, beta, g, h0)]


def _reference(q, k, v, beta, g, h0):
    """o and the final state in float64, token by token (q, k l2-normalised, q * K^-0.5)."""
    q, k, v, beta, g, S = (x.astype(np.float64) for x in (q, k, v, beta, g, h0))
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * q.shape[-1] ** -0.5
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = S.copy()
    o = np.empty(v.shape)
    for t in range(q.shape[1]):
        S *= np.exp(g[:, t])[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S += np.einsum("bhk,bhv->bhkv", k[:, t], u)
        o[:, t] = np.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, S


def _inputs(arrays):
    q, k, v, beta, g, h0 = arrays
    return ops.KdaInputs(q, k, v, beta, g, h0=h0, qk_l2norm=True)


def test_state_unchanged_output_within_bf16_bound():
    arrays = _problem()
    o_ref, s_ref = _reference(*arrays)
    for chunk_size in (16, 64):
        o32, h32 = ops.kda_forward(_inputs(arrays), chunk_size=chunk_size, threads=1)
        o16, h16 = ops.kda_forward(_inputs(arrays), chunk_size=chunk_size, threads=1,
                                   bf16_products=True)
        assert np.array_equal(h16.view(np.uint32), h32.view(np.uint32))
        assert not np.array_equal(o16, o32)  # the option reached the kernel
        err = np.abs(o16 - o_ref).max() / np.abs(o_ref).max()
        assert err <= 1e-2, err
        assert np.abs(h16 - s_ref).max() / np.abs(s_ref).max() <= 1e-4


def test_exec_carries_the_option_and_recurrent_ignores_it():
    ex = ops.make_exec("chunked", 64, 1, bf16_products=True)
    assert ex.products == ops.PRODUCTS_BF16
    assert ops.make_exec("chunked", 64, 1).products == ops.PRODUCTS_F32
    arrays = _problem(seed=1, T=40)
    o_a, h_a = ops.kda_forward(_inputs(arrays), mode="recurrent", threads=1)
    o_b, h_b = ops.kda_forward(_inputs(arrays), mode="recurrent", threads=1, bf16_products=True)
    assert np.array_equal(o_a, o_b) and np.array_equal(h_a, h_b)


def _through_frameworks(arrays, **options):
    """(o, ht) of linseq.run("kda") with the given options over NumPy arrays, torch tensors
    (no gradient) and, where JAX is installed, JAX arrays, as NumPy."""
    import linseq
    names = ("q", "k", "v", "beta", "g", "h0")
    given = dict(zip(names, arrays))
    results = [linseq.run("kda", given, qk_l2norm=True, **options)]
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        results.append(linseq.run("kda", {n: torch.from_numpy(a) for n, a in given.items()},
                                  qk_l2norm=True, **options))
    try:
        import jax.numpy as jnp
    except ImportError:
        jnp = None
    if jnp is not None:
        results.append(linseq.run("kda", {n: jnp.asarray(a) for n, a in given.items()},
                                  qk_l2norm=True, **options))
    return [tuple(np.asarray(x) for x in r) for r in results]


def test_every_framework_passes_the_option_to_the_forward():
    """KdaOptions.bf16_products reaches the C call from NumPy, PyTorch (its custom op) and
    JAX (its FFI call): each gives ops.kda_forward(bf16_products=True)'s bits."""
    arrays = _problem(seed=2, T=96)
    o_want, h_want = ops.kda_forward(_inputs(arrays), bf16_products=True)
    o_f32, _ = ops.kda_forward(_inputs(arrays))
    assert not np.array_equal(o_want, o_f32)
    for o, h in _through_frameworks(arrays, bf16_products=True):
        assert np.array_equal(o, o_want) and np.array_equal(h, h_want)


def test_fla_chunk_signatures_take_the_option():
    """fla's chunk_kda and chunk_gated_delta_rule take bf16_products (linseq's keyword): the
    forward's bits with it, where a gradient is recorded too (the training forward takes the
    option); without it, the float32 products' bits."""
    torch = pytest.importorskip("torch")
    from linseq.compat import fla
    q, k, v, beta, g, h0 = _problem(seed=3, T=80)
    g_channels = np.ascontiguousarray(np.broadcast_to(g[..., None], q.shape))
    for fn, decay in ((fla.chunk_gated_delta_rule, g), (fla.chunk_kda, g_channels)):
        arrays = [q, k, v, beta, decay, h0]
        o_want, h_want = ops.kda_forward(_inputs(arrays), bf16_products=True)
        o_f32, _ = ops.kda_forward(_inputs(arrays))
        tq, tk, tv, tbeta, tg, th0 = (torch.from_numpy(a) for a in arrays)

        def call(**options):
            return fn(tq, tk, tv, tg, tbeta, initial_state=th0, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, **options)
        with torch.no_grad():
            o, h = call(bf16_products=True)
            o_plain, _ = call()
        assert np.array_equal(o.numpy(), o_want) and np.array_equal(h.numpy(), h_want)
        assert np.array_equal(o_plain.numpy(), o_f32) and not np.array_equal(o_want, o_f32)
        tq.requires_grad_(True)
        o_grad, _ = call(bf16_products=True)
        assert np.array_equal(o_grad.detach().numpy(), o_want)


def test_the_backward_takes_the_option():
    """ops.kda_backward(bf16_products=True) and a torch backward through fla's chunk_kda
    with the keyword: dh0 and dv the float32 products' bits (the state's gradient chain stays
    float32), dq and dk not, within a bf16 bound of the float32 products' gradients."""
    torch = pytest.importorskip("torch")
    from linseq.compat import fla
    arrays = _problem(seed=5, T=100)
    r = np.random.default_rng(6)
    d_o = r.standard_normal((1, 100, 2, 48)).astype(np.float32)
    d_ht = r.standard_normal((1, 2, 64, 48)).astype(np.float32)
    g32 = ops.kda_backward(_inputs(arrays), d_o, d_ht, threads=1)
    g16 = ops.kda_backward(_inputs(arrays), d_o, d_ht, threads=1, bf16_products=True)
    for name in ("dh0", "dv"):
        assert np.array_equal(g16[name].view(np.uint32), g32[name].view(np.uint32)), name
    for name in ("dq", "dk", "dbeta", "dg"):
        err = np.abs(g16[name] - g32[name]).max() / np.abs(g32[name]).max()
        assert 0 < err <= 1e-2, (name, err)

    def torch_grads(**options):
        leaves = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
        tq, tk, tv, tbeta, tg, th0 = leaves
        o, h = fla.chunk_gated_delta_rule(tq, tk, tv, tg, tbeta, initial_state=th0,
                                          output_final_state=True,
                                          use_qk_l2norm_in_kernel=True, **options)
        ((o * torch.from_numpy(d_o)).sum() + (h * torch.from_numpy(d_ht)).sum()).backward()
        return {n: x.grad.numpy() for n, x in zip(("dq", "dk", "dv", "dbeta", "dg", "dh0"),
                                                   leaves)}
    t32, t16 = torch_grads(), torch_grads(bf16_products=True)
    for name in ("dh0", "dv"):
        assert np.array_equal(t16[name], t32[name]), name
    for name in ("dq", "dk"):
        assert not np.array_equal(t16[name], t32[name]), name
        assert np.abs(t16[name] - t32[name]).max() / np.abs(t32[name]).max() <= 1e-2, name


def _ssd_problem(seed=4, B=1, T=100, H=4, P=16, N=32, G=1):
    r = np.random.default_rng(seed)
    return dict(x=r.standard_normal((B, T, H, P)), dt=r.uniform(0.01, 0.1, (B, T, H)),
                A=-r.uniform(0.5, 2.0, (H,)), B=r.standard_normal((B, T, G, N)),
                C=r.standard_normal((B, T, G, N)), D=r.standard_normal((H,)),
                h0=0.1 * r.standard_normal((B, H, P, N)))


def test_ssd_takes_the_option_from_every_framework():
    """The table op ssd's options carry bf16_products (its chunked forward takes
    exec->products): y changes, within the bf16 operands' error, the final state does not,
    and NumPy, PyTorch and JAX give the same bits."""
    import linseq
    given = {n: a.astype(np.float32) for n, a in _ssd_problem().items()}
    y32, s32 = linseq.run("ssd", given)
    results = [linseq.run("ssd", given, bf16_products=True)]
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        results.append(linseq.run("ssd", {n: torch.from_numpy(a) for n, a in given.items()},
                                  bf16_products=True))
    try:
        import jax.numpy as jnp
        results.append(linseq.run("ssd", {n: jnp.asarray(a) for n, a in given.items()},
                                  bf16_products=True))
    except ImportError:
        pass
    y16, s16 = (np.asarray(t) for t in results[0])
    assert not np.array_equal(y16, y32) and np.array_equal(s16, s32)
    assert np.abs(y16 - y32).max() <= 2 ** -6 * np.abs(y32).max()
    for y, s in results[1:]:
        assert np.array_equal(np.asarray(y), y16) and np.array_equal(np.asarray(s), s16)
