"""Padded tokens per step of the variable-length tiny datasets, measured by LlamaFactory itself on the CPU (no GPU,
no kt-kernel: the data pipeline, sampler and collator are the trainer's, the model a throwaway): what the time model's
`padded_ratio` (bench/throughput_calibration.py) derives from the dataset generator, checked against the real batches.

Runs in the full image, the checkout mounted (it needs torch, transformers, LlamaFactory):

    docker run --rm -v $PWD:/src -w /src -e PYTHONPATH=/src -e HF_HUB_OFFLINE=1 --entrypoint python ktsft:amx \
        bench/padding_probe.py > bench/results/time-scale/padding.json
        (... bench/padding_probe.py --long > bench/results/time-scale/padding-long.json: a 60-step run's batches)

Each dataset and batch size trains twice on one throwaway model, counting non-padding tokens, then all tokens
(`include_num_input_tokens_seen`); the non-padding counts must equal the GPU campaign's per-step counts
(bench/results/time-scale/call5.json), which proves the batches are the GPU run's. Prints the result as JSON
on stdout (the trainer's own output goes to stderr): the container may not share the checkout's files back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
# (dataset, batch, steps, the call5 run with these batches): every variable-length setup the calibration holds
PROBES = (("tiny_sft_long", 4, 16, "var"), ("tiny_sft_long", 8, 14, "var-b8"), ("tiny_sft", 4, 40, None))
# --long: the batches of a 60-step variable-length run (time_scale.py --runs base,var,var-eager --steps 60), where
# lengths repeat often enough to tell a new length's cost from a step's; its first 16 steps are PROBES' first
LONG = (("tiny_sft_long", 4, 60, None),)


def increments(cumulative: list[int]) -> list[int]:
    """Tokens of each step from the running total the trainer logs."""
    return [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]


def per_step(log: Path) -> list[int]:
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    by_step = {r["current_steps"]: r["total_tokens"] for r in reversed(rows)      # the run's summary repeats the
               if "current_steps" in r and isinstance(r.get("total_tokens"), int)}  # last step: keep its first row
    return increments([by_step[k] for k in sorted(by_step)])


def train(work: Path, model: Path, data: Path, dataset: str, batch: int, steps: int, count: str) -> list[int]:
    recipe = yaml.safe_load((ROOT / "recipes/tiny-moe-lora.yaml").read_text())["train"]
    for k in ("use_kt", "kt_config"):
        recipe.pop(k, None)
    out = work / f"out-{dataset}-b{batch}-{count}"
    recipe.update(model_name_or_path=str(model), dataset=dataset, dataset_dir=str(data), output_dir=str(out),
                  max_steps=steps, logging_steps=1, save_strategy="no", plot_loss=False, bf16=False,
                  per_device_train_batch_size=batch, include_num_input_tokens_seen=count)
    cfg = work / f"{dataset}-b{batch}-{count}.yaml"
    cfg.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DISABLE_VERSION_CHECK": "1"}
    subprocess.run(["llamafactory-cli", "train", str(cfg)], check=True, env=env, stdout=sys.stderr)
    return per_step(out / "trainer_log.jsonl")


def main() -> int:
    from ktdeploy.agent import tiny
    probes = LONG if sys.argv[1:] == ["--long"] else PROBES
    campaign = {r["run"]: r for r in json.loads((ROOT / "bench/results/time-scale/call5.json").read_text())["runs"]}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = work / "model", work / "data"
        model.mkdir()
        tiny.build_tokenizer(model, 4096)           # the campaign's vocabulary: its token counts
        tiny.build_dataset(data, 400)
        tiny.build_model(model, tiny.TinySize(64, 1, 4, 2, 32, num_attention_heads=2, num_key_value_heads=1,
                                              head_dim=32, vocab_size=4096), device="cpu")
        rows = {}
        for dataset, batch, steps, run in probes:
            real = train(work, model, data, dataset, batch, steps, "non_padding")
            padded = train(work, model, data, dataset, batch, steps, "all")
            row = {"dataset": dataset, "batch": batch, "real": real, "padded": padded,
                   "padded_over_real": round(sum(padded) / sum(real), 4)}
            print(f"{dataset} x {batch}: padded/real {sum(padded) / sum(real):.3f}", file=sys.stderr)
            rows[f"{dataset}/{batch}"] = row
            if run is None:
                continue
            seen = {step: tokens for _, step, tokens in reversed(campaign[run]["measured"]["step_arrivals"])}
            gpu = increments([seen[k] for k in sorted(seen)])    # [seconds, step, tokens seen]: one per step
            row.update(campaign_run=run, gpu_real=gpu, same_batches=real[:len(gpu)] == gpu)
            print(f"  the same batches as the GPU run {run}: {row['same_batches']}", file=sys.stderr)
    how = f"python bench/padding_probe.py{' --long' if probes is LONG else ''} (in the full image ktsft:amx)"
    print(json.dumps({"how": how, "batches": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
