"""Steady tokens/s of designed shapes on one machine, for the planner's time model (issue 47): each run varies one
axis of a base model at a time (tokens per step, layers, experts, top-k, expert width, hidden size, cutoff, kt
threads, full fine-tuning), long enough (--steps, default 16) that the steady rate is over many step intervals and
a single stalled step shows in the kept arrival times instead of deciding the figure.

Every run is `ktdeploy train` on a random Qwen3-MoE (bench/gpu/weight_scale.py build) with the shipped tiny recipe
(LoRA: tiny-moe-lora.yaml, full: tiny-moe-full.yaml) and a filled dataset (every batch is cutoff x batch tokens), so
the tokens the model computes are the tokens counted; the var* runs use variable-length samples instead. Which runs the fit sees is decided by the calibration script
(bench/throughput_calibration.py), not here.

On the GPU machine, from a clean checkout plus the carried wheels (bench/gpu/fetch_wheels.py):

    device tool: run(command="python3 bench/gpu/time_scale.py --setup --runs base,b8,l16 --out $OUT",
                     carry=["bench/gpu/.carry"])

Writes $OUT/time_scale.json (rows in format_scale.py's layout) after every run, and the logs as one tar.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench" / "gpu")]

from bench.gpu.format_scale import campaign, say, train_one  # noqa: E402
from bench.gpu.weight_scale import SHAPES, Shape, build, build_fill_dataset  # noqa: E402

BASE = Shape("t-base", 1024, 8, 64, 8, 512, fill=True)


@dataclass(frozen=True)
class TimeRun:
    name: str
    shape: Shape
    fmt: str = "bf16"                      # bf16 (LoRA recipe) | full (full fine-tuning recipe)
    sets: tuple[str, ...] = field(default=())


def _v(name: str, **kw: object) -> Shape:
    return replace(BASE, name=name, **kw)


def _ref(name: str) -> Shape:
    """A shape the reference host ran (weight_scale.SHAPES, variable-length samples) under this script's name."""
    return replace(next(s for s in SHAPES if s.name == name), name=f"t-{name}")


RUNS: dict[str, TimeRun] = {r.name: r for r in (
    TimeRun("base", BASE),
    TimeRun("b8", _v("t-b8", batch=8)),                                   # twice the tokens per step
    TimeRun("l16", _v("t-l16", num_hidden_layers=16)),                    # twice the MoE layers
    TimeRun("e128", _v("t-e128", num_experts=128)),                       # twice the experts, same top-k
    TimeRun("k4", _v("t-k4", num_experts_per_tok=4)),                     # half the routed tokens
    TimeRun("i1536", _v("t-i1536", moe_intermediate_size=1536)),          # three times the expert GEMM
    TimeRun("h2048", _v("t-h2048", hidden_size=2048)),                    # twice the hidden size
    TimeRun("c2048", _v("t-c2048", cutoff_len=2048, batch=1)),            # long sequences, same tokens
    TimeRun("thr8", BASE, sets=("train.kt_config.kt_num_threads=8",)),
    TimeRun("thr12", BASE, sets=("train.kt_config.kt_num_threads=12",)),
    TimeRun("full", replace(BASE, name="t-full", lora_rank=0), "full"),
    TimeRun("full-i1536", _v("t-full-i1536", moe_intermediate_size=1536, lora_rank=0), "full"),
    TimeRun("fA", Shape("fA", 2048, 12, 64, 8, 768, fill=True)),          # format_scale's weight-dominated shape
    # variable-length samples (tiny_sft_long, ~260 real tokens a sample, batches padded to their longest): what the
    # padding model and any per-step cost of changing sequence lengths miss, side by side with `base` on one machine
    TimeRun("var", _v("t-var", fill=False)),
    TimeRun("var-k4", _v("t-var-k4", num_experts_per_tok=4, fill=False)),
    TimeRun("var-b8", _v("t-var-b8", batch=8, fill=False)),
    TimeRun("var-i1536", _v("t-var-i1536", moe_intermediate_size=1536, fill=False)),
    TimeRun("var-l16", _v("t-var-l16", num_hidden_layers=16, fill=False)),
    # the same batches with eager attention instead of SDPA: if a new padded length still costs more, it is not the
    # attention kernels' per-shape setup (run with --steps 60, beside `var`, so that lengths repeat)
    TimeRun("var-eager", _v("t-var", fill=False), sets=("train.flash_attn=disabled",)),
    # the reference host's three variable-length misses of 2026-12-03 (+12 to +24 %, 0.34-0.45 s a step), again on
    # a VM whose CPU model is recorded: a miss that stays is the shape's, one that goes was that session's
    TimeRun("ref-w5-e64", _ref("w5-e64")),
    TimeRun("ref-w10-e80", _ref("w10-e80")),
    TimeRun("ref-w10-k4", _ref("w10-k4")),
    TimeRun("small", _v("t-small", hidden_size=512, num_hidden_layers=4, num_experts=16, num_experts_per_tok=4,
                        moe_intermediate_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=64)),
)}


def one(r: TimeRun, work: Path, steps: int, timeout: float) -> dict:
    model = work / "models" / f"ts-{r.shape.name}"
    if not (model / "config.json").exists():
        t = time.monotonic()
        build(r.shape, model, work / "data")
        say(f"{r.name}: built {r.shape.name} in {time.monotonic() - t:.0f} s")
    # more rows than the run reads (steps x batch, at least 160): no epoch boundary inside the measured steps
    build_fill_dataset(work / "data", r.shape.cutoff_len, rows=max(160, steps * r.shape.batch))
    row = train_one(r.shape, r.fmt, model, None, work, steps, timeout, extra=r.sets, name=f"ts-{r.name}")
    row["run"] = r.name
    row["sets"] = list(r.sets)
    shutil.rmtree(work / "output" / f"ts-{r.name}", ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="base", help=f"comma-separated: {', '.join(RUNS)}")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--budget", type=float, default=560, help="seconds for the whole command")
    ap.add_argument("--setup", action="store_true", help="install the carried wheels first")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/time-scale")))
    ap.add_argument("--work", type=Path, default=Path("/srv/ktdeploy"))
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for r in RUNS.values():
            print(f"{r.name:12s} {r.fmt:5s} {r.shape} {' '.join(r.sets)}")
        return 0
    t0 = time.monotonic()
    res: dict = {"how": f"python3 bench/gpu/time_scale.py {' '.join(sys.argv[1:])}", "runs": []}

    def body(save: Callable[[], None]) -> None:
        for name in a.runs.split(","):
            left = t0 + a.budget - time.monotonic()
            if left < 75:
                res["runs"].append({"run": name, "skipped": f"budget ({left:.0f} s left)"})
                say(f"{name}: skipped, {left:.0f} s left")
                continue
            res["runs"].append(one(RUNS[name], a.work, a.steps, min(240.0, left - 15)))
            save()

    campaign(res, a.out, "time_scale", a.setup, t0, body, [(a.work / "output", "ts-*.log", "{name}")])
    say(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
