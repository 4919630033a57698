"""Weight-dominated calibration points per expert format (issue 42 item 4, issue 47): one random Qwen3-MoE per
shape, built once in BF16 and then held by kt-kernel as BF16, native block FP8, INT8 and AMXINT4, each trained a
few steps through `ktdeploy train` with its shipped tiny recipe, side by side on one machine.

Per shape:
1. the BF16 model (bench/gpu/weight_scale.py build: random weights, the tiny tokenizer, a filled dataset so every
   batch is cutoff x batch tokens, the planner's worst case);
2. its block-FP8 copy (ktdeploy.agent.tiny_fp8.quantize_checkpoint: transformers' own Fp8Quantize, 128x128 blocks);
3. its INT8 and AMXINT4 expert trees (`ktdeploy prepare-weights --recipe recipes/tiny-moe-{int8,amxint4}-lora.yaml`:
   kt-kernel's own quantizer, its thread-pool layout);
4. per format: `ktdeploy plan` on the same recipe and values (host, GPU, tokens/s with bands), then `ktdeploy train`
   measured from outside (process-tree RSS every 0.25 s, nvidia-smi, steady tokens/s from the trainer log's
   arrival times).

On the GPU machine, from a clean checkout plus the carried wheels (bench/gpu/fetch_wheels.py):

    device tool: run(command="python3 bench/gpu/format_scale.py --setup --shapes fA --out $OUT",
                     carry=["bench/gpu/.carry"])

Writes $OUT/format_scale.json (one row per run: measured vs planned) and the logs as one tar.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench" / "gpu")]

from bench.gpu.weight_scale import Shape, build, expert_bytes, measure  # noqa: E402

GB = 1e9
# kt-kernel's FP8 SFT wants hidden, intermediate (and intermediate / 2 pools) divisible by 128, key/value width too.
SHAPES: dict[str, Shape] = {
    "fA": Shape("fA", 2048, 12, 64, 8, 768, fill=True),                                   # 7.2 GB of BF16 experts
    "fB": Shape("fB", 1536, 10, 96, 6, 1024, num_attention_heads=12, fill=True),          # 9.1 GB, other geometry
}
# Full fine-tunes on shapes the planner's full-FT terms never saw (issue 42: its host figure within 5 %).
FULL: dict[str, Shape] = {
    "full-v32": Shape("full-v32", 1024, 8, 32, 4, 512, vocab_size=32000, fill=True),
    "full-h1536": Shape("full-h1536", 1536, 6, 48, 8, 768, num_attention_heads=12, vocab_size=16384, fill=True),
    "full-l12": Shape("full-l12", 1024, 12, 64, 8, 512, vocab_size=8192, fill=True),
}
RECIPES = {"bf16": "tiny-moe-lora.yaml", "fp8": "tiny-moe-fp8-lora.yaml", "int8": "tiny-moe-int8-lora.yaml",
           "amxint4": "tiny-moe-amxint4-lora.yaml", "full": "tiny-moe-full.yaml"}
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def sets_for(fmt: str, model: Path, tree: Path | None) -> list[str]:
    out = [f"train.model_name_or_path={model}"]
    if tree is not None:
        out.append(f"train.kt_weight_path={tree}")
    return out


def plan(recipe: Path, s: Shape, sets: list[str]) -> dict:
    argv = [sys.executable, "-m", "ktdeploy", "plan", str(recipe), "--json"]
    for v in [*s.sets(), f"train.dataset={s.dataset}", *sets]:
        argv += ["--set", v]
    p = run(argv, 120)
    try:
        d = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"rc": p.returncode, "stderr": p.stderr[-1500:]}
    thr = d.get("throughput") or {}
    return {"rc": p.returncode, "host_gib": d.get("host_memory_gib"), "gpu_gib": d.get("gpu_memory_gib_per_gpu"),
            "band": d.get("error_band"), "tokens_per_s": thr.get("tokens_per_s"), "step_s": thr.get("step_s"),
            "host_terms": [(t.get("name"), t.get("gib")) for t in d.get("breakdown", []) if t.get("resource") == "host"]}


def fp8_copy(src: Path, dst: Path) -> float:
    from ktdeploy.agent.tiny_fp8 import quantize_checkpoint

    t = time.monotonic()
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quantize_checkpoint(dst, config, device="cuda")
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return round(time.monotonic() - t, 1)


def prepare(fmt: str, model: Path, tree: Path) -> dict:
    t = time.monotonic()
    shutil.rmtree(tree, ignore_errors=True)
    p = run([sys.executable, "-m", "ktdeploy", "prepare-weights", "--recipe", str(REPO / "recipes" / RECIPES[fmt]),
             "--set", f"train.model_name_or_path={model}", "--set", f"train.kt_weight_path={tree}", "--json"], 400)
    try:
        summary = json.loads(p.stdout)
    except json.JSONDecodeError:
        summary = None
    return {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1), "bytes": (summary or {}).get("bytes"),
            "verify": (summary or {}).get("verify"), "stderr": p.stderr[-1500:] if p.returncode else ""}


def train_one(s: Shape, fmt: str, model: Path, tree: Path | None, work: Path, steps: int, timeout: float,
              extra: tuple[str, ...] = (), name: str | None = None) -> dict:
    s = replace(s, expert_format="")   # the format is the shipped recipe's (AMXINT4 is a kt_backend, not a format key)
    recipe = REPO / "recipes" / RECIPES[fmt]
    sets = [*sets_for(fmt, model, tree), *extra]
    row: dict = {"shape": s.name, "format": fmt, "recipe": f"recipes/{RECIPES[fmt]}", "expert_gb_bf16":
                 round(expert_bytes(s) / GB, 2), "shape_spec": asdict(s), "plan": plan(recipe, s, sets)}
    name = name or f"fs-{s.name}-{fmt}"
    say(f"train {name} (plan host {row['plan'].get('host_gib')} GiB, gpu {row['plan'].get('gpu_gib')} GiB)")
    m = measure(s, model, work / "output", steps, timeout, recipe=recipe, extra=tuple(sets[1:]), name=name)
    log = work / "output" / f"{name}.log"
    row["measured"] = {k: m.get(k) for k in ("rc", "peak_host_rss_gib", "peak_gpu_used_gib_nvsmi",
                                             "peak_gpu_alloc_gib", "steady_tokens_per_s", "steady_steps",
                                             "median_step_tokens_per_s", "tokens_per_s", "tokens", "steps",
                                             "train_runtime_s", "loss_first", "loss_last", "rss_phases",
                                             "step_arrivals")}
    row["rss_timeline"] = m.get("rss_timeline")
    if m.get("rc") != 0 and log.exists():
        row["tail"] = log.read_text(errors="replace")[-3000:]
    mm, pp = row["measured"], row["plan"]
    say(f"  -> rc={m.get('rc')} host {mm['peak_host_rss_gib']} (plan {pp.get('host_gib')}) gpu "
        f"{mm['peak_gpu_used_gib_nvsmi']} (plan {pp.get('gpu_gib')}) tok/s steady {mm['steady_tokens_per_s']} "
        f"(plan {(pp.get('tokens_per_s') or {}).get('value')}) loss {mm['loss_first']}->{mm['loss_last']}")
    return row


def shape_runs(s: Shape, formats: list[str], work: Path, steps: int, deadline: float) -> list[dict]:
    models = work / "models"
    bf16 = models / f"fs-{s.name}"
    t = time.monotonic()
    build(s, bf16, work / "data")
    say(f"{s.name}: built {expert_bytes(s) / GB:.1f} GB of BF16 experts in {time.monotonic() - t:.0f} s")
    rows: list[dict] = []
    src: dict[str, tuple[Path, Path | None, dict]] = {"bf16": (bf16, None, {})}
    for fmt in formats:
        if fmt == "fp8":
            secs = fp8_copy(bf16, models / f"fs-{s.name}-fp8")
            say(f"{s.name}: FP8 copy in {secs} s")
            src["fp8"] = (models / f"fs-{s.name}-fp8", None, {"seconds": secs})
        elif fmt in ("int8", "amxint4"):
            tree = models / f"fs-{s.name}-{fmt.upper()}"
            prep = prepare(fmt, bf16, tree)
            say(f"{s.name}: prepare-weights {fmt} rc={prep['rc']} {prep['seconds']} s {prep['stderr'][-400:]}")
            src[fmt] = (bf16, tree, prep)
    for fmt in formats:
        if fmt not in src:
            continue
        left = deadline - time.monotonic()
        if left < 90:
            rows.append({"shape": s.name, "format": fmt, "skipped": f"budget ({left:.0f} s left)"})
            say(f"{s.name} {fmt}: skipped, {left:.0f} s left")
            continue
        model, tree, prep = src[fmt]
        if prep.get("rc", 0) != 0:
            rows.append({"shape": s.name, "format": fmt, "prepare": prep})
            continue
        row = train_one(s, fmt, model, tree, work, steps, min(240.0, left - 20))
        row["prepare"] = prep
        rows.append(row)
        shutil.rmtree(work / "output" / f"fs-{s.name}-{fmt}", ignore_errors=True)
    for p in models.glob(f"fs-{s.name}*"):
        shutil.rmtree(p, ignore_errors=True)
    return rows


def full_runs(s: Shape, work: Path, steps: int, deadline: float) -> list[dict]:
    left = deadline - time.monotonic()
    if left < 100:
        return [{"shape": s.name, "format": "full", "skipped": f"budget ({left:.0f} s left)"}]
    model = work / "models" / f"fs-{s.name}"
    build(s, model, work / "data")
    full = replace(s, lora_rank=0)   # no LoRA keys on the full recipe
    row = train_one(full, "full", model, None, work, steps, min(240.0, left - 20))
    shutil.rmtree(model, ignore_errors=True)
    return [row]


def campaign(res: dict, out: Path, stem: str, setup: bool, t0: float, body: Callable[[Callable[[], None]], None],
             logs: list[tuple[Path, str, str]]) -> None:
    """One GPU-machine campaign: the carried wheels installed (``setup``), the machine recorded, then ``body(save)``
    (save writes $OUT/<stem>.json, so a call cut off at its limit still returns the finished runs); an error is kept
    in the results, and the trainer logs go back as one tar (``logs``: folder, glob, arcname pattern)."""
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))

    try:
        if setup:
            from bench.gpu.gpu_bench import setup as install
            res["setup"] = install()
        res["machine"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
        res["cpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        from bench.gpu.membw import measure
        res["membw"] = measure()        # a few seconds: the host's copy bandwidth beside its CPU model
        res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        body(save)
    except Exception:
        import traceback

        res["error"] = traceback.format_exc()[-4000:]
        say(res["error"])
    finally:
        res["wall_s"] = round(time.monotonic() - t0, 1)
        save()
        with tarfile.open(out / f"{stem}_logs.tar.gz", "w:gz") as tar:
            for folder, pattern, arcname in logs:
                for f in sorted(folder.glob(pattern)):
                    tar.add(f, arcname=arcname.format(name=f.name, parent=f.parent.name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="fA", help=f"comma-separated: {', '.join([*SHAPES, *FULL])}")
    ap.add_argument("--formats", default="bf16,fp8,int8,amxint4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget", type=float, default=560, help="seconds for the whole command")
    ap.add_argument("--setup", action="store_true", help="install the carried wheels first")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/format-scale")))
    ap.add_argument("--work", type=Path, default=Path("/srv/ktdeploy"))
    a = ap.parse_args()
    deadline = T0 + a.budget
    res: dict = {"how": f"python3 bench/gpu/format_scale.py {' '.join(sys.argv[1:])}", "runs": []}

    def body(save: Callable[[], None]) -> None:
        for name in a.shapes.split(","):
            if name in SHAPES:
                res["runs"] += shape_runs(SHAPES[name], a.formats.split(","), a.work, a.steps, deadline)
            elif name in FULL:
                res["runs"] += full_runs(FULL[name], a.work, a.steps, deadline)
            save()

    campaign(res, a.out, "format_scale", a.setup, T0, body,
             [(a.work / "output", "fs-*.log", "{name}"), (a.work / "output" / ".runs", "fs-*/*", "runs/{parent}/{name}")])
    say(f"done in {time.monotonic() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
