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
from ktdeploy.core.sched.batch import BatchJob, convert_script, train_script
from ktdeploy.core.sched.features import LADDER
from ktdeploy.core.sched.request import request_for
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


def slurm_scripts(recipe: Recipe, variant: str | None = None, run_id: str = "manual") -> list[BatchJob]:
    image, chosen = image_and_variant(recipe, variant)
    request = request_for(recipe, chosen)
    return [train_script(recipe, shipped_recipe(recipe, None), image=image, run_id=run_id, request=request),
            convert_script(recipe, image=image, run_id=run_id, request=request)]


NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")   # a DNS-1123 label, Kubernetes' namespace names


def k8s_manifests(recipe: Recipe, variant: str | None = None, namespace: str = "default") -> list[dict[str, Any]]:
    if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
        raise UsageError(f"--namespace {terminal_safe(namespace)!r}: not a Kubernetes namespace name", key="--namespace",
                         fix="Lower-case letters, digits and '-', at most 63, starting and ending with a letter or "
                             "digit (e.g. --namespace ml-team).")
    image, chosen = image_and_variant(recipe, variant)
    return k8s.manifests(recipe, image=image, variant=chosen, request=request_for(recipe, chosen),
                         namespace=namespace)
