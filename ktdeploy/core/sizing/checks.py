"""The planner's plug into doctor (pure): recipe x HostFacts -> checks plan.host_memory, plan.gpu_memory, plan.disk.

Capacity is what is free now: MemAvailable (capped by a cgroup limit), the free memory of the recipe's GPUs,
free space under the output volume. A failing check says by how much and which single knob (cutoff_len,
kt_max_cache_depth, INT8/AMXINT4 weights, more GPUs, save_total_limit, ...) brings the plan under.
(``checks.resources.recipe_requirements`` sizes the other resource checks from ``plan_recipe`` directly.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.errors import KtdeployError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe.document import RecipeSections
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.sizing.advice import plan_checks
from ktdeploy.core.sizing.estimate import estimate
from ktdeploy.core.sizing.model_config import MoEArchitecture, resolve_model_config


def _dicts(recipe: RecipeSections) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(getattr(recipe, "train", None) or {}), dict(getattr(recipe, "accelerate", None) or {})


def _arch(recipe: RecipeSections, model_config: str | Path | None = None) -> tuple[MoEArchitecture, str]:
    return resolve_model_config(_dicts(recipe)[0], model_config)


def _host_available(facts: HostFacts) -> int | None:
    m = facts.memory
    cg = facts.limits.cgroup_memory_limit if isinstance(facts.limits.cgroup_memory_limit, int) else None
    avail = [x for x in (m.available_bytes, cg) if x]
    return min(avail) if avail else None


def _gpu_free_mib(facts: HostFacts, recipe: RecipeSections) -> list[int] | None:
    wanted = list(getattr(getattr(recipe, "deploy", None), "gpus", None) or [])
    gpus = [g for g in facts.gpu.gpus if not wanted or g.index in wanted]
    free = [g.memory_total_mib - (g.memory_used_mib or 0) for g in gpus if g.memory_total_mib]
    return free or None


def _disk_free(facts: HostFacts, recipe: RecipeSections) -> int | None:
    vol = getattr(getattr(recipe, "deploy", None), "volumes", None)
    out = getattr(vol, "output", None) or TrainKeys(recipe.train).output_dir
    pf = facts.path(out) if isinstance(out, str) and out else None
    return pf.free_bytes if pf else None


def plan_check_results(recipe: RecipeSections, facts: HostFacts, model_config: str | Path | None = None,
                       planned: Any = None) -> list[CheckResult]:
    """plan.host_memory / plan.gpu_memory / plan.disk against the host's free memory, GPU memory and disk.
    ``planned``: the doctor run's one planner answer (``checks.resources.recipe_plan``): (plan, arch, where), or
    the KtdeployError saying why there is none; None: plan here."""
    plan = None
    try:
        if isinstance(planned, KtdeployError):
            raise planned
        if planned is not None:
            plan, arch, where = planned
        else:
            arch, where = _arch(recipe, model_config)
            if getattr(recipe, "deploy", None) is not None:   # deploy.serve.merge adds the merged model's disk
                plan = estimate(recipe, arch)
    except KtdeployError as err:
        return [CheckResult(name=r, status="skip", layer=facts.layer,
                            detail=f"no resource plan: {err.message}", fix=err.fix or "")
                for r in (CheckName.PLAN_HOST_MEMORY, CheckName.PLAN_GPU_MEMORY, CheckName.PLAN_DISK)]
    results = plan_checks(_dicts(recipe), arch, host_available_bytes=_host_available(facts),
                          gpu_free_mib=_gpu_free_mib(facts, recipe), disk_free_bytes=_disk_free(facts, recipe),
                          where=where, plan=plan)
    return [r.model_copy(update={"layer": facts.layer}) for r in results]
