#!/usr/bin/env python3
"""bench/results/formats.json (one object per cookbook setup) from the GPU machine's files in bench/results/formats/,
with each serve argv parsed by sglang-kt's own argument parser in the full image (here: no GPU needed).

    python3 bench/gpu/formats_summary.py [--image ktsft:amx]

Sources (all committed):
- gpu_formats_results.json / gpu_formats_log.txt: `bash bench/gpu/device.sh formats 200` (bench/gpu/formats.py) on
  the GPU machine (device tool; it came up as an H100), 2026-12-07: prepare-weights INT8/AMXINT4, then
  `ktdeploy train` + convert for int8-lora, fp8-lora, int8-lora-ephemeral (amxint4-lora was refused there by
  doctor's weights.converted check: a ktdeploy bug, fixed since, see below); the 200 s budget left out bf16-lora and
  bf16-full.
- amxint4.log / amxint4_trainer_log.jsonl: the same warm machine, `ktdeploy train recipes/tiny-moe-amxint4-lora.yaml
  --skip-doctor` (the doctor bug above), 10 steps.
- merges.json / fp8_merge.json: the same machine, `ktdeploy merge` of each LoRA output into the model folder it read
  its weights from, then the merged model's logits (transformers, GPU, no KT) against the KT model with the adapter
  (probe logits recorded at the end of training): 161 positions of 8 held-out prompts.
- amx_*.json, serve_*.json: convert, serve --print --json and merge on the same machine.
- bf16-lora / bf16-full: earlier committed GPU runs (H200), cited per row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from ktdeploy.core.trainer_log import parse_log, steady_tokens_per_s

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "bench/results/formats"
OUT = ROOT / "bench/results/formats.json"
PARSE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.argv[1]):
    try:
        ns = parser.parse_args(argv)
        out.append({"ok": True, "kt_method": ns.kt_method, "kt_weight_path": ns.kt_weight_path,
                    "enable_lora": ns.enable_lora})
    except SystemExit as e:
        out.append({"ok": False, "error": str(e)})
print(json.dumps(out))
"""


def _load(name: str):
    p = SRC / name
    return json.loads(p.read_text()) if p.exists() else None


def parse_argvs(image: str, argvs: list[list[str]]) -> list[dict]:
    flags = [a[3:] for a in argvs]   # python3 -m ktdeploy.agent.sglang_launch: sglang's own parser, same flags
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", PARSE,
                        json.dumps(flags)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"sglang-kt's parser did not run in {image}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="ktsft:amx")
    args = ap.parse_args()
    res = _load("gpu_formats_results.json")
    merges = _load("merges.json") or {}
    fp8m = _load("fp8_merge.json") or {}
    by = {r["setup"]: r for r in res["setups"]}
    serve = {"int8-lora": _load("serve_int8-lora.json"), "fp8-lora": _load("serve_fp8-lora.json"),
             "int8-lora-ephemeral": _load("serve_int8-lora-ephemeral.json"), "amxint4-lora": _load("amx_serve.json")}
    argvs = {k: v["argv"] for k, v in serve.items() if v}
    parsed = dict(zip(argvs, parse_argvs(args.image, list(argvs.values())), strict=True))
    rows = []
    for setup in ("int8-lora", "fp8-lora", "int8-lora-ephemeral"):
        r = by[setup]
        t = r["train"]
        m = merges.get(setup) or {}
        cmp = (fp8m if setup == "fp8-lora" else (m.get("compare") or {})).get("merged_vs_kt") or {}
        rows.append({"setup": setup, "rc": t["rc"], "steps": t["steps"], "loss_first": t["loss_first"],
                     "loss_last": t["loss_last"], "tokens_per_s": t["steady_tokens_per_s"],
                     "host_peak_gib": t["peak_host_rss_gib"], "gpu_peak_gib": t["peak_gpu_used_gib_nvsmi"],
                     "planned_host_gib": r["plan"]["host_gib"], "planned_gpu_gib": r["plan"]["gpu_gib"],
                     "converted": r["convert"]["rc"] == 0, "serve_argv_ok": parsed[setup]["ok"],
                     "kt_method": parsed[setup].get("kt_method"), "merged": m.get("rc") == 0,
                     "merged_vs_kt_rel_l2": cmp.get("rel_l2_mean"), "merged_vs_kt_argmax": cmp.get("argmax_agree"),
                     "machine": res["machine"]["gpu"], "source": "bench/results/formats/gpu_formats_results.json"})
    text = (SRC / "amxint4_trainer_log.jsonl").read_text()
    amx = [json.loads(line) for line in text.splitlines()]
    losses = [x["loss"] for x in amx if x.get("loss") is not None]
    rate = steady_tokens_per_s(parse_log(text), 1)   # LlamaFactory's whole-second clock: coarse on 10 steps
    steady = round(rate, 1) if rate is not None else None
    conv = _load("amx_convert.json")
    amerge = _load("amx_merge.json")
    rows.append({"setup": "amxint4-lora", "rc": 0, "steps": amx[-1].get("current_steps"), "loss_first": losses[0],
                 "loss_last": losses[-1], "tokens_per_s": steady, "host_peak_gib": None, "gpu_peak_gib": None,
                 "planned_host_gib": by["amxint4-lora"]["plan"]["host_gib"],
                 "planned_gpu_gib": by["amxint4-lora"]["plan"]["gpu_gib"], "converted": conv is not None,
                 "serve_argv_ok": parsed["amxint4-lora"]["ok"], "kt_method": parsed["amxint4-lora"].get("kt_method"),
                 "merged": amerge is not None, "merged_vs_kt_rel_l2": None, "merged_vs_kt_argmax": None,
                 "machine": res["machine"]["gpu"],
                 "note": "trained with --skip-doctor (doctor's weights.converted did not know prepare-weights' "
                         "_layer_N tree; fixed since); run directly, not sampled from outside: no peaks; no probe, "
                         "so no merged-vs-KT figure",
                 "source": "bench/results/formats/amxint4.log"})
    rows += earlier_bf16()
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    return 0


def earlier_bf16() -> list[dict]:
    """BF16 LoRA and BF16 full fine-tuning: their runs from earlier sessions (H200), as committed."""
    full = json.loads((ROOT / "bench/results/gpu/full_results.json").read_text())
    p = full["proof"]["train"]
    merge = json.loads((ROOT / "bench/results/merge/gpu/gpu_merge_proof.json").read_text())
    m = ((merge.get("compare") or {}).get("bf16") or {}).get("merged_vs_kt") or {}
    vs = json.loads((ROOT / "bench/results/gpu/vocab_scale/vocab_results.json").read_text())
    fr = _find(vs, "v152-full-es")
    return [
        {"setup": "bf16-lora", "rc": p["rc"], "steps": p["steps"], "loss_first": p["loss_first"],
         "loss_last": p["loss_last"], "tokens_per_s": p["steady_tokens_per_s"], "host_peak_gib": p["peak_host_rss_gib"],
         "gpu_peak_gib": p["peak_gpu_used_gib_nvsmi"], "planned_host_gib": None, "planned_gpu_gib": None,
         "converted": full["proof"]["convert"]["rc"] == 0, "serve_argv_ok": True, "kt_method": "AMXBF16",
         "merged": bool(merge), "merged_vs_kt_rel_l2": m.get("rel_l2_mean"), "merged_vs_kt_argmax": m.get("argmax_agree"),
         "machine": "NVIDIA H200 (earlier session)",
         "source": "bench/results/gpu/full_results.json (proof), bench/results/merge/gpu/gpu_merge_proof.json; serve argv: "
                   "tests/integration/test_serve_args_image.py"},
        {"setup": "bf16-full", "rc": fr.get("rc"), "steps": fr.get("steps"), "loss_first": fr.get("loss_first"),
         "loss_last": fr.get("loss_last"), "tokens_per_s": fr.get("steady_tokens_per_s"),
         "host_peak_gib": fr.get("peak_host_rss_gib"), "gpu_peak_gib": fr.get("peak_gpu_used_gib_nvsmi"),
         "planned_host_gib": None, "planned_gpu_gib": None, "converted": None, "serve_argv_ok": None,
         "kt_method": "BF16", "merged": None, "merged_vs_kt_rel_l2": None, "merged_vs_kt_argmax": None,
         "machine": "NVIDIA H200 (earlier session)",
         "note": "3 steps only, below the 8 asked: the >= 8-step rerun (recipes/tiny-moe-full.yaml, in "
                 "bench/gpu/formats.py) did not fit this session's GPU time",
         "source": "bench/results/gpu/vocab_scale/vocab_results.json (v152-full-es: 0.9 B params, vocab 151936); "
                   "a full fine-tune needs no merge (convert makes the model folder: docs/serving-full-finetune.md)"},
    ]


def _find(x: object, name: str) -> dict:
    if isinstance(x, dict):
        if x.get("name") == name:
            return x
        x = list(x.values())
    if isinstance(x, list):
        for v in x:
            found = _find(v, name)
            if found:
                return found
    return {}


if __name__ == "__main__":
    raise SystemExit(main())


def table(rows: list[dict]) -> str:
    """The docs' rendering of bench/results/formats.json (docs/weight-formats.md, checked by a test)."""
    def f(v: object) -> str:
        return "-" if v is None else str(v)

    out = ["| setup | steps | loss first -> last | tokens/s | host peak GiB (plan) | GPU peak GiB (plan) | converted | "
           "serve argv: sglang-kt's parser | merged vs KT: rel. L2 / argmax | machine |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        merged = "-" if not r["merged"] else ("merged, no probe" if r["merged_vs_kt_rel_l2"] is None else
                                              f"{r['merged_vs_kt_rel_l2'] * 100:.2f} % / {r['merged_vs_kt_argmax'] * 100:.1f} %")
        argv = "-" if r["serve_argv_ok"] is None else ("parses" if r["serve_argv_ok"] else "REFUSED") + f" ({r['kt_method']})"
        out.append(f"| {r['setup']} | {f(r['steps'])} | {f(r['loss_first'])} -> {f(r['loss_last'])} | "
                   f"{f(r['tokens_per_s'])} | {f(r['host_peak_gib'])} ({f(r['planned_host_gib'])}) | "
                   f"{f(r['gpu_peak_gib'])} ({f(r['planned_gpu_gib'])}) | {f(r['converted'])} | {argv} | {merged} | "
                   f"{r['machine'].split(',')[0]} |")
    return "\n".join(out)
