"""TrainKeys: the LlamaFactory keys of a recipe's train: section that ktdeploy itself reads, by attribute.

Doctor's checks, the planner and `up`'s plan also run on recipes that `check` refuses (the rules report a wrong
type; the others must not crash on it), so no accessor here raises. Two kinds:

* the value as written (``object``: any YAML value, None when the key is absent), for a caller that tests or
  shows the value itself (``isinstance(v, str)``, ``str(v or "")``, ``v is True``): each caller keeps its own test;
* a reading of the key (``kt_config``, ``is_full``, ``dataset_names``, the planner's numbers): one rule, here.

The mapping itself (``doc``) stays for rendering train.yaml and for the rules, which look at any key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload


@overload
def as_int(v: Any, default: int) -> int: ...
@overload
def as_int(v: Any, default: None) -> int | None: ...
def as_int(v: Any, default: int | None) -> int | None:
    """A whole number the way the planner reads one: int(v), else ``default`` (absent, "" or not a number)."""
    try:
        return int(v) if v is not None and v != "" else default
    except (TypeError, ValueError):
        return default


def as_bool(v: Any, default: bool) -> bool:
    """A switch the way the planner reads one: a string is on when it says so (1/true/yes/on), else truthiness."""
    if v is None:
        return default
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


@dataclass(frozen=True)
class TrainKeys:
    doc: Mapping[str, Any]

    def _get(self, key: str) -> object:
        return self.doc.get(key)

    # -- as written -------------------------------------------------------------------------------------------
    @property
    def model_name_or_path(self) -> object:
        return self._get("model_name_or_path")

    @property
    def output_dir(self) -> object:
        return self._get("output_dir")

    @property
    def finetuning_type(self) -> object:
        return self._get("finetuning_type")

    @property
    def use_kt(self) -> object:
        return self._get("use_kt")

    @property
    def kt_weight_path(self) -> object:
        return self._get("kt_weight_path")

    @property
    def kt_non_expert_weight_path(self) -> object:
        return self._get("kt_non_expert_weight_path")

    @property
    def dataset(self) -> object:
        return self._get("dataset")

    @property
    def dataset_dir(self) -> object:
        return self._get("dataset_dir")

    @property
    def template(self) -> object:
        return self._get("template")

    @property
    def adapter_name_or_path(self) -> object:
        return self._get("adapter_name_or_path")

    @property
    def adapter_folder(self) -> object:
        return self._get("adapter_folder")

    @property
    def new_special_tokens_config(self) -> object:
        return self._get("new_special_tokens_config")

    @property
    def accelerator_config(self) -> object:
        return self._get("accelerator_config")

    @property
    def resume_from_checkpoint(self) -> object:
        return self._get("resume_from_checkpoint")

    @property
    def trust_remote_code(self) -> object:
        return self._get("trust_remote_code")

    @property
    def disable_gradient_checkpointing(self) -> object:
        return self._get("disable_gradient_checkpointing")

    @property
    def kt_cpu_activation(self) -> object:
        return self._get("kt_cpu_activation")

    @property
    def preprocessing_num_workers(self) -> object:
        return self._get("preprocessing_num_workers")

    # -- readings ---------------------------------------------------------------------------------------------
    @property
    def kt_config(self) -> dict[str, Any]:
        """The kt_config mapping; {} when absent or not a mapping (the rules report that)."""
        k = self._get("kt_config")
        return k if isinstance(k, dict) else {}

    @property
    def is_full(self) -> bool:
        """A full fine-tune (finetuning_type full, any case; LlamaFactory's default is lora): the run writes the
        whole model, no adapter."""
        return str(self.doc.get("finetuning_type", "lora")).lower() == "full"

    @property
    def dataset_names(self) -> list[str]:
        """The names in ``dataset``: a YAML list, or LlamaFactory's comma-separated string."""
        d = self.dataset
        if isinstance(d, list):
            return [str(x).strip() for x in d if str(x).strip()]
        if isinstance(d, str):
            return [x.strip() for x in d.split(",") if x.strip()]
        return []

    # -- the planner's readings (core/sizing/estimate.py): LlamaFactory's / HF TrainingArguments' defaults --------
    @property
    def cutoff_len(self) -> int:
        return as_int(self._get("cutoff_len"), 2048)                        # LlamaFactory DataArguments default

    @property
    def per_device_train_batch_size(self) -> int:
        return as_int(self._get("per_device_train_batch_size"), 8)          # HF TrainingArguments default

    @property
    def packing(self) -> bool:
        return as_bool(self._get("packing"), False)

    @property
    def lora_rank(self) -> int:
        return as_int(self._get("lora_rank"), 8) or 0

    @property
    def gradient_checkpointing(self) -> bool:
        return not as_bool(self.disable_gradient_checkpointing, False)

    @property
    def cpu_activation(self) -> str:
        """kt_cpu_activation lower-cased; recompute when unset."""
        return str(self.kt_cpu_activation or "recompute").lower()

    @property
    def dataloader_workers(self) -> int:
        return as_int(self._get("dataloader_num_workers"), 0) or 0

    @property
    def preprocessing_workers(self) -> int:
        return as_int(self.preprocessing_num_workers, 0) or 0

    @property
    def save_total_limit(self) -> int | None:
        return as_int(self._get("save_total_limit"), None)

    @property
    def save_steps(self) -> int | None:
        return as_int(self._get("save_steps"), None)

    @property
    def max_steps(self) -> int | None:
        """max_steps when positive (HF: -1 = run num_train_epochs)."""
        v = self._get("max_steps")
        return as_int(v, None) if (as_int(v, -1) or -1) > 0 else None

    @property
    def save_only_model(self) -> bool:
        return as_bool(self._get("save_only_model"), False)

    @property
    def save_strategy(self) -> str:
        return str(self._get("save_strategy") or "steps").lower()

    @property
    def num_train_epochs(self) -> object:
        """As written: the planner's float() of it refuses a non-number, as before (no plan then)."""
        return self._get("num_train_epochs")
