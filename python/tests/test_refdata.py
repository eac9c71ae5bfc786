"""Every public reference case through the Python API, outputs and gradients, in NumPy,
PyTorch (loss.backward()) and JAX (jax.vjp under jit), judged by the cases' own rule."""

import pytest

import refcases
from conftest import Case, case_names, require

KDA_VARIANTS = ["chunked", "recurrent", "ejkernel"]


def _params():
    for name in case_names():
        op = Case(name).meta["op"]
        variants = KDA_VARIANTS if op == "kda" else ["default"]
        for variant in variants:
            if variant == "ejkernel" and ("cu_seqlens" in Case(name) or
                                          "beta" not in Case(name).meta["inputs"]):
                continue  # ejkernel's kda has no packed sequences, and always a beta
            for fw in refcases.frameworks(op):
                yield pytest.param(name, fw, variant, id=f"{name}-{variant}-{fw}")


@pytest.mark.parametrize("name,framework,variant", list(_params()))
def test_reference_case(name, framework, variant):
    if framework != "numpy":
        require(framework)
    case = Case(name)
    result = refcases.run(case, framework, variant)
    expected = set(case.meta["outputs"]) | set(case.meta["grads"])
    assert expected <= set(result), f"missing {expected - set(result)}"
    for key in sorted(expected):
        case.check(key, result[key])
