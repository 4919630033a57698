#!/usr/bin/env python3
"""`ktdeploy merge` throughput against a plain copy of the same bytes on the same disk, and its peak RSS.

    .venv/bin/python bench/merge/merge_bench.py --work /work/tmp-merge-bench/gen --size-gb 10.5 --runs 3 \
        -o bench/results/merge/merge_bench.json

1. Generates a Qwen3-MoE-shaped BF16 model of about ``--size-gb`` (hidden 2048, 128 experts of width 768, as many
   layers as the size needs, ~2 GB shards with an index) and a KT LoRA for it in kt-kernel's real layout (r 8,
   alpha 16: fused expert LoRA BF16 + PEFT LoRA on q/k/v/o and the router, F32), random values.
2. Alternates, ``--runs`` times each, side by side in one process: COPY (every file of the base folder copied
   with shutil.copyfile and fsynced: a durable plain copy) and MERGE (`python -m ktdeploy merge ... --json` as a
   child process, whose peak RSS comes from wait4). Each output is deleted before the next run.
3. Reports the medians, ``merge_over_copy`` = median merge throughput / median copy throughput (base bytes per
   second; the merged model has the same size), each run's pair ratio and the 1-min load before it, the CPU
   seconds per GB of each (load-independent: on a shared machine the CPU-bound merge loses more to neighbours
   than the disk-bound copy), and the peak RSS against the bound
   stated in ktdeploy/agent/merge/stream.py (rss_bound: the process after its imports and plan, measured + DEPTH x
   3 x BLOCK_BYTES + the O_DIRECT buffer + scratch + the LoRA cache).
The generated folders are deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ktdeploy.agent.merge import stream  # noqa: E402
from tests.fakes import kt_layout as kl  # noqa: E402

SHAPE = {"hidden": 2048, "experts": 128, "moe_inter": 768, "heads": 32, "kv_heads": 4, "head_dim": 128,
         "vocab": 32000, "top_k": 8}


def _pattern_values(seed: int):
    """Fast deterministic values: slices of one 64 MiB random BF16 block (speed does not depend on values)."""
    rng = np.random.default_rng(seed)
    block = kl.random_values(seed)("pattern", "BF16", [32 << 20])
    f32 = (rng.standard_normal(1 << 22) * 0.02).astype(np.float32).tobytes()

    def make(name: str, dtype: str, shape) -> bytes:
        n = 1
        for d in shape:
            n *= d
        start = (zlib.crc32(name.encode()) & 0xFFFF) * 2
        if dtype == "F32":
            return (f32 * (n * 4 // len(f32) + 1))[: n * 4]
        need = n * 2
        if need + start <= len(block):
            return block[start:start + need]
        return (block * (need // len(block) + 1))[:need]
    return make


def generate(work: Path, size_gb: float) -> tuple[Path, Path, dict]:
    m = dict(SHAPE)
    per_layer = m["experts"] * 3 * m["moe_inter"] * m["hidden"] * 2 + 2 * m["hidden"] * (
        m["heads"] * m["head_dim"] + m["kv_heads"] * m["head_dim"]) * 2
    m["layers"] = max(1, int(size_gb * 1e9 / per_layer + 0.999))
    base, out = work / "base", work / "out"
    if (base / "model.safetensors.index.json").exists() and json.loads((work / "shape.json").read_text()) == m:
        return base, out, m
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t = kl.base_tensors(m)
    total = sum(int(np.prod(s)) * 2 for _d, s in t.values())
    shards = max(1, round(total / 2e9))
    values = _pattern_values(1)
    acc, where = 0, {}
    for k in sorted(t):
        where[k] = min(shards - 1, acc * shards // total)
        acc += int(np.prod(t[k][1])) * 2
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    base.mkdir()
    for i, f in enumerate(files):
        kl.write_safetensors(str(base / f), {k: v for k, v in t.items() if where[k] == i}, {"format": "pt"}, values)
    (base / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {k: files[where[k]] for k in sorted(t)}}, indent=1))
    (base / "config.json").write_text(json.dumps(kl.model_config(m), indent=2))
    (base / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    kl.write_lora_adapter(str(out), base=str(base), m=m, seed=2)
    (work / "shape.json").write_text(json.dumps(m))
    return base, out, m


def _sync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def copy_run(base: Path, dst: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of the durable copy (sendfile's kernel copy is this process's system time)."""
    c0 = _cpu_self()
    t0 = time.perf_counter()
    dst.mkdir()
    for p in sorted(base.iterdir()):
        shutil.copyfile(p, dst / p.name)
        fd = os.open(dst / p.name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _sync_dir(dst)
    return time.perf_counter() - t0, _cpu_self() - c0


LAST_CPU = [0.0]
PLAN_RSS = """
import gc, sys
from pathlib import Path
import ktdeploy.cli  # noqa: F401 (the CLI's imports, as `ktdeploy merge` has them)
from ktdeploy.agent.merge import run as mr
src = mr.find_adapter_dir(Path(sys.argv[1]).resolve())
adapter = mr._adapter(src, True)
base = mr._base(Path(sys.argv[2]).resolve(), Path(sys.argv[2]).resolve())
plans = mr._plans(adapter, base)
gc.collect()
print([ln for ln in open("/proc/self/status") if ln.startswith("VmRSS")][0].split()[1])
"""


def peak_rss_of(argv: list[str]) -> tuple[float, int, bytes]:
    """Run argv; (seconds, peak RSS in bytes from wait4, stdout); its CPU seconds go to LAST_CPU."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    out = p.stdout.read() if p.stdout else b""
    err = p.stderr.read() if p.stderr else b""
    _pid, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    LAST_CPU[0] = usage.ru_utime + usage.ru_stime
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise SystemExit(f"{argv[:4]} failed ({rc}): {err.decode()[-2000:]}")
    return dt, usage.ru_maxrss * 1024, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--size-gb", type=float, default=10.5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    if args.generate_only:
        generate(args.work, args.size_gb)
        return 0
    load_start = os.getloadavg()
    free = shutil.disk_usage(args.work.parent if args.work.parent.exists() else "/").free
    t0 = time.perf_counter()
    # generated in a child process: a child's ru_maxrss starts from its parent's at fork, so this process must
    # never hold a shard in memory or every merge would report the generator's peak
    subprocess.run([sys.executable, __file__, "--work", str(args.work), "--size-gb", str(args.size_gb),
                    "--generate-only"], check=True)
    base, out = args.work / "base", args.work / "out"
    m = json.loads((args.work / "shape.json").read_text())
    gen_s = time.perf_counter() - t0
    base_bytes = sum(p.stat().st_size for p in base.iterdir())
    if free < 3.2 * base_bytes:
        raise SystemExit(f"{free / 1e9:.0f} GB free; the bench needs ~3x the model ({base_bytes / 1e9:.1f} GB)")
    print(f"model: {m['layers']} layers, {base_bytes / 1e9:.2f} GB in {len(list(base.glob('*.safetensors')))} shards "
          f"(generated in {gen_s:.0f} s)", flush=True)
    # the baseline: the merge process after its imports and its plan (headers, the tensor map), before any data
    # block is read (VmRSS then; the adapter's NaN scan before it is transient and smaller than the pipeline)
    _s, _r, planned = peak_rss_of([sys.executable, "-c", PLAN_RSS, str(out), str(base)])
    baseline_rss = int(planned.split()[-1]) * 1024
    runs = []
    merge_argv = [sys.executable, "-m", "ktdeploy", "merge", str(out), "--base", str(base), "-o",
                  str(args.work / "merged"), "--json"] + (["--threads", str(args.threads)] if args.threads else [])
    for i in range(args.runs):
        load = os.getloadavg()[0]
        cdst = args.work / "copy"
        shutil.rmtree(cdst, ignore_errors=True)
        c, c_cpu = copy_run(base, cdst)
        shutil.rmtree(cdst)
        shutil.rmtree(args.work / "merged", ignore_errors=True)
        md, rss, stdout = peak_rss_of(merge_argv)
        m_cpu = LAST_CPU[0]
        summary = json.loads(stdout)
        shutil.rmtree(args.work / "merged")
        row = {"run": i + 1, "copy_s": round(c, 2), "merge_s": round(md, 2),
               "copy_gb_s": round(base_bytes / c / 1e9, 3), "merge_gb_s": round(base_bytes / md / 1e9, 3),
               "pair_ratio": round(c / md, 3), "merge_peak_rss_mib": round(rss / 2**20, 1),
               "merged_tensors": summary["expert_tensors"] + summary["nonexpert_tensors"],
               "load_1min_before": round(load, 2),
               "copy_cpu_s_per_gb": round(c_cpu / (base_bytes / 1e9), 3),
               "merge_cpu_s_per_gb": round(m_cpu / (base_bytes / 1e9), 3)}
        runs.append(row)
        print(json.dumps(row), flush=True)
    copy_med = statistics.median(r["copy_gb_s"] for r in runs)
    merge_med = statistics.median(r["merge_gb_s"] for r in runs)
    workers = args.threads or min(4, len(os.sched_getaffinity(0)))
    lora_cache = 64 * 4 * 8 * (m["hidden"] + m["moe_inter"]) * 2      # 64 cached (A, B) pairs in f32, r 8
    bound = stream.rss_bound(baseline_rss, workers, lora_cache, widest_row=m["hidden"])
    peak = max(r["merge_peak_rss_mib"] for r in runs)
    res = {
        "what": "ktdeploy merge vs a durable plain copy (copyfile + fsync) of the same base folder, same disk",
        "how": "bench/merge/merge_bench.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "numpy": np.__version__, "loadavg_start": load_start},
        "model": {**m, "bytes": base_bytes, "shards": len(list(base.glob("*.safetensors")))},
        "runs": runs,
        "copy_gb_s_median": copy_med, "merge_gb_s_median": merge_med,
        "merge_over_copy": round(merge_med / copy_med, 3),
        "cpu_s_per_gb_median": {"copy": statistics.median(r["copy_cpu_s_per_gb"] for r in runs),
                                "merge": statistics.median(r["merge_cpu_s_per_gb"] for r in runs)},
        "peak_rss_mib": peak,
        "rss_bound_mib": round(bound / 2**20, 1),
        "rss_bound": f"ktdeploy.agent.merge.stream.rss_bound: the process after imports and plan "
                     f"{baseline_rss / 2**20:.0f} MiB + "
                     f"DEPTH {stream.DEPTH} x 3 x BLOCK {stream.BLOCK_BYTES >> 20} MiB + O_DIRECT buffer "
                     f"{stream._Out.CAP >> 20} MiB + {workers} workers x 3 f32 scratch rows + LoRA cache "
                     f"{lora_cache / 2**20:.1f} MiB",
        "loadavg_end": os.getloadavg(),
    }
    print(json.dumps({k: res[k] for k in ("copy_gb_s_median", "merge_gb_s_median", "merge_over_copy", "peak_rss_mib",
                                          "rss_bound_mib")}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
