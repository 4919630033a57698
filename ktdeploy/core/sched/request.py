"""A training job's resource request, from ktdeploy's own knowledge (pure): what Slurm's header and a Kubernetes
pod's requests/limits say.

    memory   the planner's host-memory upper edge (the figure doctor's plan.host_memory gates on), or
             deploy.scheduler.mem_gib when set (a model without a config.json the planner can read)
    cpus     the thread plan: kt_num_threads (the recipe's, else deploy.scheduler.cpus) + deploy.reserve_cores,
             physical cores (Slurm: --hint=nomultithread, so SMT siblings never count)
    gpus     len(deploy.gpus) (= accelerate.num_processes, a recipe rule)
    variant  the image variant (its CPU needs: features.variant_features), None for a full image reference
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sched.features import constraint
from ktdeploy.core.sizing import plan_recipe
from ktdeploy.core.sizing.calibration import upper_edges

MiB = 1024 * 1024


@dataclass(frozen=True)
class JobRequest:
    mem_mib: int
    cpus: int
    gpus: int
    variant: str | None
    time: str
    mem_basis: str
    cpus_basis: str

    @property
    def constraint(self) -> str | None:
        return constraint(self.variant)

    @property
    def mem_gib(self) -> float:
        return self.mem_mib / 1024


def _positive_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def request_for(recipe: Recipe, variant: str | None) -> JobRequest:
    """The request of ``recipe``'s training job for an image ``variant`` (RecipeError naming the key when the
    memory or the threads cannot be known without a host)."""
    deploy = recipe.require_deploy()
    sched = deploy.scheduler
    if sched.mem_gib is not None:
        mem_mib = math.ceil(sched.mem_gib * 1024)
        mem_basis = "deploy.scheduler.mem_gib"
    else:
        try:
            plan, _arch, where = plan_recipe(recipe, gpus=len(deploy.gpus))
        except Exception as e:  # no config.json for the model: the planner cannot size it
            raise RecipeError(f"the planner cannot size this recipe's host memory ({getattr(e, 'message', e)})",
                              key="deploy.scheduler.mem_gib",
                              fix="Give the model's config.json (train.model_name_or_path/config.json on this "
                                  "machine or recipes/models/<name>.json), or set deploy.scheduler.mem_gib.") from None
        edge = upper_edges(plan)["host"]
        mem_mib = math.ceil(edge * 1024)
        mem_basis = f"planner upper edge {edge:.1f} GiB ({where})"
    kt = recipe.kt_config
    threads = _positive_int(kt.get("kt_num_threads")) or sched.cpus
    if threads is None:
        raise RecipeError("a scheduler job needs its CPU count before any node is known: neither "
                          "train.kt_config.kt_num_threads nor deploy.scheduler.cpus is set",
                          key="deploy.scheduler.cpus",
                          fix="Set deploy.scheduler.cpus to the physical cores kt-kernel's experts get (the node's "
                              "cores minus deploy.reserve_cores; `ktdeploy doctor` on a node shows numa.threads).")
    cpus = threads + deploy.reserve_cores
    basis = ("train.kt_config.kt_num_threads" if _positive_int(kt.get("kt_num_threads")) else "deploy.scheduler.cpus")
    return JobRequest(mem_mib=mem_mib, cpus=cpus, gpus=len(deploy.gpus), variant=variant, time=sched.time,
                      mem_basis=mem_basis, cpus_basis=f"{threads} kt threads ({basis}) + {deploy.reserve_cores} "
                                                      "reserved (deploy.reserve_cores)")
