"""README.md's install lines and pyproject.toml's extras agree: every extra the README names
exists, `all` holds every framework, and each Python example says which extra it needs (a
newcomer with a fresh clone and the README only)."""

import os
import re

import pytest

from conftest import ROOT

tomllib = pytest.importorskip("tomllib")   # Python >= 3.11


def _extras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def _name(requirement):
    return re.split(r"[<>=!~ \[;]", requirement, 1)[0].lower()


def test_every_extra_the_readme_names_exists_and_all_holds_them():
    extras = _extras()
    named = set(re.findall(r"pip install \"?\.\[(\w+)\]", _readme()))
    assert {"torch", "jax", "transformers", "all"} <= named, named
    assert named <= set(extras), named - set(extras)
    every = {_name(r) for n, reqs in extras.items() if n not in ("test", "all") for r in reqs}
    assert {_name(r) for r in extras["all"]} == every
    assert "torch" in {_name(r) for r in extras["transformers"]}


# the framework a snippet imports -> the extra that installs it
_NEEDS = [("transformers", "transformers"), ("torch", "torch"), ("jax", "jax")]


def _examples():
    """(the three lines before it, its code) for each ```python block."""
    lines = _readme().split("\n")
    found = []
    for i, line in enumerate(lines):
        if line == "```python":
            end = lines.index("```", i + 1)
            found.append(("\n".join(lines[max(i - 3, 0):i]), "\n".join(lines[i + 1:end])))
    return found


def test_each_python_example_says_what_to_install():
    extras = _extras()
    assert len(_examples()) >= 3
    for before, code in _examples():
        line = re.search(r"^Install: `pip install (\"?\.(?:\[(\w+)\])?\"?)`", before, re.M)
        assert line, f"no 'Install:' line before the example starting {code[:60]!r}"
        extra = line.group(2)
        imported = [n for n, _ in _NEEDS if re.search(rf"^import .*\b{n}\b", code, re.M)]
        if not imported:
            assert extra is None, code[:60]
            continue
        wanted = next(e for n, e in _NEEDS if n in imported)
        assert extra == wanted or (extra and all(
            n in {_name(r) for r in extras[extra]} for n in imported)), (extra, imported)
