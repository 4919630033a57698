"""The recipe's knobs the resource model reads (pure), with LlamaFactory / HF Trainer / kt-kernel defaults:
``setup_from(train, accelerate, gpus) -> Setup``, and the bytes of one routed-expert weight in each format."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.train_keys import TrainKeys, as_bool, as_int
from ktdeploy.core.sizing.model_config import MoEArchitecture

AMX_M_STEP = 32      # kt-kernel _AMX_M_STEP: max_len is rounded up to it
AMX_K_STEP = 32      # LoRA rank is padded to it in the AMX BufferB copies (padded_lora_rank_)


@dataclass(frozen=True)
class Setup:
    finetuning: str            # lora | full
    lora_rank: int
    expert_format: str         # bf16 | fp8 | int8 | int4
    cutoff_len: int
    batch: int
    packing: bool
    gradient_checkpointing: bool
    cpu_activation: str        # retain | recompute
    cache_depth: int
    share_backward_bb: bool
    tp_parts: int
    num_threads: int
    model_max_length: int
    num_processes: int
    fsdp: bool
    mixed_precision: str
    cpu_ram_efficient_loading: bool
    dataloader_workers: int
    preprocessing_workers: int
    save_total_limit: int | None
    save_steps: int | None
    max_steps: int | None
    save_only_model: bool
    save_strategy: str
    num_train_epochs: float
    num_gpu_experts: int
    weight_lifecycle: str

    @property
    def tokens_per_gpu(self) -> int:
        return self.cutoff_len * self.batch

    @property
    def kt_max_len(self) -> int:
        """Rows of every KT buffer: rank 0 receives all ranks' tokens (wrapper.py: x world size)."""
        return _ceil_to(self.model_max_length * self.num_processes, AMX_M_STEP)

    @property
    def padded_rank(self) -> int:
        return _ceil_to(self.lora_rank, AMX_K_STEP) if self.lora_rank else 0


def _ceil_to(x: float, m: int) -> int:
    return int(math.ceil(x / m) * m)


def _epochs(v: Any) -> float:
    """num_train_epochs (HF default 3). A value the Trainer cannot count steps from (not a number, nan, inf) is
    no plan, said with the key (doctor's plan.* checks are skipped naming it; `check` reports the value)."""
    try:
        epochs = float(v or 3.0)
    except (TypeError, ValueError, OverflowError):
        epochs = math.nan
    if not math.isfinite(epochs) or epochs < 0:
        raise RecipeError(f"num_train_epochs {str(v)[:40]!r} is not a number of epochs", key="train.num_train_epochs",
                          fix="e.g. num_train_epochs: 3")
    return epochs


def expert_format(train: Mapping[str, Any], arch: MoEArchitecture | None = None) -> str:
    """Routed-expert format in CPU memory, decided once for the whole package by
    recipe/expert_format.py expert_setup (kt-kernel's own rule: the format, else the one kt_backend implies)."""
    fmt = expert_setup(TrainKeys(train).kt_config)
    return fmt if fmt in ("bf16", "fp8", "int8", "int4") else "bf16"


def setup_from(train: Mapping[str, Any], accelerate: dict[str, Any], gpus: int | None = None) -> Setup:
    t = TrainKeys(train)
    kt = t.kt_config
    cutoff, batch, packing = t.cutoff_len, t.per_device_train_batch_size, t.packing
    derived = _ceil_to(cutoff + (1 if packing else 0), 8) * batch      # LlamaFactory raises kt_model_max_length to this
    mml = max(as_int(kt.get("kt_model_max_length"), 0) or 0, derived)
    nproc = gpus or as_int(accelerate.get("num_processes"), 1) or 1
    fsdp = str(accelerate.get("distributed_type", "")).upper() == "FSDP" or bool(accelerate.get("fsdp_config"))
    fcfg_raw = accelerate.get("fsdp_config")
    fcfg: dict[str, Any] = fcfg_raw if isinstance(fcfg_raw, dict) else {}
    full = t.is_full
    tp_enabled = as_bool(kt.get("kt_tp_enabled"), False)
    return Setup(
        finetuning="full" if full else "lora",
        lora_rank=0 if full else t.lora_rank,
        expert_format=expert_format(train),
        cutoff_len=cutoff, batch=batch, packing=packing,
        gradient_checkpointing=t.gradient_checkpointing,
        cpu_activation=t.cpu_activation,
        cache_depth=as_int(kt.get("kt_max_cache_depth"), 2) or 2,
        share_backward_bb=as_bool(kt.get("kt_share_backward_bb"), True),
        tp_parts=(as_int(kt.get("kt_threadpool_count"), 1) or 1) if tp_enabled else 1,
        num_threads=as_int(kt.get("kt_num_threads"), 1) or 1,
        model_max_length=mml, num_processes=nproc, fsdp=fsdp,
        mixed_precision=str(accelerate.get("mixed_precision") or "no").lower(),
        cpu_ram_efficient_loading=as_bool(fcfg.get("fsdp_cpu_ram_efficient_loading"), True),
        dataloader_workers=t.dataloader_workers,
        preprocessing_workers=t.preprocessing_workers,
        save_total_limit=t.save_total_limit,
        save_steps=t.save_steps,
        max_steps=t.max_steps,
        save_only_model=t.save_only_model,
        save_strategy=t.save_strategy,
        num_train_epochs=_epochs(t.num_train_epochs),
        num_gpu_experts=as_int(kt.get("kt_num_gpu_experts"), 0) or 0,
        weight_lifecycle=str(kt.get("kt_weight_lifecycle") or "persistent").lower(),
    )


def expert_bytes_per_param(fmt: str, arch: MoEArchitecture) -> float:
    """Bytes per routed-expert weight including its scales (averaged over gate/up [I x H] and down [H x I])."""
    h, i = arch.hidden_size, arch.moe_intermediate_size
    if fmt == "fp8":     # E4M3 + one fp32 scale per 128x128 block (the FP8 SFT backend requires 128x128)
        return 1.0 + 4.0 / (128 * 128)
    if fmt == "int8":    # int8 + one fp32 scale per output channel: gate/up rows have H inputs, down rows I
        return 1.0 + 4.0 * (2.0 / h + 1.0 / i) / 3.0
    if fmt == "int4":    # two weights per byte + one fp32 scale per output channel (kt-kernel BufferBInt4)
        return 0.5 + 4.0 * (2.0 / h + 1.0 / i) / 3.0
    return 2.0           # bf16
