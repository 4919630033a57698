"""Which knob brings a plan under the host's capacity, and the doctor checks built on it (pure).

Each knob is a recipe edit; its effect is measured by re-running the resource model on the edited recipe,
so the advice can never disagree with the plan.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.sizing.calibration import upper_edges
from ktdeploy.core.sizing.estimate import GIB, ResourcePlan, estimate, setup_from
from ktdeploy.core.sizing.model_config import MoEArchitecture

Dicts = tuple[dict[str, Any], dict[str, Any]]
# Plan terms that come from the deploy section (no train/accelerate knob changes them): the advice adds them as is.
DEPLOY_TERMS = ("merged model",)


@dataclass(frozen=True)
class Advice:
    resource: str        # host | gpu | disk
    knob: str            # the recipe key (or --gpus)
    change: str          # e.g. "cutoff_len 4096 -> 2048"
    saves_gib: float
    new_gib: float
    fits: bool

    def text(self) -> str:
        return f"{self.change} (saves {self.saves_gib:.1f} GiB -> {self.new_gib:.1f} GiB)"


def _kt(train: dict[str, Any]) -> dict[str, Any]:
    """train's kt_config mapping, to edit: a new one in its place when it is absent or not a mapping."""
    kt = train["kt_config"] = TrainKeys(train).kt_config
    return kt


def _edit(d: Dicts, fn: Callable[[dict[str, Any], dict[str, Any]], object]) -> Dicts:
    t, a = copy.deepcopy(d[0]), copy.deepcopy(d[1])
    fn(t, a)
    return t, a


def _set_train(**kw: Any) -> Callable[[dict[str, Any], dict[str, Any]], object]:
    """An edit that sets train keys (a closure over kw, so a loop variable is bound now, not at call time)."""
    return lambda t, a: t.update(kw)


def _set_acc(**kw: Any) -> Callable[[dict[str, Any], dict[str, Any]], object]:
    """An edit that sets accelerate keys."""
    return lambda t, a: a.update(kw)


def _candidates(d: Dicts, arch: MoEArchitecture, resource: str) -> list[tuple[str, str, Dicts, int | None]]:
    """(knob, change, edited dicts, gpus) in the order a user should try them (cheapest change first)."""
    train, acc = d
    s = setup_from(train, acc)
    out: list[tuple[str, str, Dicts, int | None]] = []

    def add(knob: str, change: str, fn: Callable[[dict[str, Any], dict[str, Any]], object], gpus: int | None = None) -> None:
        out.append((knob, change, _edit(d, fn), gpus))

    if resource in ("host", "gpu"):
        for cut in (s.cutoff_len // 2, s.cutoff_len // 4):
            if cut >= 256:
                add("train.cutoff_len", f"cutoff_len {s.cutoff_len} -> {cut}",
                    _set_train(cutoff_len=cut))
        if s.batch > 1:
            add("train.per_device_train_batch_size",
                f"per_device_train_batch_size {s.batch} -> 1 (raise gradient_accumulation_steps to keep the batch)",
                lambda t, a: t.update(per_device_train_batch_size=1))
    if resource == "host":
        if s.cache_depth > 1:
            add("train.kt_config.kt_max_cache_depth", f"kt_max_cache_depth {s.cache_depth} -> 1",
                lambda t, a: _kt(t).update(kt_max_cache_depth=1))
        if s.cpu_activation == "retain":
            add("train.kt_cpu_activation", "kt_cpu_activation retain -> recompute",
                lambda t, a: t.update(kt_cpu_activation="recompute"))
        if not s.share_backward_bb:
            add("train.kt_config.kt_share_backward_bb", "kt_share_backward_bb false -> true",
                lambda t, a: _kt(t).update(kt_share_backward_bb=True))
        if s.finetuning == "full":
            add("train.finetuning_type", "finetuning_type full -> lora (LoRA rank 8)",
                lambda t, a: t.update(finetuning_type="lora", lora_rank=8))
        order = ["bf16", "fp8", "int8", "int4"]
        for fmt in order[order.index(s.expert_format) + 1:]:
            if fmt == "fp8" and arch.native_format != "fp8":
                continue   # FP8 experts need a native FP8 checkpoint (cookbook A.3.1)
            if fmt == "int8":
                add("train.kt_config.kt_expert_weight_format",
                    "converted INT8 experts (kt_expert_weight_format: int8 + kt_weight_path/kt_non_expert_weight_path)",
                    lambda t, a: (_kt(t).update(kt_expert_weight_format="int8", kt_backend="auto"),
                                  t.update(finetuning_type="lora", lora_rank=t.get("lora_rank") or 8)))
            elif fmt == "int4":
                add("train.kt_config.kt_backend",
                    "converted AMXINT4 experts (kt_backend: AMXINT4 + matching kt_weight_path; needs AMX)",
                    lambda t, a: (_kt(t).update(kt_backend="AMXINT4"),
                                  t.update(finetuning_type="lora", lora_rank=t.get("lora_rank") or 8)))
            else:
                add("train.kt_config.kt_expert_weight_format",
                    "native FP8 experts (kt_expert_weight_format: fp8, LoRA)",
                    lambda t, a: (_kt(t).update(kt_expert_weight_format="fp8", kt_backend="auto"),
                                  t.update(finetuning_type="lora", lora_rank=t.get("lora_rank") or 8)))
    if resource == "gpu":
        if not s.gradient_checkpointing:
            add("train.disable_gradient_checkpointing", "disable_gradient_checkpointing true -> false",
                lambda t, a: t.update(disable_gradient_checkpointing=False))
        if s.fsdp:
            for g in (s.num_processes * 2, s.num_processes * 4):
                if g <= 8:
                    add("accelerate.num_processes", f"more GPUs: num_processes {s.num_processes} -> {g} "
                        "(and deploy.gpus to match)", _set_acc(num_processes=g), gpus=g)
        else:
            add("accelerate.distributed_type", "shard with FSDP2 (distributed_type: FSDP) over the GPUs",
                lambda t, a: a.update(distributed_type="FSDP", fsdp_config={"fsdp_version": 2}))
    if resource == "disk":
        if s.save_total_limit is None or s.save_total_limit > 1:
            add("train.save_total_limit", f"save_total_limit {s.save_total_limit or 'unset'} -> 1",
                lambda t, a: t.update(save_total_limit=1))
        if not s.save_only_model:
            add("train.save_only_model", "save_only_model false -> true (checkpoints lose optimizer state: "
                "resume restarts the optimizer)", lambda t, a: t.update(save_only_model=True))
    return out


def _value(plan: ResourcePlan, resource: str) -> float:
    return {"host": plan.host_memory_gib, "gpu": plan.gpu_memory_gib_per_gpu, "disk": plan.disk_gib}[resource]


def _edge(plan: ResourcePlan, resource: str) -> float:
    """The figure gates compare with: the upper edge of the calibration band (calibration.upper_edges)."""
    return upper_edges(plan)[resource]


def advise(recipe_dicts: Dicts, arch: MoEArchitecture, resource: str, available_gib: float,
           gpus: int | None = None, extra_gib: float = 0.0) -> list[Advice]:
    """Every single-knob change that lowers the resource, with its new figure and whether it fits. ``extra_gib``:
    what the recipe adds beyond train/accelerate and no knob here changes (the merged model's disk)."""
    base = _edge(estimate(recipe_dicts, arch, gpus), resource) + extra_gib
    advice = []
    for knob, change, dicts, g in _candidates(recipe_dicts, arch, resource):
        new = _edge(estimate(dicts, arch, g or gpus), resource) + extra_gib
        if new < base - 1e-6:
            advice.append(Advice(resource, knob, change, base - new, new, new <= available_gib))
    return advice


def fix_text(advice: list[Advice], short_gib: float, resource: str) -> str:
    fitting = [a for a in advice if a.fits]
    if fitting:
        return "; or ".join(a.text() for a in fitting[:3])
    if advice:
        best = max(advice, key=lambda a: a.saves_gib)
        return (f"no single knob is enough (short {short_gib:.1f} GiB); the biggest is {best.text()}; "
                f"combine knobs or add {resource} capacity")
    return f"add {short_gib:.1f} GiB of {resource} capacity"


def plan_checks(recipe_dicts: Dicts, arch: MoEArchitecture, *, host_available_bytes: int | None,
                gpu_free_mib: list[int] | None, disk_free_bytes: int | None,
                gpus: int | None = None, where: str = "", plan: ResourcePlan | None = None) -> list[CheckResult]:
    """plan.host_memory, plan.gpu_memory, plan.disk: fail when the host has less than the plan needs,
    naming the shortfall and the knob that brings the plan under. ``None`` capacity -> skip. ``plan``: the
    estimate already made for this recipe (doctor plans once per run)."""
    plan = plan if plan is not None else estimate(recipe_dicts, arch, gpus)
    edges = upper_edges(plan)
    results = []
    gpu_cap = min(gpu_free_mib) / 1024 if gpu_free_mib else None
    for name, resource, cap_bytes, label in (
            (CheckName.PLAN_HOST_MEMORY, "host", host_available_bytes, "available host memory (MemAvailable)"),
            (CheckName.PLAN_GPU_MEMORY, "gpu", None if gpu_cap is None else gpu_cap * GIB, "free memory of the smallest recipe GPU"),
            (CheckName.PLAN_DISK, "disk", disk_free_bytes, "free disk under the output volume")):
        predicted = _value(plan, resource)
        need = edges[resource]          # the top of the calibration band: one policy with checks.resources
        data: dict[str, Any] = {"predicted_gib": round(predicted, 2), "upper_edge_gib": round(need, 2),
                                "model_config": where,
                                "breakdown": [t.to_json() for t in plan.terms(resource)]}
        if cap_bytes is None:
            results.append(CheckResult(name=name, status="skip", detail=f"predicted {predicted:.1f} GiB (upper edge {need:.1f}); {label} unknown",
                                       data=data))
            continue
        cap = cap_bytes / GIB
        data["available_gib"] = round(cap, 2)
        if need <= cap:
            results.append(CheckResult(name=name, status="pass",
                                       detail=f"predicted {predicted:.1f} GiB, upper edge {need:.1f} GiB <= {label} {cap:.1f} GiB "
                                              f"(headroom {cap - need:.1f} GiB)", data=data))
            continue
        short = need - cap
        extra = sum(t.gib for t in plan.terms(resource) if t.name in DEPLOY_TERMS)
        adv = advise(recipe_dicts, arch, resource, cap, gpus, extra)
        data["advice"] = [a.__dict__ for a in adv]
        results.append(CheckResult(name=name, status="fail",
                                   detail=f"predicted {predicted:.1f} GiB, upper edge of its calibration band {need:.1f} GiB > "
                                          f"{label} {cap:.1f} GiB: short by {short:.1f} GiB",
                                   fix=fix_text(adv, short, resource), data=data))
    return results
