#!/usr/bin/env bash
# End-to-end check of the Docker Compose deployment on a real engine:
#   engine (installed with apt and started when missing, if root) -> build (base image from
#   Debian packages when missing, then the service image) -> `up -d` -> /readyz -> keys, an API
#   token, generate, detect `watermarked` over HTTP -> the served precision (gguf: llama.cpp in
#   the image) and the decoding speed of the container beside the native install, same prompt and
#   token count, interleaved (scripts/compose_speed.py) -> Redis killed (SIGKILL) -> /v1/detect is
#   503 application/problem+json and /readyz 503 -> Redis back: every key still there (AOF),
#   detection works -> service container restarted: keys and tokens still work -> no secret in
#   the containers' logs -> `down -v`.
# Exits non-zero at the first failure (with the containers' logs); prints each phase's time.
#   bash scripts/compose_smoke.sh
# Environment: COMPOSE_SMOKE_PROJECT (compose project, default pmsmoke), COMPOSE_SMOKE_PORT
# (published port, default 18000), COMPOSE_SMOKE_JSON (where the result goes, default
# bench/results/compose_smoke.json; empty: nowhere), COMPOSE_SMOKE_KEEP=1 (leave the project up
# on failure, to look at it), COMPOSE_SMOKE_PRECISION (the precision the service must serve,
# default gguf), COMPOSE_SMOKE_NATIVE_PYTHON (the native install's python, default
# .venv/bin/python of this checkout; missing: the container's speed alone),
# COMPOSE_SMOKE_TOKENS (default 128) and COMPOSE_SMOKE_REPS (default 4) for the speed
# comparison, COMPOSE_SMOKE_MIN_RATIO (fail below this container/native tokens/s ratio; default:
# report only), POISSONMARK_IMAGE, POISSONMARK_BASE_IMAGE (see docker/build_image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT=${COMPOSE_SMOKE_PROJECT:-pmsmoke}
PORT=${COMPOSE_SMOKE_PORT:-18000}
URL=http://127.0.0.1:$PORT
export POISSONMARK_IMAGE=${POISSONMARK_IMAGE:-poissonmark:latest}
export POISSONMARK_BASE_IMAGE=${POISSONMARK_BASE_IMAGE:-poissonmark-base:bookworm}
export POISSONMARK_PUBLISH_PORT=$PORT
RESULT_JSON=${COMPOSE_SMOKE_JSON-bench/results/compose_smoke.json}
EXPECT_PRECISION=${COMPOSE_SMOKE_PRECISION:-gguf}
NATIVE_PYTHON=${COMPOSE_SMOKE_NATIVE_PYTHON:-.venv/bin/python}
work=$(mktemp -d /tmp/compose-smoke.XXXXXX)

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}
now() { date +%s.%N; }
phases=()
phase_start=
begin() {
  phase_name=$1
  phase_start=$(now)
  log "== $phase_name"
}
end() {
  local s
  s=$(python3 -c "print(f'{$(now) - $phase_start:.1f}')")
  phases+=("$phase_name=$s")
  log "   $phase_name: ${s} s"
}

# --- engine ---------------------------------------------------------------------------------
begin engine
if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1 \
  || ! { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; }; then
  [ "$(id -u)" -eq 0 ] || fail "docker / docker-compose missing (and not root to install them)"
  log "installing docker.io docker-compose (apt)"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose; }; \
  } >"$work/apt.log" 2>&1 \
    || { tail -n 20 "$work/apt.log" >&2; fail "apt-get install docker.io docker-compose"; }
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || fail "the Docker engine is not running (and not root to start it)"
  log "starting dockerd (log: /tmp/compose-smoke-dockerd.log)"
  nohup dockerd >/tmp/compose-smoke-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || fail "dockerd did not start (see /tmp/compose-smoke-dockerd.log)"
fi
if docker compose version >/dev/null 2>&1; then
  compose_cli=(docker compose)
else
  compose_cli=(docker-compose)
fi
dc() { "${compose_cli[@]}" -p "$PROJECT" -f docker/docker-compose.yml "$@"; }
log "engine $(docker version --format '{{.Server.Version}}'); compose: $("${compose_cli[@]}" version --short 2>/dev/null || true)"
end

# --- secrets of this run (never printed) ----------------------------------------------------
POISSONMARK_KEK=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
POISSONMARK_ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
POISSONMARK_REDIS_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export POISSONMARK_KEK POISSONMARK_ADMIN_TOKEN POISSONMARK_REDIS_PASSWORD

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    log "logs of the failed run:"
    dc logs --no-color --tail 60 >&2 2>&1 || true
    if [ "${COMPOSE_SMOKE_KEEP:-0}" = 1 ]; then
      log "COMPOSE_SMOKE_KEEP=1: project $PROJECT left up"
      exit "$rc"
    fi
    dc down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# --- HTTP helpers: call METHOD PATH TOKEN [BODY] -> $status, $ctype, body in $work/body ---------
call() {
  local method=$1 path=$2 token=$3 body=${4:-} out
  local args=(-sS -o "$work/body" -w '%{http_code} %{content_type}' -X "$method"
    -H "Authorization: Bearer $token" --max-time 300)
  [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data "$body")
  out=$(curl "${args[@]}" "$URL$path") || out="000 -"
  status=${out%% *}
  ctype=${out#* }
}
field() { python3 -c "import json, sys; print(json.load(open('$work/body'))$1)"; }
expect() { # expect STATUS WHAT
  [ "$status" = "$1" ] || fail "$2: HTTP $status (expected $1): $(head -c 600 "$work/body" 2>/dev/null)"
}
wait_ready() { # wait_ready SECONDS
  local deadline=$(($(date +%s) + $1))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    status=$(curl -s -o "$work/ready" -w '%{http_code}' --max-time 5 "$URL/readyz" || true)
    [ "$status" = 200 ] && return 0
    sleep 1
  done
  fail "/readyz not 200 within $1 s (last: $status $(cat "$work/ready" 2>/dev/null))"
}
detect_watermarked() { # detect_watermarked TOKEN KEY TEXT-FILE WHAT
  local body
  body=$(python3 -c "import json, sys; print(json.dumps({'key_id': sys.argv[1], 'text': open(sys.argv[2]).read()}))" "$2" "$3")
  call POST /v1/detect "$1" "$body"
  expect 200 "$4"
  local verdict
  verdict=$(field "['verdict']")
  [ "$verdict" = watermarked ] || fail "$4: verdict $verdict (expected watermarked): $(head -c 400 "$work/body")"
  log "   $4: watermarked (p = $(field "['p_value']" 2>/dev/null || echo '?'))"
}

# --- build ------------------------------------------------------------------------------------
begin build
bash docker/build_image.sh "$POISSONMARK_IMAGE" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; fail "image build (docker/build_image.sh)"; }
log "   image $POISSONMARK_IMAGE: $(docker image inspect "$POISSONMARK_IMAGE" --format '{{.Size}}') bytes"
# torch is the CPU build, and neither the wheel nor the build secret (the CA store) is in the image
torch_info=$(docker run --rm --user root --entrypoint sh "$POISSONMARK_IMAGE" -c \
  'python -c "import torch; print(torch.__version__, torch.version.cuda)" &&
   { find / -xdev \( -name "torch-*.whl" -o -path /run/secrets/host_ca \) -print 2>/dev/null; true; }') \
  || fail "could not run the image"
[ "$torch_info" = "2.13.0+cpu None" ] || fail "image: expected only 'torch 2.13.0+cpu None', got: $torch_info"
log "   torch $torch_info (CPU); no wheel, no build secret in the image"
# llama.cpp: the patched build (AMX repacking safe), its CPU backend chosen for this CPU at
# import among the instruction-set levels it ships and registered where libllama looks for it
llama_info=$(docker run --rm --entrypoint python "$POISSONMARK_IMAGE" -c '
import re, llama_cpp
from pathlib import Path
from sampler.targets.llamacpp import repacking_safe
lib = Path(llama_cpp.__file__).parent / "lib"
levels = sorted(p.name[len("libggml-cpu-"):-3] for p in lib.glob("libggml-cpu-*.so"))
chosen = sorted(set(re.findall(r"libggml-cpu-([\w.]+)\.so", Path("/proc/self/maps").read_text())))
registered = "CPU :" in llama_cpp.llama_print_system_info().decode()
print(llama_cpp.__version__, "repacking_safe", repacking_safe(), "cpu", ",".join(chosen) if registered else "-", "of", ",".join(levels))
' 2>/dev/null) || fail "image: llama_cpp does not import"
case "$llama_info" in
  *"+poissonmark.amx2.rows repacking_safe True cpu "[!-]*" of "*haswell*) ;;
  *) fail "image: expected the patched llama-cpp-python with a CPU backend loaded, got: $llama_info" ;;
esac
log "   llama-cpp-python $llama_info"
end

# --- up -------------------------------------------------------------------------------------
begin up
dc down -v --remove-orphans >/dev/null 2>&1 || true # a previous run's leftovers
dc up -d redis poissonmark >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "compose up -d"; }
wait_ready 300
end

# --- keys, token, generate, detect --------------------------------------------------------------
begin generate_detect
ADMIN=$POISSONMARK_ADMIN_TOKEN
keys=()
for _ in 1 2 3; do
  call POST /v1/keys "$ADMIN" '{}'
  expect 201 "create key"
  keys+=("$(field "['key_id']")")
done
log "   keys ${keys[*]}"
dc exec -T poissonmark poissonmark tokens create --tenant default --scope generate \
  --scope detect --scope keys --name compose-smoke --json >"$work/token.json" \
  || fail "poissonmark tokens create (in the container)"
TOKEN=$(python3 -c "import json; print(json.load(open('$work/token.json'))['token'])")
call POST /v1/generate "$TOKEN" "{\"key_id\": \"${keys[0]}\", \"prompt\": \"Explain in detail why the sky is blue.\", \"max_new_tokens\": 64, \"nonce\": 7}"
expect 200 "generate (API token)"
cp "$work/body" "$work/gen.json"
field "['text']" >"$work/text"
log "   generated $(field "['stats']['emitted_tokens']") tokens: $(head -c 80 "$work/text" | tr '\n' ' ')..."
detect_watermarked "$TOKEN" "${keys[0]}" "$work/text" "detect (API token)"
served_tps=$(python3 -c "import json; print(round(json.load(open('$work/gen.json'))['stats']['tokens_per_second'], 1))")
log "   /v1/generate: $served_tps tokens/s (stats.tokens_per_second)"
end

# --- precision and speed, container beside the native install ----------------------------------
begin speed
served=$(dc logs --no-color poissonmark 2>&1 | sed -n 's/.*: precision \([a-z0-9]*\) (asked: .*/\1/p' | tail -n 1)
[ "$served" = "$EXPECT_PRECISION" ] || fail "the service serves precision '${served:-?}' (expected $EXPECT_PRECISION; COMPOSE_SMOKE_PRECISION)"
log "   the service serves precision $served"
speed_args=(--container "$(dc ps -q poissonmark)" --tokens "${COMPOSE_SMOKE_TOKENS:-128}"
  --reps "${COMPOSE_SMOKE_REPS:-4}" --out "$work/speed.json")
if [ -x "$NATIVE_PYTHON" ] && "$NATIVE_PYTHON" -c 'import llama_cpp' >/dev/null 2>&1; then
  python3 scripts/compose_speed.py "${speed_args[@]}" --native-python "$NATIVE_PYTHON" \
    >"$work/speed.txt" 2>"$work/speed.log" \
    || { tail -n 30 "$work/speed.log" >&2; fail "speed comparison (scripts/compose_speed.py)"; }
  while read -r line; do log "   $line"; done <"$work/speed.txt"
  if [ -n "${COMPOSE_SMOKE_MIN_RATIO:-}" ]; then
    python3 -c "import json, sys; r = json.load(open('$work/speed.json'))['ratio_container_to_native']; sys.exit(min(r.values()) < $COMPOSE_SMOKE_MIN_RATIO)" \
      || fail "container/native tokens/s below $COMPOSE_SMOKE_MIN_RATIO (COMPOSE_SMOKE_MIN_RATIO)"
  fi
else
  log "   no native install with llama.cpp at $NATIVE_PYTHON (scripts/setup.sh): no speed comparison"
fi
end

# --- Redis killed -------------------------------------------------------------------------------
begin redis_killed
redis_id=$(dc ps -q redis)
[ -n "$redis_id" ] || fail "no redis container"
aof=$(docker exec "$redis_id" redis-cli CONFIG GET appendonly | tail -n 1)
[ "$aof" = yes ] || fail "Redis appendonly is '$aof' (expected yes)"
# one more key, acknowledged just before the kill: it must survive too
call POST /v1/keys "$ADMIN" '{}'
expect 201 "create key"
keys+=("$(field "['key_id']")")
docker kill -s KILL "$redis_id" >/dev/null
for _ in $(seq 20); do
  [ "$(docker inspect -f '{{.State.Running}}' "$redis_id")" = false ] && break
  sleep 0.5
done
[ "$(docker inspect -f '{{.State.Running}}' "$redis_id")" = false ] || fail "Redis still running after SIGKILL"
log "   Redis (appendonly yes) killed: $(docker inspect -f 'exit {{.State.ExitCode}}' "$redis_id"), ${keys[-1]} created just before"
body=$(python3 -c "import json; print(json.dumps({'key_id': '${keys[0]}', 'text': open('$work/text').read()}))")
call POST /v1/detect "$TOKEN" "$body"
[ "$status" = 503 ] || fail "detect with Redis down: HTTP $status (expected 503): $(head -c 400 "$work/body")"
case "$ctype" in application/problem+json*) ;; *) fail "detect with Redis down: Content-Type $ctype (expected application/problem+json)" ;; esac
log "   detect: 503 $ctype: $(head -c 200 "$work/body")"
status=$(curl -s -o "$work/ready" -w '%{http_code}' --max-time 10 "$URL/readyz" || true)
[ "$status" = 503 ] || fail "/readyz with Redis down: HTTP $status (expected 503)"
log "   readyz: 503 $(cat "$work/ready")"
end

# --- Redis back ---------------------------------------------------------------------------------
begin redis_back
docker start "$redis_id" >/dev/null
wait_ready 120
listed=()
cursor=
while :; do
  call GET "/v1/keys?limit=100${cursor:+&cursor=$cursor}" "$ADMIN"
  expect 200 "list keys"
  mapfile -t page < <(field "['keys']" | python3 -c "import ast, sys; [print(k['key_id']) for k in ast.literal_eval(sys.stdin.read())]")
  listed+=("${page[@]}")
  cursor=$(field "['next_cursor'] or ''")
  [ -n "$cursor" ] || break
done
for k in "${keys[@]}"; do
  printf '%s\n' "${listed[@]}" | grep -qx "$k" || fail "key $k lost after the Redis kill (AOF)"
done
log "   all ${#keys[@]} keys listed after the restart (${#listed[@]} in the tenant)"
detect_watermarked "$TOKEN" "${keys[0]}" "$work/text" "detect after Redis restart"
end

# --- service restarted ----------------------------------------------------------------------------
begin service_restart
dc restart poissonmark >/dev/null 2>&1 || fail "compose restart poissonmark"
wait_ready 300
for k in "${keys[@]}"; do
  call GET "/v1/keys/$k" "$TOKEN"
  expect 200 "key $k after the service restart (API token)"
done
call GET /v1/keys "$ADMIN"
expect 200 "list keys after the service restart (admin token)"
detect_watermarked "$TOKEN" "${keys[0]}" "$work/text" "detect after service restart"
call POST /v1/generate "$TOKEN" "{\"key_id\": \"${keys[1]}\", \"prompt\": \"Name three rivers.\", \"max_new_tokens\": 8}"
expect 200 "generate after the service restart (API token)"
end

# --- no secret in any log ----------------------------------------------------------------------
begin logs
dc logs --no-color >"$work/logs" 2>&1 || fail "compose logs"
for secret in "$POISSONMARK_KEK" "$POISSONMARK_ADMIN_TOKEN" "$TOKEN" "$POISSONMARK_REDIS_PASSWORD"; do
  if grep -qF -- "$secret" "$work/logs"; then fail "a secret (KEK, Redis password or bearer token) is in the containers' logs"; fi
done
log "   $(wc -l <"$work/logs") log lines, no KEK, Redis password or bearer token in them"
end

# --- down -----------------------------------------------------------------------------------------
begin down
dc down -v --remove-orphans >"$work/down.log" 2>&1 || { cat "$work/down.log" >&2; fail "compose down -v"; }
left=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
[ -z "$left" ] || fail "volumes left after down -v: $left"
end

total=0
printf '\ncompose_smoke: OK\n%-18s %8s\n' phase seconds
for p in "${phases[@]}"; do
  printf '%-18s %8s\n' "${p%%=*}" "${p#*=}"
  total=$(python3 -c "print($total + ${p#*=})")
done
printf '%-18s %8.1f\n' total "$total"
if [ -n "$RESULT_JSON" ]; then
  image_bytes=$(docker image inspect "$POISSONMARK_IMAGE" --format '{{.Size}}')
  python3 - "$RESULT_JSON" "$work/speed.json" "$served" "$served_tps" "$image_bytes" "${phases[@]}" <<'PY'
import datetime, json, os, subprocess, sys
out, speed_file, served, served_tps, image_bytes = sys.argv[1:6]
phases = {p.split("=")[0]: float(p.split("=")[1]) for p in sys.argv[6:]}
cpuinfo = open("/proc/cpuinfo").read()
cpu = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("model name")), "")
flags = set(next((l.split(":", 1)[1].split() for l in cpuinfo.splitlines() if l.startswith("flags")), []))
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
engine = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True).stdout.strip()
speed = json.load(open(speed_file)) if os.path.exists(speed_file) else None
json.dump({
    "what": "scripts/compose_smoke.sh: phase times, the precision the service serves and the "
            "decoding speed of the container beside the native install (scripts/compose_speed.py)",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": git("rev-parse", "HEAD"),
    "tree_clean": git("status", "--porcelain", "--untracked-files=no") == "",
    "model": "smollm2-135m-instruct",
    "hardware": {"cpu": cpu, "cores": os.cpu_count(),
                 "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "amx": "amx_tile" in flags},
    "engine": engine,
    "machine_load": open("/proc/loadavg").read().split()[:3],
    "image_bytes": int(image_bytes),
    "phases_s": phases,
    "total_s": round(sum(phases.values()), 1),
    "served": {"precision": served, "generate_64_tokens_per_second": float(served_tps)},
    "speed": speed,
}, open(out, "w"), indent=2)
open(out, "a").write("\n")
PY
  log "result: $RESULT_JSON"
fi
