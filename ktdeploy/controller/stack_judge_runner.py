"""Run the stack's own judgement of a recipe (``core/recipe/stack_judge_payload.py``) where the stack is: in an image on
this machine (``ktdeploy check --stack``), inside a running container through its connector (up's image check,
``doctor --image``), or in this very Python when it has the stack (``train`` and ``doctor`` inside the image).

The judge is always the same program (``BOOTSTRAP`` -> ``ktdeploy.agent.stack_judge``), run as a separate process
with the rendered files on stdin, bounded in time (``JUDGE_TIMEOUT_S``) and, in its own container, in memory
(``docker_argv.JUDGE_MEMORY``), network and capabilities.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.core import variants as V
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.stack import judge_check
from ktdeploy.core.errors import ConnectError, StackUnavailable
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.recipe.render import Rendered, render
from ktdeploy.core.recipe.stack_judge_payload import (
    BOOTSTRAP,
    JUDGE_SECONDS,
    MAX_CONFIG,
    JudgeResult,
    ModelConfig,
    parse_output,
    payload,
)

JUDGE_TIMEOUT_S = JUDGE_SECONDS + 90   # + starting the container / the interpreter


def stack_here() -> bool:
    """Whether this Python has the stack (inside the full image): the judge can run without docker."""
    return all(importlib.util.find_spec(m) is not None for m in ("llamafactory", "kt_kernel", "accelerate", "torch"))


def model_config_for(recipe: Recipe, explicit: str | os.PathLike[str] | None = None) -> ModelConfig | None:
    """The model's config.json this machine has for the recipe, for the judge's model skeleton: ``explicit``
    (--model-config), the model directory's own, else the shipped recipes/models/<name>.json (as plan resolves it);
    None when there is none (the judge then says which checks it skipped). An explicit path that cannot be read is
    a usage error."""
    from ktdeploy.core.errors import KtdeployError
    from ktdeploy.core.recipe.train_keys import TrainKeys
    from ktdeploy.core.safeio import read_text
    from ktdeploy.core.sizing.model_config import shipped_models_dir

    if explicit is not None:
        p = Path(explicit)
        p = p / "config.json" if p.is_dir() else p
        return ModelConfig(read_text(p, MAX_CONFIG, "model config.json"), str(p))
    name = str(TrainKeys(recipe.train).model_name_or_path or "").rstrip("/")
    if not name:
        return None
    for p in (Path(name) / "config.json", shipped_models_dir() / f"{Path(name).name}.json"):
        try:
            if p.is_file():
                return ModelConfig(read_text(p, MAX_CONFIG, "model config.json"), str(p))
        except (OSError, KtdeployError):
            continue
    return None


def judge_payload(recipe: Recipe, derived: dict[str, Any] | None = None, *, in_container: bool = False,
                  model_config: ModelConfig | None = None) -> str:
    """The rendered files the launcher would get (``derived``: what ``train`` fills in from this host). In a container
    started with ``--gpus device=…`` the chosen GPUs are 0..n-1 (what up ships: plan.build.shipped_recipe). The
    model's config.json goes along (``model_config``, else what this machine has): where the judge runs without the
    model's directory, the skeleton is built from it."""
    if in_container and recipe.deploy is not None:
        recipe = dataclasses.replace(recipe, deploy=recipe.deploy.model_copy(
            update={"gpus": list(range(len(recipe.deploy.gpus)))}))
    return payload(render(recipe, derived), model_config or model_config_for(recipe))


def stack_judge_check(connector: Connector, recipe: Recipe, *, python: str = "python3", in_container: bool = True) -> CheckResult:
    """``stack.judge`` where ``connector`` runs (the image check's container, or doctor's own host with --stack)."""
    result = judge_with(connector, judge_payload(recipe, in_container=in_container), python=python)
    return judge_check(result, stack_findings(recipe, result) if result.status == "refused" else [])


def judge_with(connector: Connector, text: str, *, python: str = "python3") -> JudgeResult:
    """The judge run by ``python`` where ``connector`` runs commands (a container: the image's own python3)."""
    r = connector.run([python, "-c", BOOTSTRAP, "-"], input=text, timeout=JUDGE_TIMEOUT_S)
    return parse_output(r.stdout, r.rc, r.stderr)


def judge_locally(text: str) -> JudgeResult:
    """The judge with this interpreter's stack (``sys.executable``), in a child process."""
    return judge_with(LocalConnector(), text, python=sys.executable)


def judge_rendered(rendered: Rendered) -> JudgeResult:
    """``train``'s judge: exactly the files it is about to launch, with this interpreter's stack."""
    return judge_locally(payload(rendered))


def image_for(recipe: Recipe, connector: Connector | None = None) -> str:
    """The image ``check --stack`` judges with: the recipe's ``deploy.image`` (a reference, or ``<repo>:<build>``);
    for ``auto`` the first kt-kernel build image present here, top of the ladder first (every build image holds the
    same stack: only the kt-kernel build it pins differs, and the judge loads the one this CPU runs)."""
    deploy = recipe.deploy
    if deploy is None:
        return V.image(V.AVX2)
    if deploy.image != V.AUTO and not V.known(deploy.image):
        return deploy.image
    if V.known(deploy.image):
        return f"{deploy.image_repo}:{V.canonical(deploy.image)}"
    conn = connector or LocalConnector()
    for name in V.NAMES:
        ref = f"{deploy.image_repo}:{name}"
        if conn.run(dk.image_probe(ref), timeout=60).rc == 0:
            return ref
    return f"{deploy.image_repo}:{V.AMX}"


def judge_in_image(image: str, text: str, *, connector: Connector | None = None, source: str | None = None) -> JudgeResult:
    """``docker run`` the judge in ``image`` (on this machine unless ``connector``). Raises StackUnavailable when the
    image is not there or docker cannot start it, ConnectError when there is no docker."""
    conn = connector or LocalConnector()
    probe = conn.run(dk.image_probe(image), timeout=60)
    if probe.rc == 127 or "command not found" in probe.stderr:
        raise ConnectError(f"no docker on {conn.name}: the stack judge runs in the image",
                           fix="Install docker, or run `ktdeploy check RECIPE --stack` inside the image "
                               "(docker run --rm -v ... IMAGE check RECIPE --stack).")
    if probe.rc != 0:
        raise StackUnavailable(f"image {image} is not on {conn.name}: the stack judge runs in it",
                               key="--image",
                               fix="Build it (`ktdeploy image build`), load it (`ktdeploy image load FILE`), or name "
                                   "one that is here with --image.")
    name = f"ktdeploy-judge-{secrets.token_hex(4)}"
    argv = dk.stack_judge(image, name=name, bootstrap=BOOTSTRAP, source=source)
    try:
        r = conn.run(argv, input=text, timeout=JUDGE_TIMEOUT_S)
    finally:
        conn.run(dk.remove(name), timeout=60)   # a client killed by the timeout leaves its container running
    result = parse_output(r.stdout, r.rc, r.stderr)
    if result.status == "broken" and r.rc in (125, 126, 127):
        raise StackUnavailable(f"docker could not start the stack judge in {image}: {result.detail}",
                               fix="Check the image (`docker run --rm --entrypoint python3 IMAGE -V`).")
    return result


def require_judged(result: JudgeResult, where: str) -> JudgeResult:
    """The result, or StackUnavailable saying why there is no judgement (absent stack, broken judge)."""
    if result.judged:
        return result
    if result.status == "absent" and any(m.startswith("ktdeploy") for m in result.missing):
        raise StackUnavailable(f"{where} has no ktdeploy stack judge (its ktdeploy is missing, or older than the "
                               f"judge): {result.detail}",
                               fix="Rebuild the image from this ktdeploy (`ktdeploy image build`: a code-only rebuild "
                                   "reuses the stack's layers), or judge with an image built from it.")
    if result.status == "absent":
        raise StackUnavailable(f"{where} has no LlamaFactory/kt-kernel stack to judge the recipe with "
                               f"(missing: {', '.join(result.missing) or '?'}): {result.detail}",
                               fix="Judge with a full image (`ktsft:<build>`, `ktdeploy image build`), "
                                   "not a reduced or test image; an image built before the judge existed needs a "
                                   "rebuild.")
    raise StackUnavailable(f"the stack judge failed in {where}: {result.detail}",
                           fix="Check that the image's python3 imports llamafactory, kt_kernel and accelerate "
                               "(docker run --rm --entrypoint python3 IMAGE -c 'import llamafactory, kt_kernel').")


def stack_findings(recipe: Recipe, result: JudgeResult) -> list[Finding]:
    """The stack's refusals as findings on the recipe's keys (file and line from the recipe)."""
    from ktdeploy.core.recipe.stack_judge_payload import findings

    return findings(result, recipe.train, recipe.accelerate, recipe.raw.source.where)


def check_with_stack(recipe: Recipe, *, image: str | None = None, source: str | None = None,
                     connector: Connector | None = None,
                     model_config: str | os.PathLike[str] | None = None) -> tuple[list[Finding], JudgeResult, str]:
    """``ktdeploy check --stack``: (the stack's findings, the judgement, where it ran). In this Python when it has
    the stack, or runs inside a ktsft image (``$KTSFT_VARIANT``: a reduced image then says "absent"), and no image
    is named; else in ``image`` (default ``image_for(recipe)``) on this machine. ``model_config``: the model's
    config.json for the skeleton (default: the model directory's own, else recipes/models/<name>.json)."""
    text = judge_payload(recipe, model_config=model_config_for(recipe, model_config))
    if image is None and source is None and (stack_here() or os.environ.get("KTSFT_VARIANT")):
        result = require_judged(judge_locally(text), "this Python")
        return stack_findings(recipe, result), result, "this Python"
    ref = image or image_for(recipe, connector)
    result = require_judged(judge_in_image(ref, text, connector=connector, source=source), f"image {ref}")
    return stack_findings(recipe, result), result, f"image {ref}"
