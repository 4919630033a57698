#!/usr/bin/env python3
"""`ktdeploy tune` on the GPU machine, measured against the settings people pick by hand, in ONE device call:

    device tool: run(command="bash bench/gpu/tune_bench.sh", carry=["bench/gpu/.carry"])

1. installs the carried KT SFT wheels and builds the tiny "medium" random Qwen3-MoE (CPU expert compute dominates
   its step: 64 experts, top-8 — see kt-facts.md) — both via bench/gpu/gpu_bench.py;
2. runs `ktdeploy tune` on it (budget TUNE_BUDGET_MIN minutes) → tune.json;
3. measures, side by side with one method (`ktdeploy train`, same steps, steady tokens/s after warm-up from the
   arrival times of trainer_log.jsonl lines): the cookbook's all-physical-cores setting, a manual sweep of
   kt_num_threads, and `ktdeploy train --tuned tune.json`;
4. prints tuned / all-cores and tuned / best-manual, and writes $OUT/tune_results.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench/gpu"))
sys.path.insert(0, str(REPO))

import gpu_bench as gb  # noqa: E402
from full_runs import PERF  # noqa: E402

STEPS = int(os.environ.get("TUNE_STEPS", "14"))
BUDGET_MIN = float(os.environ.get("TUNE_BUDGET_MIN", "3.0"))
# all-cores first, then the likeliest winners: if the call's deadline cuts the sweep, the key ratios still exist
SWEEP = [int(x) for x in os.environ.get("TUNE_SWEEP", "16,8,12,6,4").split(",")]
DEADLINE_S = float(os.environ.get("TUNE_DEADLINE_S", "560"))   # the device call's 600 s limit, less a margin
RUN_COST_S = 50.0                                               # one 14-step train run on the medium model


def _summarize(res: dict, runs: dict) -> None:
    res["runs"] = {k: {x: v.get(x) for x in ("rc", "steady_tokens_per_s", "tokens_per_s", "peak_host_rss_gib",
                                             "peak_gpu_alloc_gib", "loss_first", "loss_last", "wall_s", "tail",
                                             "kt_config", "tuned_record")}
                   for k, v in runs.items()}
    rate = {k: v.get("steady_tokens_per_s") for k, v in runs.items() if v.get("steady_tokens_per_s")}
    manual = {k: r for k, r in rate.items() if k.startswith("manual-")}
    all_cores = rate.get(f"manual-{max(SWEEP)}")
    best_manual = max(manual.values()) if manual else None
    tuned = rate.get("tuned")
    res["ratios"] = {
        "tuned_tokens_per_s": tuned, "all_cores_tokens_per_s": all_cores,
        "best_manual": max(manual, key=manual.get) if manual else None, "best_manual_tokens_per_s": best_manual,
        "tuned_over_all_cores": round(tuned / all_cores, 3) if tuned and all_cores else None,
        "tuned_over_best_manual": round(tuned / best_manual, 3) if tuned and best_manual else None,
    }


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/ktdeploy-tune-out"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ktdeploy-tune-bench")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res: dict = {"how": "bash bench/gpu/tune_bench.sh (device tool, nvidia-h200, one call)", "steps": STEPS,
                 "budget_min": BUDGET_MIN}
    try:
        res["setup"] = gb.setup()
        model = gb.MODELS / "tiny-medium"
        res["model_config"] = gb.build_model("medium", model)
        # the long-sample dataset (as bench/gpu/full_runs.py's PERF): CPU expert compute dominates each step
        sets = ["--set", f"train.model_name_or_path={model}", "--set", "train.include_num_input_tokens_seen=non_padding"]
        for s in PERF:
            sets += ["--set", s]
        gb.say(f"ktdeploy tune (budget {BUDGET_MIN} min)")
        p = gb.sh([gb.PY, "-m", "ktdeploy", "tune", str(gb.RECIPE), *sets, "--budget-minutes", str(BUDGET_MIN),
                   "--workdir", str(work / "tune"), "--warmup-steps", "3", "--measure-steps", "6", "--json"],
                  timeout=BUDGET_MIN * 60 + 150)
        gb.say(f"tune rc={p.returncode} {p.stderr[-2500:]}")
        res["tune"] = json.loads(p.stdout) if p.returncode == 0 else {"rc": p.returncode, "stderr": p.stderr[-4000:]}
        runs: dict = {}
        res["skipped"] = []

        def record() -> None:
            _summarize(res, runs)
            (out / "tune_results.json").write_text(json.dumps(res, indent=2, default=str))

        if p.returncode == 0:
            name = "tuned"
            runs[name] = gb.ktdeploy_train(name, model, STEPS, work / "logs", 150, extra=PERF, skip_doctor=True,
                                           args=["--tuned", str(work / "tune" / "tune.json")])
            # proof that the run trained with the tune choice: its rendered kt_* keys and its run record's "tuned"
            runs[name]["kt_config"] = [ln.strip() for ln in runs[name].get("train_yaml", "").splitlines()
                                       if ln.startswith("  kt_")]
            runs[name]["tuned_record"] = (runs[name].get("command") or {}).get("tuned")
            record()
        for t in SWEEP:
            name = f"manual-{t}"
            if time.monotonic() - gb.T0 > DEADLINE_S - RUN_COST_S:
                res["skipped"].append(name)
                gb.say(f"skip {name}: the call's deadline")
                continue
            runs[name] = gb.ktdeploy_train(name, model, STEPS, work / "logs", 150, skip_doctor=True,
                                           extra=[*PERF, f"train.kt_config.kt_num_threads={t}",
                                                  "train.kt_config.kt_threadpool_count=1"])
            record()
        record()
        gb.say(f"RATIOS {json.dumps(res['ratios'])}")
    except Exception:
        import traceback

        res["error"] = traceback.format_exc()
        gb.say("ERROR " + res["error"][-2000:])
    finally:
        res["wall_s"] = round(time.monotonic() - gb.T0, 1)
        (out / "tune_results.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "tune_log.txt").write_text("\n".join(gb.LOG) + "\n")
        for name in ("tune.json", "trial-00.log"):
            if (work / "tune" / name).exists():
                shutil.copy(work / "tune" / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
