"""linseq's modules import each other without a cycle.

A cycle makes the order of imports matter (a name read from a module that is half executed is
missing), which is what imports at the bottom of a module and reaching into sys.modules work
around. The graph is read from the source of the linseq package that Python would import (found
without executing it), with `ast`:

- every import statement counts, wherever it is: at module level, inside a function or class
  body (a lazy import runs the same module, only later: a cycle through one is still a cycle,
  only harder to see), under `if` or `try`;
- an edge goes to the module an import names: `from . import x` and `from .pkg import x` to the
  submodule x when there is one, else to the module the name is read from (`from .ops import
  KdaInputs` -> linseq.ops); relative and absolute (`linseq.x`) spellings alike;
- `importlib.import_module("linseq.x")` with a constant name counts too;
- a package's own __init__ is not implied by importing one of its submodules (Python runs it
  first, but counting that would make every package's __init__ and submodule a cycle).
"""

import ast
import importlib.util
import os

PACKAGE = "linseq"


def _package_dir():
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations, "linseq is not importable"
    return list(spec.submodule_search_locations)[0]


def _modules(root):
    """{module name: (path, is_package)} for every .py file under the package."""
    found = {}
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(base, root)
        parts = [PACKAGE] + ([] if rel == "." else rel.split(os.sep))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            if name == "__init__.py":
                found[".".join(parts)] = (os.path.join(base, name), True)
            else:
                found[".".join(parts + [name[:-3]])] = (os.path.join(base, name), False)
    return found


def _base(module, is_package, level):
    """The package a relative import of `level` dots starts from."""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    return ".".join(parts[:len(parts) - (level - 1)]) if level > 1 else ".".join(parts)


def _targets(node, module, is_package, modules):
    """The intra-package modules one import node names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return [n for n in names if n in modules or n.split(".")[0] == PACKAGE and
                _longest_module(n, modules)]
    if node.level:
        base = _base(module, is_package, node.level)
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    if source != PACKAGE and not source.startswith(PACKAGE + "."):
        return []
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append(sub if sub in modules else source)
    return out


def _longest_module(name, modules):
    """`import linseq.a.b` names linseq.a.b (or the longest prefix that is a module)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def _import_module_target(node, modules):
    """importlib.import_module("linseq.x") with a constant name, else None."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return _longest_module(arg.value, modules)
    return None


def import_graph(root=None):
    """{module: set of intra-package modules it imports} (the rule of the module docstring)."""
    modules = _modules(root or _package_dir())
    graph = {}
    for module, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, is_package, modules):
                    edges.add(_longest_module(target, modules) or target)
            elif isinstance(node, ast.Call):
                target = _import_module_target(node, modules)
                if target:
                    edges.add(target)
        edges.discard(module)
        graph[module] = {e for e in edges if e in modules}
    return graph


def cycles(graph):
    """One cycle (a list of modules, the first repeated at the end) per strongly connected
    component of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = [0]

    def visit(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(set(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph, component):
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_the_package_imports_no_module_in_a_cycle():
    graph = import_graph()
    assert "linseq.api" in graph and "linseq.compat.fla" in graph, sorted(graph)
    found = cycles(graph)
    assert not found, "import cycles in linseq:\n" + "\n".join(
        "  " + " -> ".join(cycle) for cycle in found)


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    """The rule on a made-up package: a lazy import inside a function closes a cycle, and
    `from . import x` names the submodule x."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('linseq.a')\n")
    graph = import_graph(str(pkg))
    assert graph["linseq"] == {"linseq.a"}
    assert graph["linseq.a"] == {"linseq.sub.b"}
    assert graph["linseq.sub.b"] == {"linseq.c"}
    assert cycles(graph) == [["linseq.a", "linseq.sub.b", "linseq.c", "linseq.a"]]


def test_no_module_reaches_into_another_through_sys_modules():
    """sys.modules["linseq..."] is how a module calls into one it must not import: the
    dependency exists but is hidden from the graph above."""
    root = _package_dir()
    offenders = []
    for module, (path, _) in _modules(root).items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "modules"
                    and isinstance(node.slice, ast.Constant)
                    and str(node.slice.value).startswith(PACKAGE)):
                offenders.append(f"{module}:{node.lineno}")
    assert not offenders, offenders
