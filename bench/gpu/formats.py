"""Every cookbook setup trained for real on the GPU machine (issue 42): one device call.

    device tool: run(command="bash bench/gpu/device.sh formats", carry=["bench/gpu/.carry"])

On a bare GPU machine with the carried KT SFT wheels (bench/gpu/fetch_wheels.py):
1. the tiny Qwen3-MoE as BF16 and as a native block-FP8 checkpoint (`ktdeploy tiny-model [--format fp8]`);
2. its routed experts converted by `ktdeploy prepare-weights --recipe recipes/tiny-moe-{int8,amxint4}-lora.yaml`
   (kt-kernel's own quantizer; the ephemeral INT8 run stages its own /dev/shm root inside `ktdeploy train`);
3. for each setup (bf16-lora, fp8-lora, int8-lora, int8-lora-ephemeral, amxint4-lora, bf16-full):
   `ktdeploy plan` (the prediction), `ktdeploy train` with the shipped tiny recipe (>= 8 optimizer steps; peak host
   RSS of the process tree and GPU memory sampled from outside; loss, tokens/s from LlamaFactory's own files),
   `ktdeploy convert`, `ktdeploy serve --print --json` (the argv; checked against sglang-kt's parser in the full
   image afterwards: tests/integration/test_serve_args_image.py), and for LoRA setups `ktdeploy merge` into the
   model folder the run read its non-expert weights from, then the merged model's logits (transformers, GPU, no KT)
   against the KT model with the adapter (the probe callback's logits at the end of training).
Writes $OUT/formats.json (bench/results/formats.json's rows) and the log.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import gpu_bench as gb

REPO = gb.REPO
SMALL, FP8 = gb.MODELS / "tiny-qwen3-moe", gb.MODELS / "tiny-qwen3-moe-fp8"
# setup -> (recipe, model_name_or_path, merge base)
SETUPS: dict[str, tuple[str, Path, Path | None]] = {   # the rows still missing a figure first: a short budget drops the last
    "amxint4-lora": ("tiny-moe-amxint4-lora.yaml", SMALL, SMALL),
    "bf16-lora": ("tiny-moe-lora.yaml", SMALL, SMALL),
    "bf16-full": ("tiny-moe-full.yaml", SMALL, None),
    "int8-lora": ("tiny-moe-int8-lora.yaml", SMALL, SMALL),
    "fp8-lora": ("tiny-moe-fp8-lora.yaml", FP8, FP8),
    "int8-lora-ephemeral": ("tiny-moe-int8-ephemeral-lora.yaml", SMALL, SMALL),
}
STEPS = 10
EXTRA = ["train.learning_rate=2.0e-3", "train.warmup_ratio=0.0"]


def _json_of(p) -> Any:
    try:
        return json.loads(p.stdout)
    except (json.JSONDecodeError, TypeError):
        return None


def _sets(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out += ["--set", v]
    return out


def prepare_models(res: dict) -> None:
    res["models"] = {"bf16": gb.build_model("small", SMALL)}
    gb.say("build tiny model small as block FP8")
    t = time.monotonic()
    p = gb.sh([gb.PY, "-m", "ktdeploy", "tiny-model", str(FP8), "--data-dir", str(gb.DATA), "--size", "small",
               "--format", "fp8", "--overwrite"], timeout=300)
    res["models"]["fp8"] = {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1),
                            "config": json.loads((FP8 / "config.json").read_text()) if p.returncode == 0 else None,
                            "stderr": p.stderr[-2000:]}
    res["prepare"] = {}
    for fmt in ("int8", "amxint4"):
        t = time.monotonic()
        p = gb.sh([gb.PY, "-m", "ktdeploy", "prepare-weights", "--recipe", str(REPO / f"recipes/tiny-moe-{fmt}-lora.yaml"),
                   "--json"], timeout=300)
        res["prepare"][fmt] = {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1), "summary": _json_of(p),
                               "stderr": p.stderr[-2500:]}
        gb.say(f"prepare-weights {fmt}: rc={p.returncode} {p.stdout[-600:]} {p.stderr[-800:] if p.returncode else ''}")


def plan(recipe: Path, sets: list[str]) -> dict:
    p = gb.sh([gb.PY, "-m", "ktdeploy", "plan", str(recipe), *_sets(sets), "--json"], timeout=120)
    d = _json_of(p) or {}
    return {"host_gib": d.get("host_memory_gib"), "gpu_gib": d.get("gpu_memory_gib_per_gpu"),
            "band": d.get("error_band"), "rc": p.returncode, "stderr": p.stderr[-800:] if p.returncode else ""}


def compare_merged(base: Path, merged: Path, probe: Path, fp8: bool) -> dict:
    """The merged model (transformers on the GPU, no KT, no adapter) against the KT logits recorded at the end of
    training, and the base alone against them (how far training moved the model)."""
    import torch
    from check_adapter import compare, logits_for
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ref = load_file(str(probe))
    n = len([k for k in ref if k.startswith("logits.")])
    ids = [ref[f"input_ids.{i}"] for i in range(n)]
    kt = [ref[f"logits.{i}"].float() for i in range(n)]
    out: dict = {"prompts": n, "positions": sum(int(x.shape[0]) for x in ids)}
    m = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.bfloat16).to("cuda").eval()
    out["merged_vs_kt"] = compare(logits_for(m, ids), kt)
    del m
    kw: dict = {}
    if fp8:
        from transformers import FineGrainedFP8Config

        kw["quantization_config"] = FineGrainedFP8Config(dequantize=True)
    b = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16, **kw).to("cuda").eval()
    out["base_vs_kt"] = compare(logits_for(b, ids), kt)
    del b
    torch.cuda.empty_cache()
    return out


def one(name: str, work: Path, res: dict, left: float = 1e9) -> dict:
    recipe_name, model, merge_base = SETUPS[name]
    recipe = REPO / "recipes" / recipe_name
    row: dict[str, Any] = {"setup": name, "recipe": f"recipes/{recipe_name}"}
    sets = [f"train.output_dir={gb.OUTPUT / name}", f"train.model_name_or_path={model}", *EXTRA]
    row["plan"] = plan(recipe, sets)
    r = gb.ktdeploy_train(name, model, STEPS, work / "logs", 240, extra=EXTRA, probe=merge_base is not None,
                          recipe=recipe)
    row["train"] = {k: r.get(k) for k in ("rc", "wall_s", "steps", "loss_first", "loss_last", "tokens_per_s",
                                          "steady_tokens_per_s", "median_step_tokens_per_s", "peak_host_rss_gib",
                                          "peak_gpu_used_gib_nvsmi", "peak_gpu_alloc_gib", "artifacts", "tail",
                                          "summary", "train_yaml")}
    row["losses"] = _losses(gb.OUTPUT / name)
    if r.get("rc") != 0:
        return row
    conv = gb.OUTPUT / f"{name}-{'model' if merge_base is None else 'sglang'}"
    c = gb.sh([gb.PY, "-m", "ktdeploy", "convert", str(gb.OUTPUT / name), "-o", str(conv), "--json"], timeout=300)
    row["convert"] = {"rc": c.returncode, "summary": _json_of(c), "stderr": c.stderr[-1500:]}
    gb.say(f"{name}: convert rc={c.returncode}")
    if c.returncode == 0:
        opt = ["--adapter", str(conv)] if merge_base is not None else ["--weights", str(gb.OUTPUT / name)]
        serve_sets = sets
        if name == "int8-lora-ephemeral":   # its /dev/shm tree is gone: sglang-kt serves from the persistent one
            serve_sets = [*sets, f"train.kt_weight_path={gb.MODELS / 'tiny-qwen3-moe-INT8'}",
                          "train.kt_config.kt_weight_lifecycle=persistent"]
        s = gb.sh([gb.PY, "-m", "ktdeploy", "serve", str(recipe), *_sets(serve_sets), *opt, "--print", "--json"],
                  timeout=120)
        row["serve"] = {"rc": s.returncode, "argv": (_json_of(s) or {}).get("argv"), "stderr": s.stderr[-1500:]}
    if merge_base is not None and left > 150:   # a merge and its GPU check: ~20 s on the tiny model
        merged = gb.OUTPUT / f"{name}-merged"
        t = time.monotonic()
        m = gb.sh([gb.PY, "-m", "ktdeploy", "merge", str(gb.OUTPUT / name), "--base", str(merge_base), "-o",
                   str(merged), "--json"], timeout=300)
        row["merge"] = {"rc": m.returncode, "seconds": round(time.monotonic() - t, 1), "summary": _json_of(m),
                        "stderr": m.stderr[-2000:]}
        gb.say(f"{name}: merge rc={m.returncode} {m.stderr[-600:] if m.returncode else ''}")
        probe = gb.OUTPUT / f"{name}.probe_logits.safetensors"
        if m.returncode == 0 and probe.exists():
            try:
                row["merge"]["compare"] = compare_merged(merge_base, merged, probe, merge_base == FP8)
                gb.say(f"{name}: merged vs KT {json.dumps(row['merge']['compare'])[:600]}")
            except Exception as err:  # keep the row
                row["merge"]["compare_error"] = repr(err)[:2000]
        shutil.rmtree(merged, ignore_errors=True)   # the GPU machine's disk: the numbers are what we keep
    return row


def _losses(out_dir: Path) -> list:
    p = out_dir / "trainer_log.jsonl"
    rows = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in d:
                rows.append([d.get("current_steps"), d["loss"]])
    return rows


def summary_row(row: dict) -> dict:
    """One object of bench/results/formats.json."""
    t = row.get("train") or {}
    merge = row.get("merge") or {}
    cmp = merge.get("compare") or {}
    return {
        "setup": row["setup"], "rc": t.get("rc"), "steps": t.get("steps"), "loss_first": t.get("loss_first"),
        "loss_last": t.get("loss_last"), "tokens_per_s": t.get("steady_tokens_per_s") or t.get("tokens_per_s"),
        "host_peak_gib": t.get("peak_host_rss_gib"), "gpu_peak_gib": t.get("peak_gpu_used_gib_nvsmi"),
        "planned_host_gib": row["plan"].get("host_gib"), "planned_gpu_gib": row["plan"].get("gpu_gib"),
        "converted": (row.get("convert") or {}).get("rc") == 0,
        "serve_argv_ok": None,   # filled in by sglang-kt's own parser in the full image (bench/gpu/formats_serve.py)
        "merged": (merge.get("rc") == 0) if merge else None,
        "merged_vs_kt_rel_l2": (cmp.get("merged_vs_kt") or {}).get("rel_l2_mean"),
        "merged_vs_kt_argmax": (cmp.get("merged_vs_kt") or {}).get("argmax_agree"),
    }


def run(work: Path, budget: float, t0: float) -> dict:
    res: dict = {"setups": []}
    prepare_models(res)
    order = list(SETUPS)
    for name in order:
        if budget - (time.monotonic() - t0) < 50:
            gb.say(f"budget: {name} not run")
            res["setups"].append({"setup": name, "skipped": "budget", "plan": {}})
            continue
        try:
            res["setups"].append(one(name, work, res, budget - (time.monotonic() - t0)))
        except Exception as err:
            import traceback

            res["setups"].append({"setup": name, "error": traceback.format_exc()[-3000:], "plan": {}})
            gb.say(f"{name}: ERROR {err}")
    res["formats"] = [summary_row(r) for r in res["setups"] if "train" in r]
    return res


if __name__ == "__main__":
    import sys

    sys.exit(gb.main({"formats": run}))
