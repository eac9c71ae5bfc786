"""README.md's Python examples, run exactly as written: a snippet that no longer runs (a
renamed argument, a stricter check) fails here instead of in a newcomer's hands."""

import os
import re

import pytest

from conftest import ROOT, require

_README = os.path.join(ROOT, "README.md")


def _snippets():
    with open(_README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _frameworks(code):
    return [name for name in ("torch", "jax") if re.search(rf"^import .*\b{name}\b", code, re.M)]


@pytest.mark.parametrize("index", range(len(_snippets())))
def test_readme_python_example_runs(index):
    code = _snippets()[index]
    for name in _frameworks(code):
        require(name)
    exec(compile(code, f"README.md python example {index + 1}", "exec"), {})


def test_readme_has_python_examples():
    assert len(_snippets()) >= 3
