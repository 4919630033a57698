#!/bin/bash
# The CPU-build evidence on the GPU machine's AMX Xeon VM (issue 29): ktdeploy's own probe (ktdeploy/probes/amx_probe.c,
# compiled as facts_probes.build_probe compiles it: cc -O1) executing each instruction the builds need — AMX-INT8 and
# AMX-BF16 (tdpbf16ps) tile multiplies, avx512f/bw/vnni/vbmi/bf16 — and kt-kernel 0.7.2's own detection
# (kt_kernel/_cpu_detect.py from the locked wheel, carried as a single file) on the same machine.
#   here:   mkdir -p .carry-cpu && unzip -p .wheelhouse/full/kt_kernel-0.7.2-*.whl kt_kernel/_cpu_detect.py > .carry-cpu/_cpu_detect.py
#   device: run(command="bash bench/gpu/cpu_probe.sh", carry=[".carry-cpu"])
# Writes $OUT/amx_probe.json, cpuinfo.txt, lscpu_json.txt, kt_detect.json, probe_build.log.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/ktdeploy-cpu-probe}"
mkdir -p "$OUT"
cc=$(command -v cc || command -v gcc || command -v clang)
echo "compiler: $cc" > "$OUT/probe_build.log"
"$cc" -O1 -o /tmp/amx_probe ktdeploy/probes/amx_probe.c >> "$OUT/probe_build.log" 2>&1
/tmp/amx_probe > "$OUT/amx_probe.json" 2>> "$OUT/probe_build.log"
echo "probe rc=$?" >> "$OUT/probe_build.log"
cp /proc/cpuinfo "$OUT/cpuinfo.txt"
lscpu -J > "$OUT/lscpu_json.txt" 2>/dev/null
KT_KERNEL_CPU_VARIANT= python3 - > "$OUT/kt_detect.json" <<'PY'
import importlib.util as u, json, os
os.environ.pop("KT_KERNEL_CPU_VARIANT", None)
spec = u.spec_from_file_location("ktcd", ".carry-cpu/_cpu_detect.py")
m = u.module_from_spec(spec); spec.loader.exec_module(m)
print(json.dumps(m.detect_cpu_features()))
PY
cat "$OUT/probe_build.log" "$OUT/amx_probe.json" "$OUT/kt_detect.json"
