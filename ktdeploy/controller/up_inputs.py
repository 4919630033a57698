"""`up`'s and `up-slurm`'s inputs, checked before anything is recorded or touched: the recipe, the arguments that
need each other, the image tarball, the serve key, the run's name, recorded host facts (--facts)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ktdeploy.controller.runs import all_runs, same_target
from ktdeploy.core.command_requests import NativePair
from ktdeploy.core.errors import RunRecordError, UsageError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe import builtin_recipe, load_native, load_recipe, require_valid
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.safeio import MAX_JSON, NAME, load_json, printable


def load_up_recipe(recipe_path: str | Path | None = None, overrides: Sequence[str] = (),
                   native: NativePair | None = None) -> Recipe:
    """The recipe `up` runs: a RECIPE file (default: the shipped tiny one), or the native LlamaFactory pair
    (--train/--accelerate, and --deploy or the deploy section derived from them: core/recipe/from_lf.py)."""
    if native is not None:
        for flag, p in (("--train", native.train), ("--accelerate", native.accelerate), ("--deploy", native.deploy)):
            if p is not None and not Path(p).is_file():
                raise UsageError(f"{flag} {printable(p)}: no such file", key=flag, fix="Give the YAML file's path.")
        recipe = load_native(native.train, native.accelerate, native.deploy, overrides=list(overrides), derive=True)
    else:
        path = Path(str(recipe_path)) if recipe_path else Path(str(builtin_recipe()))
        if not path.exists():
            raise UsageError(f"recipe {path} does not exist", key="RECIPE",
                             fix="Give a recipe file, e.g. recipes/tiny-moe-lora.yaml.")
        recipe = load_recipe(path, list(overrides))
    require_valid(recipe)
    return recipe


def check_up_arguments(host: str, resume: str | None, dry_run: bool, facts_file: str | None) -> None:
    if resume not in (None, "auto") and not str(resume).startswith("/") and not str(resume).startswith("checkpoint-"):
        raise UsageError(f"--resume {resume!r}: give 'auto', a checkpoint-N name or an absolute checkpoint path",
                         key="--resume", fix="ktdeploy up --resume auto ...")
    if facts_file is not None and not dry_run:
        raise UsageError("--facts plans from recorded facts and changes nothing: it needs --dry-run", key="--facts",
                         fix=f"ktdeploy up --host {host} RECIPE --dry-run --facts {facts_file}")


def check_image_tar(image_tar: str, recipe: Recipe) -> None:
    """--image-tar is loaded on the host with `docker load`, which applies every name in it: only an archive whose
    every name is one of the recipe's images (deploy.image_repo:<variant>, or deploy.image) is shipped."""
    from ktdeploy.controller.images.archive import require_only
    from ktdeploy.controller.images.tags import ISA_VARIANTS, image_tag

    if not Path(image_tar).is_file():
        raise UsageError(f"--image-tar {image_tar}: no such file", key="--image-tar",
                         fix="Give the tarball `ktdeploy image save` wrote.")
    deploy = recipe.require_deploy()
    allowed = {image_tag(deploy.image_repo, v) for v in ISA_VARIANTS} | {deploy.image}
    require_only(image_tar, allowed, f"{deploy.image_repo}:<variant> or deploy.image")


def check_api_key(recipe: Recipe, *, detach: bool, dry_run: bool) -> None:
    """Checked before anything starts: the serve stage comes hours later, after training."""
    serve = recipe.deploy.serve if recipe.deploy is not None else None
    if serve is not None and serve.enabled and serve.api_key_env and not detach and not dry_run \
            and not os.environ.get(serve.api_key_env):
        raise UsageError(f"deploy.serve.api_key_env names {serve.api_key_env}, which is not set in this shell",
                         key="deploy.serve.api_key_env",
                         fix=f"export {serve.api_key_env}=<key>, then run ktdeploy up again")


def check_run_name(name: str, host: str, container: str) -> None:
    """--name: a name (the run id's rules), and one job's: a run of another host or job already named so is
    refused (the same job again — the same `up` re-run — keeps its name)."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name or len(name) > 64:
        raise UsageError(f"--name {printable(name)}: letters, digits, '.', '_' and '-' only, at most 64",
                         key="--name", fix="e.g. --name qwen-lora-v2")
    # --run takes an id, a name or an id's prefix, the id first: a name that reads as (the start of) an id would
    # name another run, or the next one (ids start with their UTC date)
    if not name[0].isalpha():
        raise UsageError(f"--name {printable(name)}: a run name starts with a letter (run ids start with their date, "
                         "and `--run` would take it for one)", key="--name", fix="e.g. --name qwen-lora-v2")
    for rec in all_runs():
        if rec.id.startswith(name):
            raise UsageError(f"--name {name}: it is (the start of) the id of run {rec.id}, which `--run {name}` "
                             "would name", key="--name",
                             fix="Choose another name; `ktdeploy status --all` lists the runs and their names.")
        try:
            st = rec.status()
        except RunRecordError:
            continue
        if st.get("name") == name and not (same_target(st.get("host"), host) and st.get("container") == container) \
                and not st.get("dry_run"):
            raise UsageError(f"--name {name}: run {rec.id} (host {st.get('host')}, recipe {st.get('recipe')}) has "
                             "that name", key="--name",
                             fix="Choose another name; `ktdeploy status --all` lists the runs and their names.")


def load_facts_file(path: str | Path) -> HostFacts:
    """Host facts recorded earlier: `ktdeploy doctor --json` output ({"facts": ...}) or a bare facts.json
    (HostFacts, as tests/golden/*/facts.json). Bad input is a UsageError naming the file."""
    from pydantic import ValidationError

    p = Path(str(path))
    if not os.path.lexists(p):
        raise UsageError(f"--facts {p}: no such file", key="--facts",
                         fix="Record one on the host: ktdeploy doctor --json > facts.json")
    try:  # bounded, and a FIFO or device is refused rather than read
        data = load_json(p, MAX_JSON, "facts file")
    except UsageError as e:
        raise UsageError(e.message, key="--facts",
                         fix="Give the output of `ktdeploy doctor --json` or a facts.json.") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict) and "checks" in data:
        data = data["facts"]
    try:
        return HostFacts.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "(top level)"
        raise UsageError(f"--facts {p}: not host facts: {where}: {first.get('msg')}", key="--facts",
                         fix="Give the output of `ktdeploy doctor --json` or a facts.json.") from None
