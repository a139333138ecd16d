#!/usr/bin/env bash
# Fills the git-ignored staging folders that scripts/gpu_check.sh reads on a borrowed GPU
# machine, and prints what each of its commands carries (docs/gpu.md, "The plan"):
#   .whl/   wheels the machine lacks: transformers 5.24 (it has 5.17), gguf, pytest-timeout,
#           accelerate (transformers converts a GGUF only with it) and its psutil
#   .tok/   the real model's tokenizer directory, for random mode without the model package
#   .gguf/  the model's GGUF (94 MB) in parts, part-0 sized to travel with .whl/ and .tok/,
#           the others alone; sha256 of the whole file
# Each command's payload (the tree that travels, tracked and untracked-not-ignored files,
# plus what it carries) is kept under $LIMIT_BYTES (60 MiB; the tool refuses over 64 MiB).
#
#   bash scripts/gpu_prepare.sh            # needs the registry (pip download) once
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
LIMIT_BYTES=${LIMIT_BYTES:-$((60 * 1024 * 1024))}
MARGIN=$((512 * 1024))  # files added to the tree before the commands run
HOME_DIR=${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}

if ! ls .whl/transformers-5.24.0-*.whl .whl/accelerate-1.16.0-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    transformers==5.24.0 gguf==0.19.0 pytest-timeout==2.4.0 accelerate==1.16.0 psutil==7.2.2
fi
model_dir=$("$PY" -c "
from pathlib import Path
from sampler.targets.model_files import DEFAULT_MODEL, materialise
print(materialise(DEFAULT_MODEL, Path('$HOME_DIR')))")
mkdir -p .tok
for f in config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  cp "$model_dir/$f" .tok/
done
gguf=$("$PY" -c "
from sampler.targets.model_files import DEFAULT_MODEL, gguf_path
print(gguf_path(DEFAULT_MODEL))")

size() { du -cb "$@" | tail -1 | cut -f1; }
tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
first=$((LIMIT_BYTES - tree - MARGIN - $(size .whl .tok)))
each=$((LIMIT_BYTES - tree - MARGIN - 4096))
total=$(stat -c %s "$gguf")
[ "$first" -gt 0 ] || { echo "gpu_prepare: no room for part-0 beside .whl/ and .tok/" >&2; exit 1; }
rm -rf .gguf && mkdir .gguf
head -c "$first" "$gguf" >.gguf/part-0
offset=$first
i=1
while [ "$offset" -lt "$total" ]; do
  left=$((total - offset))
  parts=$(((left + each - 1) / each))
  chunk=$(((left + parts - 1) / parts))  # the rest in equal parts
  dd if="$gguf" of=".gguf/part-$i" bs=1M iflag=skip_bytes,count_bytes skip="$offset" \
    count="$chunk" status=none
  offset=$((offset + chunk))
  i=$((i + 1))
done
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >.gguf/sha256
cat .gguf/part-* | cmp - "$gguf"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu_prepare: tree $(mib "$tree"); limit $(mib "$LIMIT_BYTES") a command"
last=$((i - 1))
for n in $(seq 0 "$last"); do
  carry=".gguf/part-$n"
  [ "$n" = 0 ] && carry=".whl .tok $carry"
  [ "$n" = "$last" ] && carry="$carry .gguf/sha256"
  # shellcheck disable=SC2086
  echo "gpu_prepare: command $((n + 1)) carries $carry: $(mib $((tree + $(size $carry))))"
done
