#!/usr/bin/env bash
# Build the service image (default poissonmark:latest) with no image registry:
# - the base image (POISSONMARK_BASE_IMAGE, default poissonmark-base:bookworm) is built from
#   Debian packages by docker/build_base.sh when it is missing;
# - torch is the local CPU wheel torch-2.13.0+cpu (TORCH_WHEEL, else the first one found in
#   $PIP_FIND_LINKS, pip's find-links config or /opt/wheels), hard-linked into docker/wheels/
#   (git-ignored) and mounted into the pip step, never a layer of the image;
# - the host's CA store (HOST_CA_BUNDLE, default /etc/ssl/certs/ca-certificates.crt), when there
#   is one, is pip's trust store during the build, as the BuildKit secret `host_ca`: a proxy
#   that intercepts TLS with its own CA works, and nothing of it is stored in the image.
# Usage (from anywhere): bash docker/build_image.sh [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-poissonmark:latest}
BASE=${POISSONMARK_BASE_IMAGE:-poissonmark-base:bookworm}
TORCH_VERSION=2.13.0

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  echo "build_image: base image $BASE missing; building it from Debian packages" >&2
  bash docker/build_base.sh "$BASE"
fi

find_torch_wheel() {
  local dirs=() d w
  [ -n "${TORCH_WHEEL:-}" ] && { echo "$TORCH_WHEEL"; return; }
  for d in ${PIP_FIND_LINKS:-}; do dirs+=("${d#file://}"); done
  if command -v pip3 >/dev/null 2>&1; then
    while read -r d; do dirs+=("${d#file://}"); done < <(
      pip3 config list 2>/dev/null | sed -n "s/^[a-z]*\.find-links='\(.*\)'$/\1/p" | tr ' ' '\n')
  fi
  dirs+=(/opt/wheels)
  for d in "${dirs[@]}"; do
    for w in "$d"/torch-"$TORCH_VERSION"+cpu-cp311-*.whl; do
      [ -f "$w" ] && { echo "$w"; return; }
    done
  done
}
mkdir -p docker/wheels
find docker/wheels -name 'torch-*.whl' -delete
wheel=$(find_torch_wheel || true)
if [ -n "$wheel" ]; then
  ln -f "$wheel" docker/wheels/ 2>/dev/null || cp "$wheel" docker/wheels/
  echo "build_image: torch from $wheel" >&2
else
  echo "build_image: no local torch-$TORCH_VERSION+cpu wheel; pip uses the CPU index" >&2
fi

secret=()
ca=${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$ca" ]; then
  secret=(--secret "id=host_ca,src=$ca")
  echo "build_image: pip trusts the host CA store $ca (build secret)" >&2
fi

# BuildKit is needed (RUN --mount): buildx when installed, else the engine's built-in builder
# through a CLI that still has it (docker 20.10-24, e.g. Debian's /usr/bin/docker).
if docker buildx version >/dev/null 2>&1; then
  build=(docker buildx build --load)
else
  build=()
  for cli in docker /usr/bin/docker; do
    if command -v "$cli" >/dev/null 2>&1 \
      && DOCKER_BUILDKIT=1 "$cli" build --help 2>/dev/null | grep -q -- '--secret'; then
      build=("$cli" build)
      break
    fi
  done
  if [ ${#build[@]} -eq 0 ]; then
    echo "build_image: no BuildKit builder (install docker-buildx or Debian's docker.io)" >&2
    exit 1
  fi
fi
DOCKER_BUILDKIT=1 "${build[@]}" --progress=plain -f docker/Dockerfile -t "$IMAGE" \
  --build-arg "BASE_IMAGE=$BASE" "${secret[@]}" .
