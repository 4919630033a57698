#!/usr/bin/env bash
# The test command (README.md and .ci/run call this). Two tiers, both run by default:
#   unit        — ruff check ., then mypy (both configured in pyproject.toml; any finding fails), then pure, fast tests: recipe rules, fact parsers on golden files, planner, plan rendering
#   integration — real docker: test hosts with sshd on a private network, images, ansible, `ktdeploy up`
#                 (needs root or the docker group, apt-get + a Debian mirror for debootstrap, ssh-keygen, rsync)
#   ./run-tests.sh            both tiers
#   ./run-tests.sh unit       unit tier only
#   ./run-tests.sh integration
set -euo pipefail
cd "$(dirname "$0")"
TIER="${1:-all}"

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,fleet]'

# rsync: `up --sync-model/--sync-data` copy with it (the controller's side; the test hosts have their own); both
# tiers run it (the unit tier syncs between local folders)
command -v rsync >/dev/null || { apt-get update -qq && apt-get install -y -qq rsync >/dev/null; }

run_pytest() {
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  # pytest exits 5 when a tier collected no tests: that is a failure of this script, say so plainly
  if [[ $rc -eq 5 ]]; then echo "no tests collected for: $*" >&2; return 1; fi
  return $rc
}

if [[ "$TIER" == all || "$TIER" == unit ]]; then
  echo "== unit tier"
  # lint first (config in pyproject.toml [tool.ruff]); any finding fails the tier
  echo "-- ruff check ."
  .venv/bin/ruff check .
  # types next (config in pyproject.toml [tool.mypy]: packages = ["ktdeploy"]); any error fails the tier
  echo "-- mypy"
  .venv/bin/mypy
  run_pytest -q tests/unit
fi

if [[ "$TIER" == all || "$TIER" == integration ]]; then
  echo "== integration tier (docker)"
  docker info >/dev/null 2>&1 || { echo "the integration tier needs a running docker engine" >&2; exit 1; }
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  docker/base/build-base.sh
  run_pytest -q -m docker tests/integration
fi
