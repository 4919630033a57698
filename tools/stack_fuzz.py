"""The stack oracle's second generator: random combinations of recipe edits, written as YAML text.

tools/stack_oracle.py's corpus flips kt-kernel's keys one and two at a time over the shipped KT recipes. This one
draws 1-4 edits at a time from a much wider pool (LlamaFactory's evaluation/prediction/streaming settings, choice
and range arguments, feature switches whose packages the image may lack; accelerate's launch settings; kt_config
fields LlamaFactory forwards to kt-kernel) over every shipped recipe, and writes each value the way a person
would type it: YAML 1.1 spellings (``off``, ``Yes``, ``~``), odd case and blanks (``" auto"``, ``Ephemeral``),
numbers as strings, floats for integers, lists and mappings where a scalar is expected. A value is spliced into
the YAML as raw text, so ktdeploy's loader reads it exactly as it would read a user's file.

    python tools/stack_fuzz.py 5 [--seed N]     # print 5 generated recipes

Deterministic for a seed. ``cases(n, seed)`` yields (name, yaml_text).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "ktdeploy" / "builtin_recipes"


class Raw(str):
    """A value spliced into the YAML text as written (not quoted by the dumper)."""


DROP = object()   # remove the key
MODEL = "@model"  # the recipe's model_name_or_path
OTHER_DIR = "@other"  # a directory beside the model inside the model volume

T, K, A, F = "train", "kt", "accelerate", "fsdp"

# (where, key) -> values; where: train top level, train.kt_config, accelerate, accelerate.fsdp_config.
POOL: dict[tuple[str, str], list[Any]] = {
    # -- LlamaFactory: what a run needs
    (T, "stage"): ["sft", "pt", "rm", "dpo", "kto", "SFT"],
    (T, "do_train"): [True, False, Raw("yes"), Raw("off"), "true", DROP],
    (T, "finetuning_type"): ["lora", "full", "freeze", "oft", "LoRA", DROP],
    (T, "template"): ["qwen3_5", "qwen3_nothink", "qwen", "Qwen3", "nope", DROP],
    (T, "dataset"): ["alpaca_en_demo", "a,b", ["a", "b"], DROP],
    (T, "cutoff_len"): [1024, 0, -1, 1024.0, "1024", Raw("1_024")],
    # -- evaluation / prediction / streaming
    (T, "do_eval"): [True, False, Raw("on")],
    (T, "eval_strategy"): ["no", "steps", "epoch", "NO", Raw("no"), "sometimes"],
    (T, "eval_steps"): [10, 0.1, 0, -5],
    (T, "val_size"): [0.1, 0, 0.0, 1.5, 100, -0.1],
    (T, "eval_dataset"): ["alpaca_en_demo"],
    (T, "per_device_eval_batch_size"): [1, 0],
    (T, "do_predict"): [True, False],
    (T, "predict_with_generate"): [True, False],
    (T, "load_best_model_at_end"): [True, False],
    (T, "metric_for_best_model"): ["loss", "eval_loss"],
    (T, "streaming"): [True, False, Raw("Yes")],
    (T, "max_steps"): [100, -1, 0, 10.5, "100"],
    (T, "buffer_size"): [16384, 0],
    # -- schedule, optimizer, precision
    (T, "save_strategy"): ["steps", "epoch", "no", "best", "Steps", Raw("no"), "never"],
    (T, "save_steps"): [500, 0.5, 0, -1, 1.5, "500", 1.0],
    (T, "logging_steps"): [10, 0.01, 0, 1.0, -1, "10"],
    (T, "save_total_limit"): [3, 0, -1],
    (T, "lr_scheduler_type"): ["cosine", "linear", "constant", "cosine_with_restarts", "Cosine", "warmup_stable_decay",
                               "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "polynomial", "nope"],
    (T, "lr_scheduler_kwargs"): [{"min_lr": 1.0e-6}, "{}"],
    (T, "optim"): ["adamw_torch", "adamw_torch_fused", "adamw_8bit", "adafactor", "sgd", "AdamW", "galore_adamw",
                   "lomo", "paged_adamw_8bit", "schedule_free_adamw", "nope"],
    (T, "warmup_ratio"): [0.1, -0.1, 1.5, 0, "0.1", 1],
    (T, "warmup_steps"): [10, -1, 0.5, 0],
    (T, "seed"): [42, -1, 4294967296, 4294967295, "42", 3.5],
    (T, "data_seed"): [7, -1, 4294967296],
    (T, "learning_rate"): [Raw("1e-4"), 0, -1, 2, "1.0e-4", Raw("5.0e-5")],
    (T, "num_train_epochs"): [1, 0, -1, 0.5, "three", 2.0],
    (T, "per_device_train_batch_size"): [1, 2, 0, -1, 2.0, "2"],
    (T, "gradient_accumulation_steps"): [1, 0, 8, -2],
    (T, "max_grad_norm"): [1.0, -1, 0],
    (T, "weight_decay"): [0.0, -0.1, 0.01],
    (T, "adam_beta1"): [0.9, 1.5, -0.1],
    (T, "label_smoothing_factor"): [0.1, -0.1, 1.5],
    (T, "bf16"): [True, False, Raw("yes"), "true", 1, DROP],
    (T, "fp16"): [True, False],
    (T, "tf32"): [True, False],
    (T, "pure_bf16"): [True, False],
    (T, "torch_compile"): [True, False],
    (T, "neftune_noise_alpha"): [5, -1, 0],
    # -- features (and the packages they need)
    (T, "use_galore"): [True, False],
    (T, "use_apollo"): [True, False],
    (T, "use_badam"): [True, False],
    (T, "badam_mode"): ["layer", "ratio"],
    (T, "use_adam_mini"): [True, False],
    (T, "use_swanlab"): [True, False],
    (T, "enable_liger_kernel"): [True, False],
    (T, "use_unsloth"): [True, False],
    (T, "use_llama_pro"): [True],
    (T, "quantization_bit"): [4, 8, 3, "4"],
    (T, "quantization_method"): ["bnb", "hqq", "eetq", "BNB"],
    (T, "flash_attn"): ["auto", "fa2", "sdpa", "disabled", "FA2", "nope"],
    (T, "rope_scaling"): ["linear", "dynamic", "yarn", "llama3", "nope"],
    (T, "report_to"): ["none", "tensorboard", "wandb", ["none"], "swanlab", "all", "None", "mlflow"],
    (T, "plot_loss"): [True, False, Raw("off")],
    (T, "packing"): [True, False, Raw("off"), "off", Raw("NO")],
    (T, "neat_packing"): [True, False],
    (T, "train_on_prompt"): [True],
    (T, "mask_history"): [True],
    (T, "group_by_length"): [True],
    (T, "max_samples"): [1000, 0, -1],
    (T, "preprocessing_num_workers"): [16, 0, -1],
    (T, "dataloader_num_workers"): [4, 0, -1],
    (T, "ddp_timeout"): [180000000, -1, "180000000"],
    (T, "include_num_input_tokens_seen"): [True],
    (T, "overwrite_output_dir"): [False, True, Raw("no")],
    (T, "save_only_model"): [True, False],
    (T, "resume_from_checkpoint"): ["/data/output/run/checkpoint-500", "latest", True],
    (T, "deepspeed"): ["/data/ds_z3.json"],
    (T, "foo_bar"): [1],
    # -- LoRA
    (T, "lora_target"): ["all", "q_proj,v_proj", ["q_proj", "v_proj"], [], Raw("~")],
    (T, "lora_rank"): [8, 16, 0, -8, 8.0, "8", 128],
    (T, "lora_alpha"): [16, -1, "16", 16.5, 0],
    (T, "lora_dropout"): [0.05, 1.0, -0.1, 0.5, "0.05"],
    (T, "pissa_init"): [True],
    (T, "create_new_adapter"): [True],
    (T, "loraplus_lr_ratio"): [16.0, -1],
    # -- KT switches at the top level
    (T, "use_kt"): [True, False, Raw("yes"), "true", Raw("on")],
    (T, "disable_gradient_checkpointing"): [True, False, Raw("off"), "false"],
    (T, "gradient_checkpointing"): [True, False],
    (T, "gradient_checkpointing_kwargs"): [{"use_reentrant": False}],
    (T, "kt_cpu_activation"): ["retain", "recompute", "Retain", " retain", DROP],
    (T, "kt_weight_path"): [MODEL, OTHER_DIR, DROP],
    (T, "kt_non_expert_weight_path"): [OTHER_DIR + "-ne", DROP],
    (T, "kt_expert_checkpoint_path"): [MODEL, OTHER_DIR],
    (T, "kt_use_lora_experts"): [True, False],
    (T, "kt_lora_expert_num"): [2, 0, -1],
    (T, "kt_lora_expert_intermediate_size"): [1024, 0],
    # -- kt_config (kt-kernel's KTConfig through LlamaFactory)
    (K, "kt_backend"): ["auto", "AMXBF16", "amxbf16", " auto", "Auto", "auto ", "AMXINT8", "INT8", "FP8", "AMXINT4",
                        "BF16", "amxfp8", "rawint4", "mxfp4", "amxbf16_skiplora", "nope", DROP],
    (K, "kt_expert_weight_format"): ["bf16", "BF16", " bf16", "int8", "fp8", "rawint4", "mxfp4", "int4", DROP],
    (K, "kt_weight_lifecycle"): ["persistent", "ephemeral", "Ephemeral", " persistent", "PERSISTENT", "forever"],
    (K, "kt_num_threads"): [1, 0, -1, 8, "8", 8.0],
    (K, "kt_tp_enabled"): [True, False, Raw("yes"), "true"],
    (K, "kt_threadpool_count"): [1, 2, 0, -1, 3],
    (K, "kt_max_cache_depth"): [2, 0, 1, -1],
    (K, "kt_model_max_length"): [4096, 0, -1, "4096", 100, 4096.0],
    (K, "kt_share_backward_bb"): [True, False, "false"],
    (K, "kt_num_gpu_experts"): [0, 2, -1],
    (K, "kt_force_fused_expert_lora"): [True, False],
    (K, "kt_share_cache_pool"): [True, False],
    (K, "kt_checkpoint_files"): [["/data/models/x.safetensors"]],
    (K, "kt_wrap_kwargs"): [{}, {"a": 1}],
    (K, "kt_sharded_metadata"): [{}],
    (K, "kt_skip_expert_loading"): [True, False],
    (K, "enabled"): [True, False],
    (K, "kt_lora_rank"): [8],
    (K, "kt_unknown"): [1],
    # -- accelerate
    (A, "distributed_type"): ["FSDP", "fsdp", "MULTI_GPU", "NO", "MEGATRON_LM", "DEEPSPEED", "Fsdp", "MULTI_CPU",
                              Raw("no"), DROP],
    (A, "mixed_precision"): ["bf16", "fp16", "no", "fp8", "BF16", Raw("no"), DROP],
    (A, "num_processes"): [1, 2, 4, 0, -1, "2"],
    (A, "num_machines"): [1, 2],
    (A, "machine_rank"): [0, 1],
    (A, "downcast_bf16"): ["no", Raw("no"), False, True],
    (A, "use_cpu"): [False, True, Raw("no")],
    (A, "main_training_function"): ["main"],
    (A, "rdzv_backend"): ["static", "c10d"],
    (A, "same_network"): [True, False],
    (A, "enable_cpu_affinity"): [True, False],
    (A, "gpu_ids"): ["all", "0,1", "0", Raw("0")],
    (A, "debug"): [False, True],
    (A, "compute_environment"): ["LOCAL_MACHINE", "AMAZON_SAGEMAKER"],
    (A, "dynamo_config"): [{"dynamo_backend": "INDUCTOR"}],
    (A, "tpu_env"): [[]],
    (A, "fsdp_config"): [DROP],
    (A, "foo"): ["bar"],
    (F, "fsdp_version"): [1, 2, "2", 2.0, DROP],
    (F, "fsdp_activation_checkpointing"): [True, False],
    (F, "fsdp_cpu_ram_efficient_loading"): [True, False],
    (F, "fsdp_sync_module_states"): [True, False],
    (F, "fsdp_reshard_after_forward"): [True, False, "FULL_SHARD", "true"],
    (F, "fsdp_offload_params"): [True, False],
    (F, "fsdp_auto_wrap_policy"): ["TRANSFORMER_BASED_WRAP", "NO_WRAP", "SIZE_BASED_WRAP", "nope"],
    (F, "fsdp_state_dict_type"): ["FULL_STATE_DICT", "SHARDED_STATE_DICT", "nope"],
    (F, "fsdp_sharding_strategy"): ["FULL_SHARD", "SHARD_GRAD_OP"],
    (F, "fsdp_backward_prefetch"): ["BACKWARD_PRE", "NO_PREFETCH"],
    (F, "fsdp_forward_prefetch"): [True, False],
    (F, "fsdp_use_orig_params"): [True, False],
    (F, "fsdp_transformer_layer_cls_to_wrap"): ["Qwen3MoeDecoderLayer"],
}


def shipped() -> list[tuple[str, dict]]:
    from ktdeploy.core.recipe.loader import read_recipe

    return [(p.name, read_recipe(p).doc) for p in sorted(RECIPES.glob("*.yaml"))]


def _resolve(value: Any, doc: dict) -> Any:
    model = doc["train"].get("model_name_or_path", "/data/models/m")
    if value == MODEL:
        return model
    if isinstance(value, str) and value.startswith(OTHER_DIR):
        return model.rstrip("/") + "-converted" + value[len(OTHER_DIR):]
    return value


def apply(doc: dict, where: str, key: str, value: Any, raws: dict[str, str]) -> None:
    """Set (or drop) one key; a Raw value becomes a placeholder replaced in the text by ``to_text``."""
    if where == T:
        node = doc["train"]
    elif where == K:
        node = doc["train"].setdefault("kt_config", {})
        if not isinstance(node, dict):
            return
    elif where == A:
        node = doc["accelerate"]
    else:
        node = doc["accelerate"].get("fsdp_config")
        if not isinstance(node, dict):
            node = doc["accelerate"]["fsdp_config"] = {}
    if value is DROP:
        node.pop(key, None)
        return
    value = _resolve(value, doc)
    if isinstance(value, Raw):
        token = f"RAWVALUE{len(raws)}X"
        raws[token] = str(value)
        value = token
    node[key] = value


def to_text(doc: dict, raws: dict[str, str]) -> str:
    from ktdeploy.core.recipe.render import dump_yaml

    text = dump_yaml(doc)
    for token, raw in raws.items():
        text = text.replace(token, raw)
    return text


def cases(n: int, seed: int = 36) -> Iterator[tuple[str, str]]:
    """``n`` recipes (name, YAML text), each a shipped recipe with 1-4 random edits."""
    import copy

    rng = random.Random(seed)
    bases = shipped()
    keys = sorted(POOL)
    for i in range(n):
        name, base = bases[rng.randrange(len(bases))]
        doc = copy.deepcopy(base)
        raws: dict[str, str] = {}
        edits = []
        for where, key in rng.sample(keys, rng.choice((1, 1, 2, 2, 3, 4))):
            value = rng.choice(POOL[(where, key)])
            apply(doc, where, key, value, raws)
            shown = "DROP" if value is DROP else (f"raw:{value}" if isinstance(value, Raw) else repr(value))
            edits.append(f"{where}.{key}={shown}")
        yield f"fuzz#{i} {name} " + " ".join(edits), to_text(doc, raws)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    n = int(argv[0]) if argv else 3
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 36
    for name, text in cases(n, seed):
        print(f"# {name}\n{text}---")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
