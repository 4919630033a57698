#!/usr/bin/env python3
"""Serve-side loading of a `ktdeploy convert` adapter with sglang-kt's own code, on CPU (issue 14 item 3).

Run in the full image (sglang-kt 0.7.2; writes bench/results/serve/load_adapter.json):

    docker run --rm -v "$PWD:/w" -w /w -e PYTHONPATH=/w --entrypoint python3 ktsft:amx \\
        bench/serve/load_adapter.py --out bench/results/serve/load_adapter.json

Input: the KT LoRA output of the GPU machine's tiny "small" run. By default tests/fakes/kt_layout.py writes
its layout (names, dtypes, shapes and byte sizes of that run; values are a fixed pattern); with --kt-output DIR
a real output (the four files bench/gpu/overhead.py's P1_THEN_PROOF returns from the GPU machine; their sizes
and sha256s go into the report, and the real convert checks them against the run's own manifest):

    docker run ... ktsft:amx bench/serve/load_adapter.py --kt-output bench/results/serve/real-kt-output \\
        --out bench/results/serve/load_adapter-real.json
The real `ktdeploy convert` (ktdeploy.agent.convert) turns it into the adapter sglang-kt serves.

Steps (each outcome recorded; the first failure stops the run and says where):
1. split: sglang-kt's `server_args._prepare_kt_composite_lora_adapter` (what `--lora-paths NAME=DIR` runs at
   start-up) splits the merged adapter into its expert and non-expert runtime directories;
2. experts: sglang-kt's `kt_ep_wrapper._load_kt_expert_lora_weights` (what each KT MoE layer runs to stage its
   expert LoRA for the CPU kernels) for every MoE layer of the model; every expert tensor must be consumed, each
   into the [experts, ...] buffer of its projection, shapes checked by sglang-kt's code. kt_ep_wrapper cannot be
   imported without libcuda (it imports sgl_kernel), so those four functions are compiled from the installed
   file's own source (read at run time, not copied here) with the module's imports they use;
3. non-expert: sglang's LoRAConfig reads the non-expert directory (r, alpha, target modules); then
   `sglang.srt.lora.lora` (LoRAAdapter) is imported, which needs libcuda: where the CPU run stops is recorded;
   each non-expert tensor is matched to the model's module of that name and its in/out features (transformers'
   Qwen3-MoE on the meta device, the config the run trained), so every tensor is consumed by a module.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import re
import sys
import tempfile
import traceback
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

EXPERT_FUNCS = ("_load_adapter_config", "_find_adapter_weight_file", "_get_expert_lora_tensor",
                "_load_kt_expert_lora_weights")


def step(report: dict, name: str, fn) -> bool:
    try:
        report["steps"].append({"step": name, "ok": True, "result": fn()})
        return True
    except Exception as err:  # noqa: BLE001 - a bench records where it stopped
        report["steps"].append({"step": name, "ok": False, "error": f"{type(err).__name__}: {err}"[:2000],
                                "where": [ln for ln in traceback.format_exc().splitlines() if ln.strip().startswith("File")][-6:]})
        report["stopped_at"] = name
        return False


def sglang_kt_expert_loader():
    """sglang-kt's expert LoRA loader, compiled from the installed kt_ep_wrapper.py (module import needs libcuda)."""
    import importlib.util

    import torch

    # found without importing: sglang.srt.layers.moe's __init__ already imports sgl_kernel
    root = importlib.util.find_spec("sglang").submodule_search_locations[0]
    origin = str(Path(root) / "srt/layers/moe/kt_ep_wrapper.py")
    src = Path(origin).read_text()
    tree = ast.parse(src)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in EXPERT_FUNCS)
            or (isinstance(n, ast.ClassDef) and n.name == "KTExpertLoraWeights")]
    cache = [n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") ==
             "_KT_LORA_STATE_DICT_CACHE"]
    mod = ast.Module(body=[*keep, *cache], type_ignores=[])
    ns = {"torch": torch, "json": json, "Path": Path, "dataclass": dataclasses.dataclass,
          "logger": logging.getLogger("kt_ep_wrapper"), **{k: getattr(typing, k) for k in
                                                           ("Dict", "List", "Optional", "Tuple", "Any")}}
    exec(compile(mod, origin, "exec"), ns)  # noqa: S102 - sglang-kt's own installed source
    found = sorted(n.name for n in keep)
    assert set(EXPERT_FUNCS) <= set(found), f"kt_ep_wrapper.py lacks {set(EXPERT_FUNCS) - set(found)}"
    return ns, origin


class Tracking(dict):
    """A state dict that remembers which keys were read."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", type=Path, help="a converted adapter (default: convert one here)")
    ap.add_argument("--kt-output", type=Path, help="a real KT LoRA output to convert (default: the recorded layout)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from tests.fakes import kt_layout

    m = kt_layout.SMALL
    report: dict = {"model": {"hidden": m["hidden"], "layers": m["layers"], "experts": m["experts"],
                              "moe_inter": m["moe_inter"]}, "steps": []}
    state: dict = {}
    work = Path(tempfile.mkdtemp())

    def convert():
        from ktdeploy.agent.convert import convert as kt_convert

        adapter = a.adapter
        if adapter is None:
            src = a.kt_output
            if src is None:
                src = work / "out"
                kt_layout.write_lora_adapter(str(src), base="/srv/ktdeploy/models/tiny-qwen3-moe")
                report["input"] = "tests/fakes/kt_layout.py (the GPU machine's 'small' run layout; fixed values)"
            else:
                import hashlib

                report["input"] = str(src)
                report["input_files"] = {f.name: {"size": f.stat().st_size,
                                                  "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
                                         for f in sorted(src.iterdir()) if f.is_file()}
            adapter = work / "out-sglang"
            s = kt_convert(src, adapter)
            report["convert"] = dataclasses.asdict(s) if dataclasses.is_dataclass(s) else str(s)
        state["adapter"] = adapter
        from safetensors import safe_open
        with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
            state["keys"] = sorted(f.keys())
        return {"adapter_tensors": len(state["keys"])}

    def split():
        import os

        from sglang.srt.server_args import _prepare_kt_composite_lora_adapter

        os.environ["SGLANG_KT_LORA_CACHE_DIR"] = str(work / "kt-lora-cache")
        prepared = _prepare_kt_composite_lora_adapter(str(state["adapter"]))
        assert prepared is not None, "sglang-kt did not recognise a merged KT adapter (no expert tensors?)"
        state["expert_dir"], state["nonexpert_dir"] = map(Path, prepared)
        from safetensors import safe_open
        counts = {}
        for k in ("expert_dir", "nonexpert_dir"):
            with safe_open(str(state[k] / "adapter_model.safetensors"), "pt") as f:
                state[k + "_keys"] = set(f.keys())
            counts[k] = len(state[k + "_keys"])
        assert counts["expert_dir"] + counts["nonexpert_dir"] == len(state["keys"]), counts
        return counts

    def experts():
        from safetensors.torch import load_file

        ns, origin = sglang_kt_expert_loader()
        wfile = ns["_find_adapter_weight_file"](state["expert_dir"])
        sd = Tracking(load_file(str(wfile), device="cpu"))
        ns["_KT_LORA_STATE_DICT_CACHE"][str(wfile)] = sd
        shapes = {}
        for layer in range(m["layers"]):
            w = ns["_load_kt_expert_lora_weights"](str(state["expert_dir"]), layer, m["experts"], m["hidden"],
                                                   m["moe_inter"])
            shapes[layer] = {f: list(getattr(w, f).shape) for f in ("gate_lora_a", "gate_lora_b", "up_lora_a",
                                                                     "up_lora_b", "down_lora_a", "down_lora_b")}
            assert all(getattr(w, f).abs().sum() > 0 for f in shapes[layer]), f"layer {layer}: an empty buffer"
        unread = sorted(set(sd) - sd.read)
        assert not unread, f"{len(unread)} expert tensors not consumed, e.g. {unread[:3]}"
        return {"source": origin, "layers": len(shapes), "consumed": len(sd.read), "of": len(sd),
                "rank": w.rank, "alpha": w.alpha, "layer0_shapes": shapes[0]}

    def nonexpert_config():
        from sglang.srt.lora.lora_config import LoRAConfig

        c = LoRAConfig(str(state["nonexpert_dir"]))
        return {"r": c.r, "alpha": c.lora_alpha, "targets": sorted(c.target_modules)}

    def lora_adapter_import():
        try:
            import sglang.srt.lora.lora  # noqa: F401
        except ImportError as e:
            chain = [ln.strip().split('"')[1].split("site-packages/")[-1] + ":" + ln.split("line ")[1].split(",")[0]
                     for ln in traceback.format_exc().splitlines() if ln.strip().startswith('File "/opt')]
            return {"imported": False, "stops_here_on_cpu": f"ImportError: {str(e).strip()[:200]}",
                    "import_chain": chain[-6:]}
        return {"imported": True}

    def nonexpert_match():
        import torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = {"hidden_size": m["hidden"], "num_hidden_layers": m["layers"], "num_experts": m["experts"],
               "moe_intermediate_size": m["moe_inter"], "num_attention_heads": m["heads"],
               "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"], "vocab_size": m["vocab"],
               "num_experts_per_tok": m["top_k"], "intermediate_size": m["moe_inter"] * 4, "decoder_sparse_step": 1}
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **cfg))
        mods = dict(model.named_modules())
        w = load_file(str(state["nonexpert_dir"] / "adapter_model.safetensors"), device="cpu")
        unmatched, bad = [], []
        for k, t in w.items():
            name = re.sub(r"^base_model\.model\.", "", re.sub(r"\.lora_[AB](\.default)?\.weight$", "", k))
            mod = mods.get(name)
            if mod is None:
                unmatched.append(k)
                continue
            fin, fout = getattr(mod, "in_features", None), getattr(mod, "out_features", None)
            if fin is None and hasattr(mod, "weight"):        # the MoE router (Qwen3MoeTopKRouter)
                fout, fin = mod.weight.shape
            if (".lora_A" in k and t.shape[1] != fin) or (".lora_B" in k and t.shape[0] != fout):
                bad.append((k, list(t.shape), fin, fout))
        assert not unmatched and not bad, f"{len(unmatched)} unmatched {unmatched[:3]}, {len(bad)} bad {bad[:3]}"
        return {"consumed": len(w), "unmatched": 0, "modules": len({re.sub(r'\.lora_.*', '', k) for k in w})}

    for name, fn in (("ktdeploy convert (real)", convert), ("sglang-kt composite split", split),
                     ("sglang-kt expert LoRA loading", experts), ("sglang LoRAConfig (non-expert)", nonexpert_config),
                     ("sglang LoRAAdapter import", lora_adapter_import),
                     ("non-expert tensors matched to modules", nonexpert_match)):
        if not step(report, name, fn):
            break
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps(report, indent=2, default=str))
    return 0 if "stopped_at" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
