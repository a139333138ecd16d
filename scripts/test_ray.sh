#!/usr/bin/env bash
# The Ray tests: corpus detection on Ray Data and the service on Ray Serve, each on a
# real two-node Ray cluster started on this machine (tests/service/ray_cluster.py). Installs the
# ray extra into the venv first. Extra arguments go to pytest. Minutes: see the README.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -c 'import ray' 2>/dev/null || pip install -q -e '.[ray]'
# the Serve test needs a Redis server on 127.0.0.1:6379 (its replicas share it)
if ! python -c 'import redis; redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()' 2>/dev/null; then
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null || true
    sleep 1
  fi
fi
start=$(date +%s)
python -m pytest -q -m ray tests/service/test_ray_corpus.py tests/service/test_ray_serve.py "$@"
echo "test_ray: $(( $(date +%s) - start )) s"
