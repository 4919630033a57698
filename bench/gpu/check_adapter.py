#!/usr/bin/env python3
"""Numeric check of `ktdeploy convert`: base model + converted adapter, in plain PyTorch, must reproduce
the fine-tuned KT model's logits on held-out prompts.

The reference logits were recorded at the end of training by ktdeploy's probe callback, from the KT
model itself (attention LoRA on the GPU through PEFT, routed experts and their LoRA on the CPU
through kt-kernel). Here nothing of KT or PEFT runs: the base checkpoint is loaded with transformers,
and the converted adapter is applied by hand the way sglang-kt applies it - per module
``y += (alpha/r) * B(A(x))``, per routed expert on its gate/up/down projections.

Three comparisons against the KT logits, per prompt and position:
  adapted       base + whole converted adapter           -> must match (bf16 tolerance)
  base          base model alone                         -> must differ clearly
  no_experts    base + the adapter's non-expert part only -> shows the expert part matters

    python bench/gpu/check_adapter.py --model M --adapter A --probe probe_logits.safetensors -o check.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

_EXPERT = re.compile(r"^(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.lora_([AB])\.weight$")


def load_adapter(adapter_dir: Path):
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    scaling = float(cfg["lora_alpha"]) / float(cfg["r"])
    linear: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    experts: dict[str, dict[tuple[int, str, str], torch.Tensor]] = defaultdict(dict)
    for key, t in tensors.items():
        m = _EXPERT.match(key)
        if m:
            experts[m.group(1)][(int(m.group(2)), m.group(3), m.group(4))] = t
            continue
        mod, ab = key.rsplit(".lora_", 1)
        linear[mod][ab.split(".")[0]] = t
    return scaling, linear, experts


class Patch:
    """Hooks that add the LoRA terms to a plain transformers model; removable."""

    def __init__(self, model, scaling, linear, experts, use_experts=True):
        self.handles = []
        self.saved_forwards = []
        dev = next(model.parameters()).device
        for name, ab in linear.items():
            mod = model.get_submodule(name)
            A, B = ab["A"].to(dev, torch.float32), ab["B"].to(dev, torch.float32)
            if not isinstance(mod, torch.nn.Linear):
                if hasattr(mod, "top_k") and getattr(mod, "weight", None) is not None:
                    # the MoE router (`mlp.gate`, LoRA-targeted by lora_target: all): logits = x W^T + s B(A(x))
                    self.saved_forwards.append((mod, mod.forward))
                    mod.forward = self._router_forward(mod, A, B, scaling)
                    continue
                raise TypeError(f"{name} is {type(mod).__name__}: no LoRA rule for it")

            def hook(m, inp, out, A=A, B=B):
                x = inp[0].to(torch.float32)
                return (out.to(torch.float32) + scaling * F.linear(F.linear(x, A), B)).to(out.dtype)

            self.handles.append(mod.register_forward_hook(hook))
        if use_experts:
            for layers_prefix, table in experts.items():
                mlp = model.get_submodule(f"{layers_prefix}.mlp")
                ex = mlp.experts
                n = ex.gate_up_proj.shape[0]
                lora = {(p, ab): torch.stack([table[(e, p, ab)] for e in range(n)]).to(dev, torch.float32)
                        for p in ("gate", "up", "down") for ab in "AB"}
                self.saved_forwards.append((ex, ex.forward))
                ex.forward = self._expert_forward(ex, lora, scaling)

    @staticmethod
    def _router_forward(r, A, B, scaling):
        def forward(hidden_states):
            x = hidden_states.reshape(-1, r.hidden_dim)
            logits = F.linear(x.float(), r.weight.float()) + scaling * F.linear(F.linear(x.float(), A), B)
            logits = logits.to(hidden_states.dtype)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            top_v, top_i = torch.topk(probs, r.top_k, dim=-1)
            if r.norm_topk_prob:
                top_v /= top_v.sum(dim=-1, keepdim=True)
            return logits, top_v.to(logits.dtype), top_i

        return forward

    @staticmethod
    def _expert_forward(ex, lora, scaling):
        inter = ex.gate_up_proj.shape[1] // 2

        def forward(hidden_states, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden_states, dtype=torch.float32)
            x_all = hidden_states.to(torch.float32)
            for e in torch.unique(top_k_index).tolist():
                tok, pos = torch.where(top_k_index == e)
                x = x_all[tok]
                wg = ex.gate_up_proj[e, :inter].to(torch.float32)
                wu = ex.gate_up_proj[e, inter:].to(torch.float32)
                wd = ex.down_proj[e].to(torch.float32)
                g = F.linear(x, wg) + scaling * F.linear(F.linear(x, lora[("gate", "A")][e]), lora[("gate", "B")][e])
                u = F.linear(x, wu) + scaling * F.linear(F.linear(x, lora[("up", "A")][e]), lora[("up", "B")][e])
                h = F.silu(g) * u
                y = F.linear(h, wd) + scaling * F.linear(F.linear(h, lora[("down", "A")][e]), lora[("down", "B")][e])
                out.index_add_(0, tok, y * top_k_weights[tok, pos, None].to(torch.float32))
            return out.to(hidden_states.dtype)

        return forward

    def remove(self):
        for h in self.handles:
            h.remove()
        for ex, fwd in self.saved_forwards:
            ex.forward = fwd


def logits_for(model, ids_list):
    dev = next(model.parameters()).device
    with torch.no_grad():
        return [model(input_ids=ids[None].to(dev)).logits[0].float().cpu() for ids in ids_list]


def compare(a: list[torch.Tensor], ref: list[torch.Tensor]) -> dict:
    rel, maxabs, agree, pos_ok, n = [], 0.0, 0, 0, 0
    for x, r in zip(a, ref, strict=False):
        d = (x - r)
        rel.append((d.norm() / r.norm()).item())
        maxabs = max(maxabs, d.abs().max().item())
        agree += (x.argmax(-1) == r.argmax(-1)).sum().item()
        # per position: relative error of that position's logit vector
        prel = d.norm(dim=-1) / r.norm(dim=-1)
        pos_ok += (prel < 0.05).sum().item()
        n += r.shape[0]
    return {"rel_l2_mean": sum(rel) / len(rel), "rel_l2_max": max(rel), "max_abs": maxabs,
            "argmax_agree": agree / n, "positions_within_5pct": pos_ok / n, "positions": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--probe", required=True, help="probe_logits.safetensors written at the end of training")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--tol", type=float, default=0.03, help="max mean relative L2 error of adapted vs KT logits")
    ap.add_argument("--margin", type=float, default=5.0, help="base must be this many times further off")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    probe = load_file(args.probe)
    with safe_open(args.probe, "pt") as f:
        prompts = json.loads((f.metadata() or {}).get("prompts", "[]"))
    n = len([k for k in probe if k.startswith("logits.")])
    ids = [probe[f"input_ids.{i}"] for i in range(n)]
    ref = [probe[f"logits.{i}"] for i in range(n)]

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
    scaling, linear, experts = load_adapter(Path(args.adapter))

    base = logits_for(model, ids)
    p = Patch(model, scaling, linear, experts, use_experts=False)
    no_exp = logits_for(model, ids)
    p.remove()
    p = Patch(model, scaling, linear, experts, use_experts=True)
    adapted = logits_for(model, ids)
    p.remove()

    res = {"prompts": len(ids), "example_prompt": prompts[0] if prompts else None, "scaling": scaling,
           "nonexpert_modules": len(linear), "expert_layers": len(experts),
           "adapted_vs_kt": compare(adapted, ref), "base_vs_kt": compare(base, ref),
           "no_experts_vs_kt": compare(no_exp, ref), "tol": args.tol, "margin": args.margin}
    a, b = res["adapted_vs_kt"]["rel_l2_mean"], res["base_vs_kt"]["rel_l2_mean"]
    res["passed"] = bool(a <= args.tol and b >= args.margin * a)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
