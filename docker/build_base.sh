#!/usr/bin/env bash
# Build the local base image (default poissonmark-base:bookworm) from Debian packages, with no
# image registry: debootstrap a minimal bookworm root filesystem with python3, python3-venv,
# redis-server and ca-certificates, then `docker import` it. Both the service image
# (docker/Dockerfile) and the compose Redis service run on it. Needs root, debootstrap and a
# Debian mirror (DEBIAN_MIRROR, default http://deb.debian.org/debian).
#   bash docker/build_base.sh [IMAGE]          # ~2-4 min, ~250 MB
set -euo pipefail
IMAGE=${1:-${POISSONMARK_BASE_IMAGE:-poissonmark-base:bookworm}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${DEBIAN_SUITE:-bookworm}
if [ "$(id -u)" -ne 0 ]; then
  echo "build_base: debootstrap needs root" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1 || [ ! -s /usr/share/keyrings/debian-archive-keyring.gpg ]; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap debian-archive-keyring gpgv >/dev/null
fi
rootfs=$(mktemp -d /tmp/poissonmark-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
# --force-check-gpg: the mirror is plain http; abort unless the Release file's signature checks
# out against Debian's archive keyring (debootstrap would otherwise go on unverified when the
# keyring or gpgv is missing)
debootstrap --force-check-gpg --variant=minbase \
  --include=python3,python3-venv,redis-server,ca-certificates \
  "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || {
  tail -n 30 "$rootfs.log" >&2
  echo "build_base: debootstrap failed (log: $rootfs.log)" >&2
  exit 1
}
# Image hygiene: no package lists or caches, no host identity, sources for later apt runs.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/tmp/* \
  "$rootfs"/var/log/*.log "$rootfs"/etc/hostname "$rootfs"/etc/machine-id
: >"$rootfs/etc/resolv.conf"
echo "deb $MIRROR $SUITE main" >"$rootfs/etc/apt/sources.list"
tar -C "$rootfs" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap $SUITE minbase + python3 python3-venv redis-server ca-certificates" \
  - "$IMAGE" >/dev/null
rm -f "$rootfs.log"
docker run --rm "$IMAGE" sh -c 'python3 --version && redis-server --version' | tr '\n' ' '
echo "-> $IMAGE"
