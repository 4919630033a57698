#!/usr/bin/env bash
# Build the Debian base image locally, without any registry: debootstrap a rootfs, then `docker import`.
# This is also the air-gapped path: run it once where Debian's mirror is reachable, then `docker save` it.
#
#   docker/base/build-base.sh [TAG]      (default TAG: ktdeploy/base:bookworm)
#   MIRROR=http://deb.debian.org/debian SUITE=bookworm docker/base/build-base.sh
#
# The image holds Python 3.11 (bookworm's python3), venv, ca-certificates and the few tools the agent
# and the test hosts need, with Python's headers (python3.11-dev: Triton compiles its launcher, driver.c,
# against Python.h at the first kernel launch). Re-running with the tag already present is a no-op
# unless FORCE=1 or the image was built from another package list: the label io.ktdeploy.base.packages
# holds the sha256 of PACKAGES+SUITE, so CI rebuilds the base when this list changes.
#   KTDEPLOY_BASE_IMAGE=TAG   the tag to build when no argument is given (tests use a branch-prefixed one)
set -euo pipefail

TAG="${1:-${KTDEPLOY_BASE_IMAGE:-ktdeploy/base:bookworm}}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,python3-pip,python3.11-dev,ca-certificates,procps,util-linux,iproute2,gcc,libc6-dev,tini"
PKG_SHA="$(printf '%s\n%s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -d' ' -f1)"

if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
  have="$(docker image inspect -f '{{index .Config.Labels "io.ktdeploy.base.packages"}}' "$TAG" 2>/dev/null || true)"
  if [[ "$have" == "$PKG_SHA" ]]; then
    echo "base image $TAG already present (FORCE=1 rebuilds)"
    exit 0
  fi
  echo "base image $TAG was built from another package list (label ${have:-none}, want $PKG_SHA): rebuilding"
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 2; }

ROOTFS="$(mktemp -d /tmp/ktdeploy-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >/tmp/ktdeploy-debootstrap.log 2>&1 || {
  echo "debootstrap failed; last lines of /tmp/ktdeploy-debootstrap.log:" >&2
  tail -n 20 /tmp/ktdeploy-debootstrap.log >&2
  exit 1
}
# Slim the rootfs: apt lists, caches and docs are not needed at run time.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
echo "deb $MIRROR $SUITE main" >"$ROOTFS/etc/apt/sources.list"

tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL io.ktdeploy.base.packages=$PKG_SHA io.ktdeploy.base.suite=$SUITE" \
  --message "debootstrap $SUITE minbase + $PACKAGES" - "$TAG" >/dev/null
echo "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
