"""`ktdeploy render --slurm | --k8s` (pure): the batch scripts and the Kubernetes manifests of a recipe, for sites
that submit by hand. Without a cluster to look at, ``deploy.image: auto`` needs the variant named (``--variant``)."""

from __future__ import annotations

import re
from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.errors import UsageError
from ktdeploy.core.plan.host_plan import resolve_image, shipped_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sched import k8s
from ktdeploy.core.sched.batch import BatchJob, Launch, convert_script, train_script
from ktdeploy.core.sched.features import LADDER
from ktdeploy.core.sched.request import request_for
from ktdeploy.core.sched.runtimes import PODMAN, RUNTIMES
from ktdeploy.core.sched.signal_time import require_room, signal_plan
from ktdeploy.core.terminal_text import terminal_safe


def image_and_variant(recipe: Recipe, variant: str | None) -> tuple[str, str | None]:
    deploy = recipe.require_deploy()
    if variant is not None and not V.known(variant):
        raise UsageError(f"--variant {terminal_safe(variant)!r}: not an image variant", key="--variant",
                         fix=f"Use one of {', '.join(LADDER)}.")
    variant = V.canonical(variant) if variant is not None else None
    if deploy.image == V.AUTO:
        if variant is None:
            raise UsageError("deploy.image is auto, and without a cluster there is no CPU to choose from",
                             key="--variant", fix=f"Name the variant the nodes run: --variant {'|'.join(LADDER)} "
                                                  "(or set deploy.image; `ktdeploy up-slurm` chooses from sinfo).")
        chosen = variant
    elif V.known(deploy.image):
        if variant is not None and variant != V.canonical(deploy.image):
            raise UsageError(f"--variant {variant} contradicts deploy.image {deploy.image}", key="--variant",
                             fix="Drop --variant or change deploy.image.")
        chosen = V.canonical(deploy.image)
    else:
        return deploy.image, variant   # a full image reference: its CPU needs are what --variant says (or none)
    image, _v, _how = resolve_image(deploy.model_copy(update={"image": chosen}), None)
    return image, chosen


def launch_for(recipe: Recipe, image: str, runtime: str, *, gpus: bool = True, memlock: bool = True) -> Launch:
    """How the job's containers start: ``runtime`` (already chosen: named, or picked from the cluster), the image
    and its file, the warning before the time limit (RecipeError when the limit leaves no room for it)."""
    sched = recipe.require_deploy().scheduler
    plan = signal_plan(recipe)
    require_room(recipe, plan)
    return Launch(runtime=runtime, image=image, image_file=sched.image_file, signal_seconds=plan.seconds, gpus=gpus,
                  memlock=memlock)


def render_runtime(recipe: Recipe, runtime: str | None) -> str:
    """`render --slurm`'s runtime: --runtime, else the recipe's, else (auto, no cluster to look at) podman, the one
    that needs nothing from the site but the package."""
    named = recipe.require_deploy().scheduler.runtime
    if runtime is not None and runtime not in RUNTIMES:
        raise UsageError(f"--runtime {terminal_safe(runtime)!r}: not a Slurm runtime", key="--runtime",
                         fix=f"Use one of {', '.join(RUNTIMES)}.")
    if runtime is not None and named not in ("auto", runtime):
        raise UsageError(f"--runtime {runtime} contradicts deploy.scheduler.runtime {named}", key="--runtime",
                         fix="Drop --runtime or change deploy.scheduler.runtime.")
    return runtime or (named if named != "auto" else PODMAN)


def slurm_scripts(recipe: Recipe, variant: str | None = None, run_id: str = "manual",
                  runtime: str | None = None) -> list[BatchJob]:
    image, chosen = image_and_variant(recipe, variant)
    request = request_for(recipe, chosen)
    launch = launch_for(recipe, image, render_runtime(recipe, runtime))
    return [train_script(recipe, shipped_recipe(recipe, None), run_id=run_id, request=request, launch=launch),
            convert_script(recipe, run_id=run_id, request=request, launch=launch)]


NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")   # a DNS-1123 label, Kubernetes' namespace names


def k8s_manifests(recipe: Recipe, variant: str | None = None, namespace: str = "default") -> list[dict[str, Any]]:
    if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
        raise UsageError(f"--namespace {terminal_safe(namespace)!r}: not a Kubernetes namespace name", key="--namespace",
                         fix="Lower-case letters, digits and '-', at most 63, starting and ending with a letter or "
                             "digit (e.g. --namespace ml-team).")
    image, chosen = image_and_variant(recipe, variant)
    return k8s.manifests(recipe, image=image, variant=chosen, request=request_for(recipe, chosen),
                         namespace=namespace)
