#!/usr/bin/env python3
"""GPU proof that `ktdeploy eval` measures learning (issue 43, item 6). On the GPU machine (no docker, no internet):

    python3 bench/gpu/fetch_wheels.py --eval           # here: -> bench/gpu/.carry/wheels (SFT set + eval wheels)
    device tool: run(command="bash bench/gpu/device.sh eval", carry=["bench/gpu/.carry"])

1. setup(): the carried wheels (gpu_bench.setup: the KT SFT set, plus fastapi/uvicorn/sse-starlette, httpx, jieba,
   nltk, rouge-chinese when fetched with --eval);
2. the tiny model (`ktdeploy tiny-model`, size small) and a learnable task written as alpaca rows: "Add the two
   numbers." / "a + b" -> "The sum of a and b is a+b." (600 rows, fixed seed);
3. `ktdeploy train` (real KT: kt-kernel's AMX experts + LlamaFactory) with deploy.eval.holdout=60: the held-out rows
   are carved out before training (agent/holdout.py) and never trained on;
4. `ktdeploy merge` of the KT LoRA into the base;
5. LlamaFactory's own API server (`llamafactory-cli api`) on the GPU, once with the base and once with the merged
   model (sglang-kt does not run there);
6. `ktdeploy eval --endpoint MERGED --base-endpoint BASE --dataset <output>-holdout --dataset-name add.holdout`;
7. $OUT/eval_proof.json: held-out exact match / BLEU-4 / ROUGE base vs tuned, the margin, steps, wall times.
The tuned model must beat the base by a clear margin (ROUGE-L +20 points at least is asserted).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench" / "gpu")]

import gpu_bench as gb  # noqa: E402

ROWS, HOLDOUT, SEED = 600, 60, 43
MARGIN_ROUGE_L = 20.0


def task_rows(n: int = ROWS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    pairs = sorted({(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n * 2)})[:n]
    rng.shuffle(pairs)
    return [{"instruction": "Add the two numbers.", "input": f"{a} + {b}", "output": f"The sum of {a} and {b} is {a + b}."}
            for a, b in pairs]


def write_task(data: Path) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "add.json").write_text(json.dumps(task_rows()))
    info_path = data / "dataset_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info["add"] = {"file_name": "add.json"}
    info_path.write_text(json.dumps(info, indent=2))


def serve(model: Path, port: int, log: Path) -> subprocess.Popen:
    cfg = log.with_suffix(".yaml")
    cfg.write_text(f"model_name_or_path: {model}\ntemplate: qwen3_nothink\ninfer_backend: huggingface\n"
                   "trust_remote_code: true\n")
    env = {**os.environ, "API_PORT": str(port), "API_HOST": "127.0.0.1", "API_MODEL_NAME": model.name,
           "DISABLE_VERSION_CHECK": "1", "CUDA_VISIBLE_DEVICES": "0"}
    return subprocess.Popen([sys.executable, "-m", "llamafactory.cli", "api", str(cfg)], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float = 180) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"api server on {port} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return time.monotonic() - t0
        except OSError:
            time.sleep(1)
    raise SystemExit(f"api server on {port} not ready in {timeout} s:\n{log.read_text()[-3000:]}")


def timed(label: str, walls: dict, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    gb.say(f"{label}: {' '.join(argv[2:8])} ...")
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                     os.environ.get("PYTHONPATH")]))})
    walls[label] = round(time.monotonic() - t0, 1)
    if p.returncode != 0:
        raise SystemExit(f"{label} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def fake_training(out: Path) -> None:
    """--cpu-check: what `ktdeploy train` leaves for the steps after it, without a GPU: the split it carves (the same
    function), a KT LoRA output in kt-kernel's layout (random values) and a trainer log."""
    from ktdeploy.agent.holdout import carve
    from tests.fakes import kt_layout

    carve(str(gb.DATA), ["add"], str(out), HOLDOUT, SEED)
    kt_layout.write_lora_adapter(str(out), base=str(gb.MODELS / "tiny-eval"), seed=7)
    (out / "trainer_log.jsonl").write_text(json.dumps({"current_steps": 1, "total_steps": 1, "loss": 1.0}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/ktdeploy-eval-proof")))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip-setup", action="store_true", help="the wheels are installed already")
    ap.add_argument("--cpu-check", action="store_true",
                    help="everything but the GPU, in the full image on CPU: instead of `ktdeploy train`, the holdout "
                         "carve train runs (agent/holdout.py) and a KT LoRA in kt-kernel's layout with random values "
                         "(tests/fakes/kt_layout.py); no margin is asserted")
    args = ap.parse_args(argv)
    args.skip_setup = args.skip_setup or args.cpu_check
    args.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    result: dict = {"steps": args.steps, "rows": ROWS, "holdout": HOLDOUT, "seed": SEED, "walls_s": walls}
    if not args.skip_setup:
        result["setup"] = gb.setup()
    model, out = gb.MODELS / "tiny-eval", gb.OUTPUT / "eval-proof"
    timed("tiny_model", walls, [gb.PY, "-m", "ktdeploy", "tiny-model", str(model), "--data-dir", str(gb.DATA),
                                    "--overwrite"], 300)   # a warm machine keeps the last call's model and data
    write_task(gb.DATA)
    sets = [f"train.output_dir={out}", f"train.model_name_or_path={model}", f"train.max_steps={args.steps}",
            f"train.dataset_dir={gb.DATA}", "train.dataset=add", "train.cutoff_len=64", "train.learning_rate=0.002",
            "train.per_device_train_batch_size=16", "train.gradient_accumulation_steps=1", "train.logging_steps=10",
            "train.save_steps=100000", "train.plot_loss=false", "train.lr_scheduler_type=cosine",
            f"deploy.eval.holdout={HOLDOUT}", f"deploy.eval.seed={SEED}"]
    train_argv = [gb.PY, "-m", "ktdeploy", "train", str(gb.RECIPE), "--run-root", str(gb.OUTPUT / ".runs-eval")]
    for s in sets:
        train_argv += ["--set", s]
    if args.cpu_check:
        fake_training(out)
    else:
        timed("train", walls, train_argv, 420)
    held = Path(f"{out}-holdout")
    result["holdout_manifest"] = json.loads((held / "holdout.json").read_text())["datasets"]
    log = [json.loads(x) for x in (out / "trainer_log.jsonl").read_text().splitlines() if x.strip()]
    losses = [row["loss"] for row in log if row.get("loss") is not None]   # the last row is the run's summary
    result["loss_first_last"] = [losses[0], losses[-1]] if losses else None
    merged = gb.OUTPUT / "eval-proof-merged"
    timed("merge", walls, [gb.PY, "-m", "ktdeploy", "merge", str(out), "--base", str(model), "-o", str(merged)], 300)
    procs = [serve(model, 8101, args.out / "api-base.log"), serve(merged, 8102, args.out / "api-merged.log")]
    try:
        walls["api_ready_base"] = round(wait_ready(8101, procs[0], args.out / "api-base.log"), 1)
        walls["api_ready_merged"] = round(wait_ready(8102, procs[1], args.out / "api-merged.log"), 1)
        p = timed("eval", walls, [gb.PY, "-m", "ktdeploy", "eval", "--endpoint", "http://127.0.0.1:8102/v1",
                                  "--base-endpoint", "http://127.0.0.1:8101/v1", "--dataset", str(held),
                                  "--dataset-name", "add.holdout", "--max-tokens", "24", "--concurrency", "4",
                                  "-o", str(args.out / "eval"), "--json"], 300)
    finally:
        for pr in procs:
            pr.terminate()
            try:
                pr.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pr.kill()
    summary = json.loads(p.stdout)
    result["eval"] = {k: summary[k] for k in ("samples", "tuned", "base", "delta") if k in summary}
    margin = summary["delta"]["rouge-l"]
    result["verdict"] = {"rouge_l_margin": margin, "wanted": MARGIN_ROUGE_L, "ok": margin >= MARGIN_ROUGE_L}
    if args.cpu_check:
        result["verdict"] = {"cpu_check": "no training: the margin is not judged", "rouge_l_margin": margin, "ok": True}
    (args.out / "eval_proof.json").write_text(json.dumps(result, indent=2))
    gb.say(f"held-out ROUGE-L base {summary['base']['metrics']['rouge-l']:.1f} -> tuned "
           f"{summary['tuned']['metrics']['rouge-l']:.1f} (+{margin:.1f}); exact match "
           f"{summary['base']['metrics']['exact_match']:.1f} -> {summary['tuned']['metrics']['exact_match']:.1f}")
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
