#!/usr/bin/env bash
# CI's image build: the reduced ktsft images (same Dockerfile and stages, ktdeploy's own dependencies
# only), fully offline after two downloads that this script makes first:
#   1. the base image, debootstrapped from Debian's mirror (docker/base/build-base.sh, ~1-2 min);
#   2. the reduced wheelhouse from PyPI (~17 MB, checked against docker/requirements/reduced.lock).
# Then `ktdeploy image build --stack reduced --isa all` builds ktsft-reduced:<build> for every kt-kernel CPU build (core/variants.py).
# Idempotent: what exists is reused (docker's layer cache, wheels already present).
#
#   docker/ci-build-reduced.sh            (PYTHON=path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
start=$(date +%s)
# KTDEPLOY_BASE_IMAGE: the base tag to build and build on (default ktdeploy/base:bookworm).
BASE="${KTDEPLOY_BASE_IMAGE:-ktdeploy/base:bookworm}"
bash docker/base/build-base.sh "$BASE"
"$PY" docker/wheelhouse.py --stack reduced >/dev/null
"$PY" -m ktdeploy image build --stack reduced --isa all --quiet --base-image "$BASE" ${KTSFT_REPO:+--repo "$KTSFT_REPO"}
echo "reduced images built in $(( $(date +%s) - start ))s"
