#!/usr/bin/env python3
"""bench/results/formats.json (one object per cookbook setup) from the GPU machine's files in bench/results/formats/,
with each serve argv parsed by sglang-kt's own argument parser in the full image (here: no GPU needed).

    python3 bench/gpu/formats_summary.py [--image ktsft:amx]

Sources (all committed):
- run-20261207/: `bash bench/gpu/device.sh formats 375` (bench/gpu/formats.py) on the GPU machine (device tool: one
  H100, 16-vCPU AMX Xeon VM), 2026-12-07, all six setups side by side on one machine: prepare-weights INT8/AMXINT4,
  then per setup `ktdeploy plan`, `ktdeploy train` (10 steps, peaks sampled from outside), `ktdeploy convert`,
  `ktdeploy serve --print --json`, and for LoRA setups `ktdeploy merge` with the merged model's logits (transformers,
  GPU, no KT) against the KT model with the adapter (probe logits recorded at the end of training: 161 positions of
  8 held-out prompts) while the budget lasted (amxint4-lora, bf16-lora, int8-lora).
- merges.json / fp8_merge.json: the merges of fp8-lora and int8-lora-ephemeral from the earlier formats run on an
  H100 of the same kind (gpu_formats_results.json / gpu_formats_log.txt, 2026-12-07, same recipes, same tiny model
  and seeds: the same loss curve 8.375 -> 6.90625); cited per row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

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


RUN = "run-20261207/gpu_formats_results.json"
ORDER = ("bf16-lora", "bf16-full", "fp8-lora", "int8-lora", "int8-lora-ephemeral", "amxint4-lora")


def _merge_figures(setup: str, run_merge: dict) -> tuple[object, object, str | None]:
    """(rel. L2, argmax agreement, note) of the merged model vs the KT model: this run's, else the earlier run's."""
    if run_merge.get("rc") == 0:
        c = (run_merge.get("compare") or {}).get("merged_vs_kt") or {}
        return c.get("rel_l2_mean"), c.get("argmax_agree"), None
    earlier = (_load("fp8_merge.json") or {}) if setup == "fp8-lora" else \
        ((_load("merges.json") or {}).get(setup) or {}).get("compare") or {}
    c = earlier.get("merged_vs_kt") or {}
    if not c:
        return None, None, None
    return c.get("rel_l2_mean"), c.get("argmax_agree"), (
        "merge figure from the earlier formats run (bench/results/formats/merges.json, fp8_merge.json): this run's "
        "budget ended before its merge")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="ktsft:amx")
    args = ap.parse_args()
    res = _load(RUN)
    by = {r["setup"]: r for r in res["setups"]}
    argvs = {k: (by[k].get("serve") or {}).get("argv") for k in ORDER}
    argvs = {k: v for k, v in argvs.items() if v}
    parsed = dict(zip(argvs, parse_argvs(args.image, list(argvs.values())), strict=True))
    rows = []
    for setup in ORDER:
        r = by[setup]
        t = r["train"]
        lora = setup != "bf16-full"
        rel, agree, note = _merge_figures(setup, r.get("merge") or {}) if lora else (None, None, None)
        row = {"setup": setup, "rc": t["rc"], "steps": t["steps"], "loss_first": t["loss_first"],
               "loss_last": t["loss_last"], "tokens_per_s": t["steady_tokens_per_s"],
               "host_peak_gib": t["peak_host_rss_gib"], "gpu_peak_gib": t["peak_gpu_used_gib_nvsmi"],
               "planned_host_gib": r["plan"]["host_gib"], "planned_gpu_gib": r["plan"]["gpu_gib"],
               "converted": (r.get("convert") or {}).get("rc") == 0,
               "serve_argv_ok": parsed[setup]["ok"] if setup in parsed else None,
               "kt_method": parsed.get(setup, {}).get("kt_method"),
               "merged": (rel is not None) if lora else None, "merged_vs_kt_rel_l2": rel,
               "merged_vs_kt_argmax": agree, "machine": res["machine"]["gpu"],
               "source": f"bench/results/formats/{RUN}"}
        if note:
            row["note"] = note
        if not lora:
            row["note"] = ("a full fine-tune needs no merge: convert makes the model folder "
                           "(docs/serving-full-finetune.md)")
        rows.append(row)
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    return 0


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
