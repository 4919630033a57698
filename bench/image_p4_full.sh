#!/usr/bin/env bash
# Issue 18 P4 on the FULL image, side by side in one run: (1) ktsft:amx built (cold the first time, cached after),
# (2) a code-only rebuild: one comment line appended to a ktdeploy source file in a copy of the build context,
# then `ktdeploy image build --isa amx`, (3) the engine's commit floor: a 1-byte change committed on top of
# ktsft:amx, timed before and after the rebuild. Writes $OUT/image-p4-full.json.
#   bash bench/image_p4_full.sh            # OUT defaults to bench/results
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT="${OUT:-bench/results}"
LOG="${LOG:-/tmp/image-p4-full.log}"
: > "$LOG"
now() { date +%s.%N; }
[[ -d .wheelhouse/full ]] || $PY docker/wheelhouse.py --stack full >>"$LOG" 2>&1
docker image inspect ktdeploy/base:bookworm >/dev/null 2>&1 || docker/base/build-base.sh >>"$LOG" 2>&1

floor() {   # seconds for one `docker commit` of a 1-byte change on top of ktsft:amx
  local c t0 t1
  c=$(docker create ktsft:amx)
  docker cp /etc/hostname "$c:/tmp/p4-onebyte" >/dev/null
  t0=$(now); docker commit "$c" ktdeploy-p4-floor:tmp >/dev/null; t1=$(now)
  docker rm "$c" >/dev/null; docker rmi ktdeploy-p4-floor:tmp >/dev/null
  python3 -c "print(round($t1-$t0,1))"
}

t0=$(now)
$PY -m ktdeploy image build --stack full --isa amx -q >>"$LOG" 2>&1
t1=$(now)
first_s=$(python3 -c "print(round($t1-$t0,1))")
floor_before=$(floor)

ctx=$(mktemp -d)
trap 'rm -rf "$ctx" "$ctx.report.json"' EXIT
git ls-files -z --cached --others --exclude-standard | tar -cf - --null -T - | tar -xf - -C "$ctx"
echo "# p4 code-only change $(date +%s)" >> "$ctx/ktdeploy/probes/__init__.py"
t0=$(now)
$PY -m ktdeploy image build --stack full --isa amx -q --context "$ctx" --wheelhouse .wheelhouse/full --json \
  >"$ctx.report.json" 2>>"$LOG"
t1=$(now)
rebuild_s=$(python3 -c "print(round($t1-$t0,1))")
floor_after=$(floor)

python3 - "$OUT/image-p4-full.json" "$ctx.report.json" <<PY
import json, statistics, sys, platform, os
floor = statistics.median([$floor_before, $floor_after])
report = json.load(open(sys.argv[2]))
r = {"command": "bash bench/image_p4_full.sh", "image": "full (ktsft:amx, the KT stack)",
     "engine": "docker on this machine: fuse-overlayfs, no BuildKit, 2 cores",
     "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
     "rebuild_method": report.get("method"), "rebuild_phases_s": report.get("phases"),
     "first_build_s": $first_s, "code_rebuild_s": $rebuild_s,
     "commit_floor_s": [$floor_before, $floor_after], "commit_floor_median_s": floor,
     "code_rebuild_over_commit_floor": round($rebuild_s / floor, 2), "nproc": os.cpu_count()}
open(sys.argv[1], "w").write(json.dumps(r, indent=2) + "\n")
print(json.dumps(r, indent=2))
PY
