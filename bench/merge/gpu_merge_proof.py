#!/usr/bin/env python3
"""GPU proof of `ktdeploy merge`: a real KT LoRA, merged, against the KT model with the adapter.

On the GPU machine (device tool, nvidia-h200; one call), from a copy of this repository with the slimmed KT SFT
wheels in bench/gpu/.carry/wheels (bench/gpu/fetch_wheels.py):

    python3 bench/merge/gpu_merge_proof.py --out "$OUT"

1. bench/gpu/gpu_bench.py's proof: installs the wheels, builds the tiny Qwen3-MoE, runs `ktdeploy train
   recipes/tiny-moe-lora.yaml` (real KT: attention LoRA on the GPU through PEFT, routed experts and their LoRA on the
   CPU through kt-kernel AMX BF16), whose probe callback records the fine-tuned KT model's logits on the held-out
   prompts; then `ktdeploy convert` and check_adapter.py (base + converted adapter in plain PyTorch vs KT).
2. `ktdeploy merge OUTPUT --base MODEL -o MERGED` (numpy, on this machine's CPU).
3. The merged folder loaded with transformers on the GPU, no adapter, no KT: its logits on the same input ids
   against the KT logits (BF16 compute, as served, and float32 compute of the same BF16 weights), and against
   base + adapter in plain PyTorch. Pass: mean relative L2 error <= 1e-2 and argmax agreement >= 99 % (BF16).
Results: $OUT/gpu_merge_proof.json and the log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench" / "gpu")]

import gpu_bench as gb  # noqa: E402

TOL, ARGMAX = 1e-2, 0.99


def compare_merged(model_dir: Path, merged_dir: Path, adapter_dir: Path, probe: Path, device: str) -> dict:
    import torch
    from check_adapter import Patch, compare, load_adapter, logits_for
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ref = load_file(str(probe))
    n = len([k for k in ref if k.startswith("logits.")])
    ids = [ref[f"input_ids.{i}"] for i in range(n)]
    kt = [ref[f"logits.{i}"].float() for i in range(n)]
    out: dict = {"prompts": n, "positions": sum(int(x.shape[0]) for x in ids), "device": device}
    scaling, linear, experts = load_adapter(adapter_dir)
    for label, dtype in (("bf16", torch.bfloat16), ("float32", torch.float32)):
        merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=dtype).to(device).eval()
        got = logits_for(merged, ids)
        del merged
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        p = Patch(base, scaling, linear, experts, use_experts=True)
        adapted = logits_for(base, ids)
        p.remove()
        plain = logits_for(base, ids)
        del base
        if device == "cuda":
            torch.cuda.empty_cache()
        out[label] = {"merged_vs_kt": compare(got, kt), "base_plus_adapter_vs_kt": compare(adapted, kt),
                      "merged_vs_base_plus_adapter": compare(got, adapted), "base_vs_kt": compare(plain, kt)}
    m = out["bf16"]["merged_vs_kt"]
    out["passed"] = bool(m["rel_l2_mean"] <= TOL and m["argmax_agree"] >= ARGMAX)
    out["rule"] = f"bf16 merged vs KT: mean relative L2 <= {TOL}, argmax agreement >= {ARGMAX}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/ktdeploy-merge-out")))
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      TOKENIZERS_PARALLELISM="false", PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    work = Path("/tmp/ktdeploy-merge-proof")
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"how": "python3 bench/merge/gpu_merge_proof.py (device tool, nvidia-h200)"}
    t0 = time.monotonic()
    try:
        res["setup"] = gb.setup()
        res["machine"] = {"nproc": os.cpu_count(), "gpu": gb.sh("nvidia-smi --query-gpu=name,memory.total,"
                                                                 "driver_version --format=csv,noheader").stdout.strip()}
        res["proof"] = gb.proof(work, steps=args.steps, timeout=300)
        name = "proof-small"
        out_dir, model = gb.OUTPUT / name, gb.MODELS / "tiny-qwen3-moe"
        merged = gb.OUTPUT / f"{name}-merged"
        gb.say("merge")
        t = time.monotonic()
        m = gb.sh([gb.PY, "-m", "ktdeploy", "merge", str(out_dir), "--base", str(model), "-o", str(merged), "--json"],
                  timeout=300)
        res["merge"] = {"rc": m.returncode, "seconds": round(time.monotonic() - t, 1),
                        "summary": json.loads(m.stdout) if m.returncode == 0 else None, "stderr": m.stderr[-3000:]}
        gb.say(f"merge rc={m.returncode} {m.stderr[-800:]}")
        if m.returncode == 0:
            res["merge"]["manifest"] = json.loads((merged / "ktdeploy_merge.json").read_text())
            res["compare"] = compare_merged(model, merged, gb.OUTPUT / f"{name}-sglang",
                                            gb.OUTPUT / f"{name}.probe_logits.safetensors", "cuda")
            gb.say(f"compare: {json.dumps(res['compare'])[:1500]}")
    except Exception:  # keep whatever was measured
        res["error"] = traceback.format_exc()
        gb.say("ERROR " + res["error"][-1500:])
    res["wall_s"] = round(time.monotonic() - t0, 1)
    (args.out / "gpu_merge_proof.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (args.out / "gpu_merge_proof_log.txt").write_text("\n".join(gb.LOG) + "\n")
    return 0 if (res.get("compare") or {}).get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
