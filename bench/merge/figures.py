#!/usr/bin/env python3
"""The figures block of docs/serving-merged.md, rendered from the committed results (so it cannot go stale:
tests/unit/agent/merge/test_merge_docs.py renders it again and compares).

    python bench/merge/figures.py --write      # after a new bench/proof run
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "merge"
DOC = ROOT / "docs" / "serving-merged.md"
BEGIN, END = "<!-- merge-figures: rendered by bench/merge/figures.py -->", "<!-- /merge-figures -->"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _cmp(c: dict) -> str:
    return f"{c['rel_l2_mean']:.4f} / {c['argmax_agree'] * 100:.1f} %"


def render() -> str:
    b, c, g = _load("merge_bench.json"), _load("cpu_proof.json"), _load("gpu/gpu_merge_proof.json")
    m = b["model"]
    runs = "; ".join(f"run {r['run']}: copy {r['copy_gb_s']:.2f} GB/s, merge {r['merge_gb_s']:.2f} GB/s, peak RSS "
                     f"{r['merge_peak_rss_mib']:.0f} MiB" for r in b["runs"])
    lines = [
        "**Throughput and memory** (`bench/merge/merge_bench.py`, `bench/results/merge/merge_bench.json`): a generated",
        f"Qwen3-MoE-shaped BF16 model of {m['bytes'] / 1e9:.1f} GB ({m['layers']} layers x {m['experts']} experts,"
        f" hidden {m['hidden']}, {m['shards']} shards) and a KT LoRA for it (r 8, every expert and q/k/v/o/router),",
        f"on this machine's disk ({b['machine']['cpus']} cores, shared), {len(b['runs'])} runs alternating with a "
        "durable plain copy (copyfile + fsync) of the same folder:",
        f"median copy **{b['copy_gb_s_median']:.2f} GB/s**, median merge **{b['merge_gb_s_median']:.2f} GB/s**, "
        f"**merge_over_copy {b['merge_over_copy']:.2f}** ({runs}).",
        f"Peak RSS **{b['peak_rss_mib']:.0f} MiB** against the stated bound {b['rss_bound_mib']:.0f} MiB "
        f"({b['rss_bound']}), for a {m['bytes'] / 2**30:.1f} GiB model.",
    ]
    if "cpu_s_per_gb_median" in b:
        cpu = b["cpu_s_per_gb_median"]
        lines.append(f"CPU per GB (median, load-independent): copy {cpu['copy']:.2f} s, merge {cpu['merge']:.2f} s "
                     f"(1-min load before the runs: {', '.join(str(r['load_1min_before']) for r in b['runs'])}).")
    earlier = sorted(RESULTS.glob("merge_bench-run*.json"))
    if earlier:
        ratios = [json.loads(p.read_text())["merge_over_copy"] for p in earlier] + [b["merge_over_copy"]]
        lines.append("Earlier complete benches, same command: " + "; ".join(
            f"`{p.name}` {r:.3f}" for p, r in zip(earlier, ratios, strict=False)) +
            f"; this one {b['merge_over_copy']:.3f}: **median over the {len(ratios)} benches "
            f"{statistics.median(ratios):.3f}**.")
    lines.append("")
    tt, tf, tu = c["tensors_tiny"], c["tensors_fp8_base"], c["tensors_fused_layout"]
    lg = c["logits"]
    lines += [
        "**CPU proof in the full image** (`bench/merge/cpu_proof.py` in `ktsft:amx`, `bench/results/merge/cpu_proof.json`;"
        " values are mean relative L2 error / argmax agreement over "
        f"{lg['positions']} positions of {lg['prompts']} held-out prompts):",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| tiny model (`ktdeploy tiny-model`), {tt['lora_targets']} merged tensors, {tt['elements']:,} elements: "
        f"bit-identical to PyTorch's `(W.float() + s * (B.float() @ A.float())).to(bfloat16)` | "
        f"{tt['bit_identical_to_pytorch'] * 100:.4f} % (max {tt['max_diff_bf16_ulp']} ulp); untouched tensors "
        f"bit-identical: {tt['untouched_tensors_bit_identical']} |",
        f"| the same, PEFT's order (delta rounded to BF16 first) | {tt['bit_identical_to_peft_order'] * 100:.2f} % |",
        f"| FP8 base (E4M3, 128x128 scales) vs PyTorch's float8_e4m3fn x scale + the same expression | "
        f"{tf['bit_identical_to_pytorch'] * 100:.4f} % (max {tf['max_diff_bf16_ulp']} ulp) |",
        f"| fused `[E, 2I, H]` expert layout vs the same expression | {tu['bit_identical_to_pytorch'] * 100:.4f} % |",
        "| merged model (transformers) vs base + adapter (plain PyTorch hooks), float32 compute | "
        f"{_cmp(lg['merged_f32_vs_base_plus_adapter_f32'])} |",
        "| BF16 compute, each against the exact float32 result: merged model / base + adapter | "
        f"{_cmp(lg['merged_bf16_vs_exact'])} / {_cmp(lg['adapter_bf16_vs_exact'])} |",
        f"| base model alone vs base + adapter | {_cmp(lg['base_vs_exact'])} |",
        "",
    ]
    cg = g["compare"]
    tr = g["proof"]["train"]
    lines += [
        "**GPU proof** (`bench/merge/gpu_merge_proof.py`, one device call on an H200 + 16-vCPU AMX VM,",
        "`bench/results/merge/gpu/`): `ktdeploy train recipes/tiny-moe-lora.yaml` with real KT (loss "
        f"{tr['loss_first']:.3f} -> {tr['loss_last']:.3f} in {tr['steps']} steps), its probe recording the KT",
        f"model's logits on the held-out prompts ({cg['positions']} positions); `ktdeploy merge` "
        f"({g['merge']['seconds']:.1f} s); the merged folder loaded with transformers on the GPU:",
        "",
        "| compared with the KT model + adapter | BF16 compute (as served) | float32 compute |",
        "| --- | --- | --- |",
        f"| merged model | **{_cmp(cg['bf16']['merged_vs_kt'])}** | {_cmp(cg['float32']['merged_vs_kt'])} |",
        f"| base + adapter in plain PyTorch | {_cmp(cg['bf16']['base_plus_adapter_vs_kt'])} | "
        f"{_cmp(cg['float32']['base_plus_adapter_vs_kt'])} |",
        f"| base model alone | {_cmp(cg['bf16']['base_vs_kt'])} | {_cmp(cg['float32']['base_vs_kt'])} |",
        f"| merged model vs base + adapter | {_cmp(cg['bf16']['merged_vs_base_plus_adapter'])} | "
        f"{_cmp(cg['float32']['merged_vs_base_plus_adapter'])} |",
        "",
        f"Rule ({cg['rule']}): **{'passed' if cg['passed'] else 'failed'}**.",
    ]
    return "\n".join([BEGIN, *lines, END])


def write() -> None:
    text = DOC.read_text()
    a, b = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:a] + render() + text[b:])


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(render())
