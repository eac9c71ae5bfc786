#!/bin/sh
# sh scripts/test-python.sh [REFDATA]
#
# The Python package's tests as a newcomer would run them: a virtual environment under
# build/, NumPy, pytest, PyTorch and JAX from PyPI, `pip install .` of this tree (which builds
# liblinseq with the Makefile), then pytest with every framework required (nothing skipped).
# The reference cases: the generated ones (tests/refgen, written to build/refcases), and
# REFDATA (default ../shared/refdata) as well when that folder exists.
# Then the vLLM plugin's tests (python/tests/test_vllm_plugin.py) in vLLM's CPU build, whose
# environment scripts/vllm-venv.sh makes under build/ (once: later runs find its stamp and do
# nothing), with linseq from this tree and the library built above. LINSEQ_TEST_VLLM=0 leaves
# them out (no environment made, nothing downloaded).
set -e
cd "$(dirname "$0")/.."
REFDATA=${1:-../shared/refdata}
PYTHON=${PYTHON:-python3}
VENV=build/venv

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || {
        echo "test-python.sh: '$PYTHON -m venv' failed (Debian: apt-get install python3-venv)" >&2
        exit 2
    }
fi
# PyTorch's Linux wheels on PyPI are the CUDA builds; the CPU code paths are what run here.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check numpy pytest torch jax
# The model libraries linseq plugs into, at the versions its integration tests were written
# against (newer releases move the modeling code those tests call).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "transformers==5.24.0" "kernels==0.17.2" "fla-core==0.6.0"
# jax's XLA FFI header, for linseq.jax's custom calls: pip builds in an isolated environment
# without jax, so setup.py is told where the header is
# (asked from / so that no folder of this tree can shadow the jax package; a failure stops here)
VENV_PYTHON=$(pwd)/$VENV/bin/python
XLA_FFI_INCLUDE=$(cd / && "$VENV_PYTHON" -c 'import jax.ffi; print(jax.ffi.include_dir())')
LINSEQ_XLA_FFI_INCLUDE=$XLA_FFI_INCLUDE "$VENV_PYTHON" -m pip install -q --disable-pip-version-check .
"$VENV/bin/python" tests/refgen/gen.py build/refcases
CASES=$(pwd)/build/refcases
if [ -d "$REFDATA" ]; then
    CASES=$CASES:$(cd "$REFDATA" && pwd)
else
    echo "test-python.sh: no reference cases in '$REFDATA': only the generated cases are run"
fi
# From build/: the installed package is imported, not the source folder
cd build
# LINSEQ_JAX_CALLS=ffi: the JAX tests run the XLA custom calls, never the host callbacks quietly.
# TORCHINDUCTOR_CACHE_DIR: inductor's compiled-graph cache of this build tree alone. Its
# default (/tmp/torchinductor_$USER) outlives the tree, and a graph compiled against an older
# liblinseq keeps that library's sizes (a saved block's, say) as constants it asserts.
LINSEQ_JAX_CALLS=ffi LINSEQ_REFDATA=$CASES LINSEQ_REQUIRE_FRAMEWORKS=1 \
    TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(pwd)/torchinductor} \
    "venv/bin/python" -m pytest -q ../python/tests

if [ "${LINSEQ_TEST_VLLM:-1}" = 0 ]; then
    echo "test-python.sh: LINSEQ_TEST_VLLM=0: the vLLM plugin's tests left out"
    exit 0
fi
cd ..
status=0
VLLM_VENV=$(sh scripts/vllm-venv.sh) || status=$?
if [ "$status" = 3 ]; then
    echo "test-python.sh: vLLM's CPU ops do not load on this machine (vllm-venv.sh said why):" \
        "the vLLM plugin's tests cannot run here" >&2
    exit 0
fi
[ "$status" = 0 ] || exit "$status"
VLLM_PYTHON=$VLLM_VENV/bin/python
"$VLLM_PYTHON" -m pip install -q --disable-pip-version-check pytest
LIBRARY=$(cd / && "$VENV_PYTHON" -c \
    'import linseq, os; print(os.path.join(os.path.dirname(linseq.__file__), "liblinseq.so"))')
cd build
PYTHONPATH=$(cd .. && pwd)/python LINSEQ_LIBRARY=$LIBRARY LINSEQ_REQUIRE_VLLM=1 \
    TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(pwd)/torchinductor-vllm} \
    "$VLLM_PYTHON" -m pytest -q ../python/tests/test_vllm_plugin.py
