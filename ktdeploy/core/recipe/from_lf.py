"""A recipe from a LlamaFactory training YAML (and Accelerate YAML), as a LlamaFactory user already has them (pure).

``derive_deploy`` fills ktdeploy's ``deploy:`` section from what the two files say: the model, data and output
volumes are the folders holding ``model_name_or_path``, ``dataset_dir`` and ``output_dir`` (absolute host paths;
a relative one gets the shipped default, which ``ktdeploy check`` then reports), one GPU per Accelerate process.
``ktdeploy recipe from-lf`` writes the result as a recipe file; ``ktdeploy up|train --train T --accelerate A``
without ``--deploy`` run it in memory.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from ktdeploy.core.recipe.train_keys import TrainKeys

DEFAULT_VOLUMES = {"model": "/srv/ktdeploy/models", "data": "/srv/ktdeploy/data", "output": "/srv/ktdeploy/output"}

# Accelerate's FSDP2 block of the cookbook (recipes/tiny-moe-lora.yaml), for a training YAML given alone.
DEFAULT_ACCELERATE: dict[str, Any] = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
    "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_cpu_ram_efficient_loading": True,
                    "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
                    "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_version": 2},
    "mixed_precision": "bf16", "num_machines": 1, "num_processes": 1, "rdzv_backend": "static",
    "same_network": True, "use_cpu": False}


def _folder_of(value: Any, *, itself: bool = False) -> str | None:
    if not isinstance(value, str) or not value.startswith("/"):
        return None
    p = posixpath.normpath(value)
    return p if itself else (posixpath.dirname(p) or "/")


def derive_deploy(train: dict[str, Any], accelerate: dict[str, Any]) -> dict[str, Any]:
    """ktdeploy's deploy: section for a LlamaFactory run (volumes from its paths, one GPU per process)."""
    t = TrainKeys(train if isinstance(train, dict) else {})
    a = accelerate if isinstance(accelerate, dict) else {}
    volumes = {
        "model": _folder_of(t.model_name_or_path) or DEFAULT_VOLUMES["model"],
        "data": _folder_of(t.dataset_dir, itself=True) or DEFAULT_VOLUMES["data"],
        "output": _folder_of(t.output_dir) or DEFAULT_VOLUMES["output"],
    }
    n = a.get("num_processes")
    n = n if isinstance(n, int) and 0 < n <= 64 else 1
    return {"image": "auto", "gpus": list(range(n)), "volumes": volumes}


def recipe_document(train: dict[str, Any], accelerate: dict[str, Any] | None) -> dict[str, Any]:
    """The three sections of a recipe: the training YAML as given, its Accelerate YAML (the cookbook's FSDP2
    block when none is given) and the derived deploy section."""
    acc = copy.deepcopy(accelerate) if isinstance(accelerate, dict) else copy.deepcopy(DEFAULT_ACCELERATE)
    return {"train": copy.deepcopy(train), "accelerate": acc, "deploy": derive_deploy(train, acc)}


def unresolved(train: dict[str, Any]) -> list[str]:
    """The training keys whose relative (or missing) paths left a default volume in the derived deploy."""
    t = TrainKeys(train if isinstance(train, dict) else {})
    return [k for k, v in (("model_name_or_path", t.model_name_or_path), ("dataset_dir", t.dataset_dir),
                           ("output_dir", t.output_dir))
            if not (isinstance(v, str) and v.startswith("/"))]
