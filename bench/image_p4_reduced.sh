#!/usr/bin/env bash
# P4 on the REDUCED image (not the full one): a one-line change in ktdeploy/, then `ktdeploy image build --isa amx`,
# and the commit floor (1-byte change committed on top of the amx image), same run. Branch-prefixed tags.
set -e
cd /work/wt/image
echo "# p4 probe $(date +%s)" >> ktdeploy/probes/__init__.py
t0=$(date +%s.%N)
.venv/bin/python -m ktdeploy image build --stack reduced --isa amx --base-image image-ktdeploy/base:bookworm --repo image-ktsft-reduced-p4 >/tmp/image-p4-build.log 2>&1
t1=$(date +%s.%N)
git checkout ktdeploy/probes/__init__.py
c=$(docker create image-ktsft-reduced:amx); docker cp /etc/hostname $c:/tmp/onebyte
t2=$(date +%s.%N); docker commit $c image-floor:1 >/dev/null; t3=$(date +%s.%N); docker rm $c >/dev/null; docker rmi image-floor:1 >/dev/null
python3 -c "r=$t1-$t0; f=$t3-$t2; print(f'code_rebuild_s={r:.1f} commit_floor_s={f:.1f} ratio={r/f:.2f}')"
