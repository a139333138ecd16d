#!/usr/bin/env bash
# Build the plain PyPI llama-cpp-python that bench/speed_cpu.py's `llama.cpp-pypi` row runs:
# the release our patched build is based on (LLAMA_CPP_VERSION in scripts/setup.sh), compiled
# by pip from its sdist with llama.cpp's own defaults (no project patches, no CMAKE_ARGS), in a
# virtual environment of its own so that it never meets the patched build of .venv.
#
#   bash bench/pypi_llama_cpp.sh     # ~6+ min on 2 cores, once; prints the environment's python
#
# The environment is ${XDG_CACHE_HOME:-~/.cache}/poissonmark/pypi-llama-cpp/<version>; its
# cpu.txt holds the CPU's model and flags lines (the build is native: speed_cpu refuses it on
# another CPU). Rerunning it with the environment in place and the same CPU does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^LLAMA_CPP_VERSION=//p' scripts/setup.sh)
[ -n "$version" ] || { echo "pypi_llama_cpp: no LLAMA_CPP_VERSION in scripts/setup.sh" >&2; exit 1; }
env_dir="${XDG_CACHE_HOME:-$HOME/.cache}/poissonmark/pypi-llama-cpp/$version"
cpu=$(grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo)
if [ -x "$env_dir/bin/python" ] && [ "$(cat "$env_dir/cpu.txt" 2>/dev/null)" = "$cpu" ]; then
  echo "$env_dir/bin/python"
  exit 0
fi
rm -rf "$env_dir"
mkdir -p "$(dirname "$env_dir")"
"${PYTHON:-python3}" -m venv "$env_dir"
log="$env_dir/build.log"
# --no-binary and --no-cache-dir: pip compiles the sdist here, never a wheel built elsewhere
# (a local version such as 0.3.36+poissonmark.* would also satisfy ==0.3.36).
if ! "$env_dir/bin/python" -m pip install --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$version" >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "pypi_llama_cpp: pip install llama-cpp-python==$version failed (full log: $log)" >&2
  exit 1
fi
installed=$("$env_dir/bin/python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')
if [ "$installed" != "$version" ]; then
  echo "pypi_llama_cpp: installed $installed, expected the plain release $version" >&2
  exit 1
fi
echo "$cpu" >"$env_dir/cpu.txt"
echo "$env_dir/bin/python"
