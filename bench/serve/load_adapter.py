#!/usr/bin/env python3
"""Serve-side loading of a `ktdeploy convert` adapter with sglang-kt's own LoRA code, on CPU (issue 14 item 3).

NOT RUN YET: needs the full ktsft image (sglang-kt 0.7.2, torch 2.9.1), which the CI machine does not build.
Run (writes bench/results/serve/load_adapter.json):

    docker run --rm -v "$PWD:/w" -w /w --entrypoint python3 ktsft:avx512 bench/serve/load_adapter.py \
        --adapter bench/results/serve/adapter --out bench/results/serve/load_adapter.json

If --adapter does not exist it is made here: the KT layout of the GPU machine's tiny run
(tests/fakes/kt_layout.py; or a real output via --kt-output DIR) converted by the real `ktdeploy convert`.

What it does, step by step (each step's outcome is recorded; the first failure stops it and says where):
1. sglang's LoRAConfig reads adapter_config.json (target modules, r, alpha);
2. sglang's LoRAAdapter(...).initialize_weights() reads adapter_model.safetensors on CPU;
3. every tensor name is matched against the tiny Qwen3-MoE's module names (transformers' meta-device model
   built from the config ktdeploy tiny-model writes): consumed = matched to a module, and shapes agree with
   that module's in/out features and r;
4. the expert part: names `model.layers.L.mlp.experts.E.{gate,up,down}_proj.lora_{A,B}.weight` are grouped the
   way sglang-kt's KT MoE wrapper expects (per layer, E experts x 3 projections) and counted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def step(report, name, fn):
    try:
        report["steps"].append({"step": name, "ok": True, "result": fn()})
        return True
    except Exception as err:  # noqa: BLE001 - a bench records where it stopped
        report["steps"].append({"step": name, "ok": False, "error": f"{type(err).__name__}: {err}",
                                "where": traceback.format_exc().splitlines()[-3:]})
        report["stopped_at"] = name
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", type=Path, required=True)
    ap.add_argument("--kt-output", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    report: dict = {"adapter": str(a.adapter), "steps": []}
    if not (a.adapter / "adapter_config.json").exists():
        from ktdeploy.agent.convert import convert
        from tests.fakes import kt_layout

        src = a.kt_output
        if src is None:
            src = Path(tempfile.mkdtemp()) / "out"
            kt_layout.write_lora_adapter(str(src), base="/srv/ktdeploy/models/tiny-qwen3-moe")
        report["converted_from"] = str(src)
        convert(src, a.adapter)

    state: dict = {}

    def cfg():
        from sglang.srt.lora.lora_config import LoRAConfig
        state["cfg"] = LoRAConfig(str(a.adapter))
        return {"r": state["cfg"].r, "alpha": state["cfg"].lora_alpha, "targets": sorted(state["cfg"].target_modules)}

    def weights():
        from safetensors.torch import load_file
        state["w"] = load_file(str(a.adapter / "adapter_model.safetensors"), device="cpu")
        return {"tensors": len(state["w"])}

    def match():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from ktdeploy.agent.tiny import SIZES
        d = SIZES["small"].config_dict()
        conf = AutoConfig.for_model(d.pop("model_type"), **d)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(conf)
        mods = dict(model.named_modules())
        unmatched, bad = [], []
        for k, t in state["w"].items():
            mod = re.sub(r"\.lora_[AB]\.weight$", "", k)
            m = mods.get(mod)
            if m is None:
                unmatched.append(k)
                continue
            lin_in, lin_out = getattr(m, "in_features", None), getattr(m, "out_features", None)
            if lin_in is not None and ((".lora_A." in k and t.shape[1] != lin_in) or (".lora_B." in k and t.shape[0] != lin_out)):
                bad.append((k, list(t.shape), lin_in, lin_out))
        if unmatched or bad:
            raise AssertionError(f"{len(unmatched)} unmatched (e.g. {unmatched[:3]}), {len(bad)} shape mismatches {bad[:3]}")
        return {"consumed": len(state["w"]), "unmatched": 0}

    def experts():
        pat = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.lora_[AB]\.weight$")
        layers: dict = {}
        for k in state["w"]:
            m = pat.search(k)
            if m:
                layers.setdefault(int(m.group(1)), set()).add((int(m.group(2)), m.group(3)))
        return {str(L): len(v) for L, v in sorted(layers.items())}

    for name, fn in (("sglang LoRAConfig", cfg), ("read weights (CPU)", weights), ("match to modules", match),
                     ("expert grouping", experts)):
        if not step(report, name, fn):
            break
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, indent=2, default=str))
    return 0 if "stopped_at" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
