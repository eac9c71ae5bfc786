"""The benchmark tools check what they need before they run anything: a missing package, a
missing ggml checkout or program ends them at once with a message naming it (no traceback),
instead of after minutes of benchmarks whose results are then lost."""

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT, require


def _run_tool(path, argv, blocked=(), cwd=None):
    """Runs the tool as a script with the modules in `blocked` unimportable (None in
    sys.modules makes `import name` raise ImportError)."""
    code = ("import runpy, sys\n"
            f"for name in {list(blocked)!r}:\n"
            "    sys.modules[name] = None\n"
            f"sys.argv = [{path!r}] + {list(argv)!r}\n"
            f"sys.path.insert(0, {os.path.dirname(path)!r})\n"
            f"runpy.run_path({path!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _fake_cli(tmp_path):
    """A stand-in for build/linseq that leaves a mark when anything runs it."""
    mark = tmp_path / "ran"
    cli = tmp_path / "linseq"
    cli.write_text(f"#!/bin/sh\ntouch '{mark}'\nexit 1\n")
    cli.chmod(0o755)
    return str(cli), mark


def test_plot_kda_throughput_needs_matplotlib_before_any_benchmark(tmp_path):
    """It used to run 6 minutes of benchmarks, then fail importing matplotlib."""
    cli, mark = _fake_cli(tmp_path)
    tool = os.path.join(ROOT, "tools", "perf", "plot_kda_throughput.py")
    run = _run_tool(tool, ["--cli", cli, "--out", str(tmp_path / "plot.png")],
                    blocked=["matplotlib"])
    assert run.returncode != 0
    assert "needs matplotlib" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not mark.exists(), "a benchmark ran before matplotlib was checked"


def test_model_bench_checks_its_imports_before_timing(monkeypatch, tmp_path):
    """--plot without matplotlib: the tool stops before the first model is built (a full
    run is over 10 minutes per model), naming matplotlib."""
    require("torch")
    require("transformers")
    spec = importlib.util.spec_from_file_location(
        "model_bench", os.path.join(ROOT, "tools", "model_bench.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ran = []
    monkeypatch.setattr(tool, "run", lambda args: ran.append(args) or ({}, []))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match="model_bench: needs matplotlib"):
        tool.main(["--quick", "--models", "mamba", "--plot", str(tmp_path / "speedup.png")])
    assert not ran, "the benchmark ran before matplotlib was checked"


def test_decode_threads_checks_its_imports_before_timing():
    tool = os.path.join(ROOT, "tools", "decode_threads.py")
    run = _run_tool(tool, ["--rounds", "1"], blocked=["transformers"])
    assert run.returncode != 0
    assert "decode_threads: needs transformers" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "load average" not in run.stdout


def test_ggml_side_by_side_names_a_missing_checkout_or_program(tmp_path):
    tool = os.path.join(ROOT, "tools", "perf", "ggml_side_by_side.py")
    missing = str(tmp_path / "no-ggml")
    run = _run_tool(tool, ["--prepare-ggml", missing])
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert f"--prepare-ggml {missing}: no " in run.stderr
    assert "github.com/ggml-org/ggml" in run.stderr
    cli, mark = _fake_cli(tmp_path)
    run = _run_tool(tool, ["--ggml", os.path.join(missing, "test-backend-ops"), "--cli", cli,
                           "--rounds", "1"])
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert "test-backend-ops: no such program" in run.stderr
    assert not mark.exists()


def test_suite_table_reads_a_slowdown_as_slower():
    """A thread-scaling ratio below 1 is a slowdown: "0.68x faster" misread it."""
    folder = os.path.join(ROOT, "tools", "perf")
    spec = importlib.util.spec_from_file_location("suite_table",
                                                  os.path.join(folder, "suite_table.py"))
    suite_table = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)  # its sibling modules, as when it runs as a script
    try:
        spec.loader.exec_module(suite_table)
    finally:
        sys.path.remove(folder)
    assert suite_table.note({"scaling_threads": 2, "scaling_speedup": 0.68,
                             "shape": {}}) == "2 threads: 1.47x slower than 1"
    assert suite_table.note({"scaling_threads": 2, "scaling_speedup": 1.9,
                             "shape": {}}) == "2 threads: 1.90x faster than 1"
