"""Rules on text a recipe hands to files ktdeploy generates (probe 3, F1/F10/F14): a host path or a deploy value
with a control character — a newline, a tab, ESC — would end a line of the Slurm batch script (a new ``#SBATCH``
directive or shell command), of a record or manifest, or act on the terminal ``render`` prints to. Such a value
cannot be expressed safely in every place it goes, so ``check`` refuses it, naming the key.

The deploy volumes are refused by their schema (``schema.LINE_BREAKING``); this rule covers the training YAML's
host paths and every other string of the deploy section.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.recipe.rules_base import Ctx, RuleSet
from ktdeploy.core.recipe.schema import LINE_BREAKING
from ktdeploy.core.safeio import norm_path

rule = RuleSet()

TRAIN_PATHS = ("output_dir", "model_name_or_path", "adapter_name_or_path", "dataset_dir", "kt_weight_path",
               "resume_from_checkpoint", "logging_dir", "eval_dataset", "dataset", "template")
MAX_REPORTED = 10


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def _shown(value: str) -> str:
    return repr(value[:80])   # repr shows \n, \x1b as escapes: the message itself carries no control character


@rule("paths.control_chars")
def control_chars(ctx: Ctx) -> None:
    """No control character in a host path of the training YAML or in a value of the deploy section.

    Cookbook: — (ktdeploy: no user text enters a generated file unquoted; a newline cannot be quoted in a
    ``#SBATCH`` line). Code: ktdeploy/core/sched/batch.py sbatch_line; ktdeploy/core/terminal_text.py terminal_safe.
    """
    found = []
    for key in TRAIN_PATHS:
        found += [(p, v) for p, v in _strings(ctx.t.get(key), f"train.{key}")]
    deploy = ctx.recipe.raw.doc.get("deploy")
    if isinstance(deploy, dict):
        found += [(p, v) for p, v in _strings(deploy, "deploy") if not p.startswith("deploy.volumes.")]
    bad = [(p, v) for p, v in found if LINE_BREAKING.search(v)]
    for path, value in bad[:MAX_REPORTED]:
        ctx.error(path, f"{_shown(value)} holds a control character (newline, tab, ESC …): it would end a line of "
                        "the batch script or record ktdeploy writes, or act on the terminal",
                  "remove the control character (rename the folder if it is in a path)")


# docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest], path components lower case
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(r"^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                       r"(?::[0-9]+)?/)?" + _COMPONENT + r"(?:/" + _COMPONENT + r")*"
                       r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


@rule("deploy.image_spelling")
def image_spelling(ctx: Ctx) -> None:
    """deploy.image is auto, a build's exact name, or a docker reference that is not one of ktdeploy's own images.

    Cookbook: — (ktdeploy: one spelling per image; a second spelling resolved to another image, or bypassed the
    build's CPU checks). Code: ktdeploy/core/variants.py known/canonical; ktdeploy/core/plan/host_plan.py resolve_image;
    docker distribution/reference grammar.
    """
    d = ctx.recipe.deploy
    if d is None:
        return
    img = d.image
    if img == V.AUTO or V.known(img):
        return
    names = (V.AUTO, *V.NAMES, *V.ALIASES)
    folded = img.strip().lower()
    if folded in names:
        ctx.error("deploy.image", f"{img!r} is another spelling of {folded!r}: ktdeploy takes only the exact name "
                  "(a full image reference is used as it is, without the build's CPU checks)",
                  f"write deploy.image: {folded}")
        return
    repo, _, tag = folded.rpartition("@")[0 if "@" in folded else 2].rpartition(":")
    last = repo.rsplit("/", 1)[-1]
    if last == d.image_repo.lower() and tag in names:
        ctx.error("deploy.image", f"{img!r} names ktdeploy's own {tag} image by reference: it would skip the "
                  "build's CPU and training checks (and on a case-sensitive tag, name another image)",
                  f"write deploy.image: {V.canonical(tag) if V.known(tag) else tag} (and deploy.registry for a "
                  "registry)")
        return
    if not IMAGE_REF.match(img):
        ctx.error("deploy.image", f"{img[:80]!r} is neither auto, a kt-kernel build ({', '.join(V.NAMES)}) nor a "
                  "docker image reference (no blanks, paths or upper-case repository names)",
                  "name a build (e.g. amx) or an image as docker pulls it, e.g. registry.example.com/team/ktsft:amx")


# folders of the operating system: a volume there (or inside) hands the training container the host itself
SYSTEM_TREES = ("/etc", "/usr", "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                "/libx32", "/run", "/var/run", "/var/lib/docker", "/var/lib/containerd", "/snap")
HOME_ROOTS = ("/home", "/root", "/Users")   # a user's home itself (its subfolders are fine: ~/models)
# where a home keeps credentials: a volume at, inside or around one hands them to the training container (whose
# code may be a model's own, trust_remote_code)
CREDENTIALS = (".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".config/gcloud", ".config/gh",
               ".password-store", ".netrc", ".git-credentials", ".pypirc", ".huggingface", ".cache/huggingface/token",
               ".local/share/keyrings", ".vault-token", ".terraform.d")


def _home_of(parts: list[str]) -> int | None:
    """How many leading parts of a path make a home: /root (1), /home/NAME and /Users/NAME (2); else None."""
    if parts[:1] == ["root"]:
        return 1
    if len(parts) >= 2 and parts[0] in ("home", "Users") and parts[1]:
        return 2
    return None


def system_folder(path: str) -> str | None:
    """Why ``path`` (normalized) is no volume: a system tree, a home folder itself, a home's credential folder
    (or a folder holding one), or None."""
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            return f"{tree} is the operating system's" + ("" if path == tree else f" ({path} lies inside it)")
    parts = path.strip("/").split("/")
    n = _home_of(parts)
    if path in HOME_ROOTS or n == len(parts):
        return f"{path} is a user's home (or all of them): keys, shell profiles and other projects live there"
    if n is not None:
        home, rest = "/" + "/".join(parts[:n]), "/".join(parts[n:])
        for cred in CREDENTIALS:
            if rest == cred or rest.startswith(cred + "/") or cred.startswith(rest + "/"):
                return (f"{home}/{cred} holds credentials (keys, tokens, cloud logins)"
                        + ("" if rest == cred else f" and {path} " + ("lies inside it" if rest.startswith(cred)
                                                                      else "holds it")))
    return None


@rule("deploy.system_volumes")
def system_volumes(ctx: Ctx) -> None:
    """No volume is a system folder (/etc, /usr, /proc, /sys, /dev, /boot, /run and the docker socket, …) or a home.

    Cookbook: — (ktdeploy: three volumes, the model read-only, never the host itself).
    Code: ktdeploy/core/plan/docker_argv.py volume mounts (-v PATH:PATH, data and output writable).
    """
    d = ctx.recipe.deploy
    if d is None:
        return
    for key in ("model", "data", "output"):
        path = norm_path(getattr(d.volumes, key))
        why = system_folder(path)
        if why:
            ctx.error(f"deploy.volumes.{key}", f"a volume of {path} mounts it into the training container"
                      f"{'' if key == 'model' else ' writable'}: {why}",
                      f"give the folder that holds the {key}, e.g. /srv/ktdeploy/{key} (or one of yours in your home, "
                      "such as ~/models)")
