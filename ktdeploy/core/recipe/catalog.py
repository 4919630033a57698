"""Which keys live where: the facts the placement and did-you-mean rules use."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from ktdeploy.core.recipe.catalog_data import ACCELERATE_KEYS, KT_FIELDS, TRAIN_KEYS
from ktdeploy.core.recipe.catalog_data import LIST_ARGS as LIST_ARGS  # rules.py reads cat.LIST_ARGS, cat.TEMPLATES
from ktdeploy.core.recipe.catalog_data import TEMPLATES as TEMPLATES

# Keys of the flat `kt_config` mapping inside the training YAML (kt-facts.md, "Inside kt_config").
KT_CONFIG_KEYS = (
    "kt_backend", "kt_expert_weight_format", "kt_weight_lifecycle", "kt_num_threads", "kt_tp_enabled",
    "kt_threadpool_count", "kt_max_cache_depth", "kt_model_max_length", "kt_share_backward_bb",
    "kt_num_gpu_experts", "kt_force_fused_expert_lora",
)

# kt_config keys LlamaFactory derives itself and rejects when written (KTransformersArguments._KT_DERIVED_KEYS),
# each mapped to the top-level training key that owns it.
KT_DERIVED = {
    "kt_lora_rank": "train.lora_rank",
    "kt_lora_alpha": "train.lora_alpha",
    "kt_lora_dropout": "train.lora_dropout",
    "kt_weight_path": "train.kt_weight_path",
    "kt_non_expert_weight_path": "train.kt_non_expert_weight_path",
    "kt_expert_checkpoint_path": "train.kt_expert_checkpoint_path",
    "kt_use_lora_experts": "train.kt_use_lora_experts",
    "kt_lora_expert_num": "train.kt_lora_expert_num",
    "kt_lora_expert_intermediate_size": "train.kt_lora_expert_intermediate_size",
    "kt_train_mode": "train.finetuning_type",
    "kt_full_weight_grad": "train.finetuning_type",
    "kt_activation_policy": "train.kt_cpu_activation and train.disable_gradient_checkpointing",
    "kt_skip_expert_loading": "(set by LlamaFactory)",
    "enabled": "train.use_kt",
}

# Every kt_config key the stack takes: LlamaFactory forwards kt_config to kt-kernel's KTConfig as written, less the
# keys it derives (KTConfig's fields are generated into catalog_data.KT_FIELDS). kt_share_cache_pool,
# kt_checkpoint_files, kt_sharded_metadata, kt_wrap_fn and kt_wrap_kwargs are KTConfig fields too.
KT_ACCEPTED_KEYS = (frozenset(KT_FIELDS) - frozenset(KT_DERIVED)) | frozenset(KT_CONFIG_KEYS)
# LlamaFactory drops these two from kt_config when they are `true` (transformers-kt's transport metadata,
# model_args.py _normalize_advanced_kt_config); any other value is a derived-key conflict.
KT_DROPPED_WHEN_TRUE = ("enabled", "kt_skip_expert_loading")


def kt_structured(key: str) -> bool:
    """Whether KTConfig annotates ``key`` as a list or a mapping (kt_checkpoint_files, kt_wrap_kwargs, ...)."""
    ann = KT_FIELDS.get(key, "")
    return "list" in ann or "dict" in ann or "Mapping" in ann or "Callable" in ann


# kt-kernel 0.7.2 (kt_kernel/sft/config.py _KNOWN_SFT_BACKENDS) matches backends case-insensitively and
# knows no `BF16`; ktdeploy supports the cookbook's setups among them (docs/stack-rules.md).
KT_BACKENDS = ("auto", "AMXBF16", "AMXINT8", "AMXINT4", "INT8", "FP8")
KT_KERNEL_BACKENDS = ("auto", "int8", "fp8", "amxbf16", "amxint8", "amxfp8", "amxint4", "rawint4", "mxfp4",
                      "amxint4_kgroup", "amxbf16_skiplora", "amxint8_skiplora", "amxint4_skiplora")
WEIGHT_FORMATS = ("bf16", "int8", "fp8")  # compared lower-cased, as kt-kernel does
LIFECYCLES = ("persistent", "ephemeral")

LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target",
               "loraplus_lr_ratio", "loraplus_lr_embedding", "use_rslora", "use_dora", "pissa_init",
               "pissa_iter", "pissa_convert", "create_new_adapter")

# Accelerate's fsdp_config keys (accelerate config file format).
FSDP_CONFIG_KEYS = (
    "fsdp_activation_checkpointing", "fsdp_auto_wrap_policy", "fsdp_backward_prefetch", "fsdp_cpu_ram_efficient_loading",
    "fsdp_forward_prefetch", "fsdp_ignored_modules", "fsdp_min_num_params", "fsdp_offload_params",
    "fsdp_reshard_after_forward", "fsdp_state_dict_type", "fsdp_sync_module_states",
    "fsdp_transformer_layer_cls_to_wrap", "fsdp_use_orig_params", "fsdp_version", "fsdp_sharding_strategy",
)

DEPLOY_KEYS = ("image", "image_repo", "registry", "gpus", "root", "volumes", "reserve_cores", "serve", "scheduler")

TRAIN_KEY_SET = frozenset(TRAIN_KEYS)
ACCELERATE_KEY_SET = frozenset(ACCELERATE_KEYS)


def did_you_mean(key: str, candidates: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The closest candidate (``cutoff``: lower for short names, where one wrong letter is a third of the word)."""
    match = difflib.get_close_matches(key, list(candidates), n=1, cutoff=cutoff)
    return match[0] if match else None


def home_of(key: str) -> str | None:
    """Where a key belongs when it is written in the wrong place (None when it is unknown everywhere)."""
    if key in KT_ACCEPTED_KEYS:
        return "train.kt_config"
    if key in TRAIN_KEY_SET:
        return "train"
    if key in ACCELERATE_KEY_SET:
        return "accelerate"
    if key in FSDP_CONFIG_KEYS:
        return "accelerate.fsdp_config"
    if key in DEPLOY_KEYS:
        return "deploy"
    return None
