"""Published measured peaks the resource model is calibrated against (data, with their sources).

The GPU machine's own runs live in ``bench/results/gpu_peaks.json``; ``bench/planner_calibration.py`` reads
both and writes ``bench/results/planner-calibration.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ktdeploy.core.sizing.model_config import MoEArchitecture, load_model_config, shipped_models_dir


@dataclass(frozen=True)
class Anchor:
    name: str
    model_config: Path
    train: dict[str, Any]
    accelerate: dict[str, Any]
    peak_host_rss_gib: float | None
    peak_gpu_mem_gib: float | None
    source: str
    bf16_copy: bool = False   # the run read a BF16 conversion of an FP8 release (its config.json without quantization)

    def arch(self) -> MoEArchitecture:
        a = load_model_config(self.model_config)
        return replace(a, native_format="bf16", quant_block=None) if self.bf16_copy else a


# Cookbook §4 (kt-facts.md "Published figures"): KTransformers BF16 LoRA, cutoff 2048, batch 1 per GPU, GA 1,
# 2 GPUs; peak GPU = highest single-GPU peak, host = peak RSS of the training process tree. The YAML is the
# cookbook's Appendix A.1/A.2 pair (its own example model is Qwen3.5; the table row is Qwen3-235B).
_A1_TRAIN: dict[str, Any] = {
    "model_name_or_path": "/data/models/Qwen3-235B-A22B-Instruct-2507",
    "disable_gradient_checkpointing": False, "finetuning_type": "lora", "lora_rank": 8, "lora_alpha": 16,
    "lora_dropout": 0.0, "lora_target": "all", "cutoff_len": 2048, "packing": False,
    "preprocessing_num_workers": 16, "dataloader_num_workers": 4, "save_steps": 500, "save_only_model": False,
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "bf16": True, "use_kt": True,
    "kt_config": {"kt_expert_weight_format": "bf16", "kt_backend": "auto", "kt_num_threads": 64,
                  "kt_tp_enabled": True, "kt_threadpool_count": 2, "kt_max_cache_depth": 2,
                  "kt_share_backward_bb": True},
}
_A2_ACCELERATE = {
    "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 2,
    "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_cpu_ram_efficient_loading": True,
                    "fsdp_offload_params": False, "fsdp_reshard_after_forward": True, "fsdp_version": 2},
}

COOKBOOK_QWEN3_235B = Anchor(
    name="cookbook Qwen3-235B-A22B-2507 BF16 LoRA, 2 GPUs",
    model_config=shipped_models_dir() / "Qwen3-235B-A22B-Instruct-2507.json",
    train=_A1_TRAIN, accelerate=_A2_ACCELERATE,
    peak_host_rss_gib=545.36, peak_gpu_mem_gib=27.14,
    source="cookbook §4 table (kt-facts.md): 27.14 GiB per GPU, 545.36 GiB host RSS, 147.91 tokens/s",
)

ANCHORS = [COOKBOOK_QWEN3_235B]


# Held out (never fitted): the KT release notes' rounded host figures for DeepSeek-V3.1 LoRA (kt-facts.md:
# "native-FP8 LoRA about 800 GB host vs about 1.4 TB BF16"). Their YAML is not published; the A.1/A.2 pair with
# the DeepSeek dimensions stands in, so these rows test the order of magnitude and the FP8/BF16 ratio only.
def _deepseek(fmt: str) -> dict[str, Any]:
    t = {**_A1_TRAIN, "model_name_or_path": "/data/models/DeepSeek-V3",
         "kt_config": {**_A1_TRAIN["kt_config"], "kt_expert_weight_format": fmt}}
    return t


HELD_OUT = [
    Anchor(name="KT notes DeepSeek-V3.1 FP8 LoRA (about 800 GB)",
           model_config=shipped_models_dir() / "DeepSeek-V3.json", train=_deepseek("fp8"),
           accelerate=_A2_ACCELERATE, peak_host_rss_gib=800e9 / 2**30, peak_gpu_mem_gib=None,
           source="KT release notes via kt-facts.md (rounded, setup unpublished)"),
    Anchor(name="KT notes DeepSeek-V3.1 BF16 LoRA (about 1.4 TB)",
           model_config=shipped_models_dir() / "DeepSeek-V3.json", train=_deepseek("bf16"),
           accelerate=_A2_ACCELERATE, peak_host_rss_gib=1.4e12 / 2**30, peak_gpu_mem_gib=None,
           source="KT release notes via kt-facts.md (rounded, setup unpublished)", bf16_copy=True),
]
