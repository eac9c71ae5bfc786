#!/bin/sh
# sh scripts/python-numpy.sh VENV_DIR
#
# Prints the path of a Python 3 that can import NumPy, for the reference-case generator and
# judge (tests/refgen): python3 when it has NumPy, else Debian's /usr/bin/python3 (which
# scripts/install-deps.sh gives python3-numpy), else a virtual environment made in VENV_DIR
# with NumPy from PyPI. The python3 first on PATH may be another installation (pyenv,
# conda) that lacks NumPy even where the system's has it.
set -e
VENV=${1:?usage: sh scripts/python-numpy.sh VENV_DIR}
for py in python3 /usr/bin/python3 "$VENV/bin/python"; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import numpy' 2>/dev/null; then
        command -v "$py"
        exit 0
    fi
done
python3 -m venv "$VENV" >&2 || {
    echo "python-numpy.sh: no python3 with NumPy, and 'python3 -m venv' failed" \
         "(Debian: sh scripts/install-deps.sh)" >&2
    exit 2
}
"$VENV/bin/python" -m pip install -q --disable-pip-version-check numpy >&2
echo "$VENV/bin/python"
