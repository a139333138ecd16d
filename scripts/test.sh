#!/usr/bin/env bash
# Set up and run the default test suite (CPU). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# A Redis server on 127.0.0.1:6379 is used when it answers (tests marked redis_server);
# start one if the binary exists and nothing listens. The embedded Redis needs nothing.
if ! python -c 'import redis; redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()' 2>/dev/null; then
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null || true
    sleep 1
  fi
fi
# The web page's browser tests drive Debian's Chromium (Playwright's own browser download is
# not reachable here): install it when missing and we may.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } \
      >>.venv/setup.log 2>&1 || echo "test: could not install chromium (see .venv/setup.log)" >&2
  else
    echo "test: chromium is missing; install Debian's chromium for the browser tests" >&2
  fi
fi
ruff check keyed sampler detector service tests bench
ruff format --check keyed sampler detector service tests bench
mypy
python -m pytest -q "$@"
