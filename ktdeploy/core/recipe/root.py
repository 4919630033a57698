"""``deploy.root``: one host folder the recipe's relative paths resolve against (pure).

A recipe that sets ``deploy.root`` may write its host paths relative to it — ``train.model_name_or_path``,
``dataset_dir``, ``output_dir``, ``kt_weight_path``, ``kt_non_expert_weight_path``, ``resume_from_checkpoint`` and
``deploy.volumes.{model,data,output}`` —; they are made absolute under it when the recipe is built, so everything
after (checks, plan, render, the container) sees the absolute paths, and ``--set deploy.root=/data/kt`` moves them
all at once. An absolute path stays as written. Without ``deploy.root`` nothing changes (a relative path is the
error it always was). A root that is not an absolute path resolves nothing: the deploy schema reports it."""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from ktdeploy.core.recipe.loader import RawRecipe
from ktdeploy.core.recipe.schema import LINE_BREAKING

TRAIN_PATHS = ("model_name_or_path", "dataset_dir", "output_dir", "kt_weight_path", "kt_non_expert_weight_path",
               "resume_from_checkpoint")
VOLUMES = ("model", "data", "output")


def _under(root: str, value: Any) -> Any:
    if isinstance(value, str) and value and not value.startswith("/") and not LINE_BREAKING.search(value):
        return posixpath.normpath(posixpath.join(root, value))
    return value


def usable_root(doc: dict[str, Any]) -> str | None:
    d = doc.get("deploy")
    root = d.get("root") if isinstance(d, dict) else None
    if isinstance(root, str) and root.startswith("/") and not LINE_BREAKING.search(root):
        return root
    return None


def resolve_root(raw: RawRecipe) -> RawRecipe:
    """``raw`` with its relative host paths made absolute under ``deploy.root`` (a copy; ``raw`` itself when the
    recipe sets no usable root or has nothing relative)."""
    root = usable_root(raw.doc)
    if root is None:
        return raw
    doc = copy.deepcopy(raw.doc)
    train = doc.get("train")
    if isinstance(train, dict):
        kt = train.get("kt_config")
        for key in TRAIN_PATHS:
            if key in train:
                train[key] = _under(root, train[key])
            if isinstance(kt, dict) and key in kt:   # kt_weight_path may also sit in kt_config
                kt[key] = _under(root, kt[key])
    vols = doc["deploy"].get("volumes")
    if isinstance(vols, dict):
        for key in VOLUMES:
            if key in vols:
                vols[key] = _under(root, vols[key])
    if doc == raw.doc:
        return raw
    return RawRecipe(doc=doc, source=raw.source, path=raw.path, native=raw.native)
