"""Rules on text a recipe hands to files ktdeploy generates (probe 3, F1/F10/F14): a host path or a deploy value
with a control character — a newline, a tab, ESC — would end a line of the Slurm batch script (a new ``#SBATCH``
directive or shell command), of a record or manifest, or act on the terminal ``render`` prints to. Such a value
cannot be expressed safely in every place it goes, so ``check`` refuses it, naming the key.

The deploy volumes are refused by their schema (``schema.LINE_BREAKING``); this rule covers the training YAML's
host paths and every other string of the deploy section.
"""

from __future__ import annotations

from typing import Any

from ktdeploy.core.recipe.rules import Ctx, rule
from ktdeploy.core.recipe.schema import LINE_BREAKING

TRAIN_PATHS = ("output_dir", "model_name_or_path", "adapter_name_or_path", "dataset_dir", "kt_weight_path",
               "resume_from_checkpoint", "logging_dir", "eval_dataset", "dataset", "template")
MAX_REPORTED = 10


def _strings(value: Any, path: str):
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
    ``#SBATCH`` line). Code: ktdeploy/core/sched/batch.py sbatch_line; ktdeploy/core/markup.py terminal_safe.
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
