"""One good and at least one bad case per rule, asserting the dotted key path of each violation."""

from __future__ import annotations

import pytest

from ktdeploy.core.recipe.rules import RULES


def _set(doc, dotted, value):
    node = doc
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DEL:
        node.pop(last, None)
    else:
        node[last] = value


class _Del:
    pass


_DEL = _Del()

# (case id, rule id, [(dotted key, value)], expected error path)
BAD = [
    ("unknown-section", "structure.sections", [("trian", {})], "trian"),
    ("url-password", "secrets.url_password", [("train.run_name", "https://bob:hf_T0KEN@hub.example/x")], "train.run_name"),
    ("hub-token", "secrets.url_password", [("train.hf_hub_token", "hf_T0KEN")], "train.hf_hub_token"),
    ("api-key-abbrev", "secrets.url_password", [("deploy.serve.extra_args", ["--api-ke", "K"])],
     "deploy.serve.extra_args[0]"),
    ("missing-deploy", "structure.sections", [("deploy", _DEL)], "deploy"),
    ("section-not-mapping", "structure.sections", [("accelerate", [1, 2])], "accelerate"),
    ("typo-train-key", "train.unknown_key", [("train.lerning_rate", 1e-4)], "train.lerning_rate"),
    ("kt-key-at-top", "train.unknown_key", [("train.kt_num_threads", 8)], "train.kt_num_threads"),
    ("accel-key-in-train", "train.unknown_key", [("train.num_processes", 2)], "train.num_processes"),
    ("derived-in-kt-config", "train.kt_config.placement", [("train.kt_config.kt_lora_rank", 8)], "train.kt_config.kt_lora_rank"),
    ("weight-path-in-kt-config", "train.kt_config.placement", [("train.kt_config.kt_weight_path", "/data/models/x")],
     "train.kt_config.kt_weight_path"),
    ("top-key-in-kt-config", "train.kt_config.placement", [("train.kt_config.cutoff_len", 10)], "train.kt_config.cutoff_len"),
    ("typo-kt-config", "train.kt_config.placement", [("train.kt_config.kt_num_thread", 8)], "train.kt_config.kt_num_thread"),
    ("kt-config-not-flat", "train.kt_config.placement", [("train.kt_config.kt_backend", {"a": 1})], "train.kt_config.kt_backend"),
    ("kt-config-in-accelerate", "accelerate.unknown_key", [("accelerate.kt_config", {"kt_backend": "auto"})],
     "accelerate.kt_config"),
    ("typo-accelerate", "accelerate.unknown_key", [("accelerate.num_proceses", 2)], "accelerate.num_proceses"),
    ("lora-in-accelerate", "accelerate.unknown_key", [("accelerate.lora_rank", 8)], "accelerate.lora_rank"),
    ("typo-fsdp", "accelerate.unknown_key", [("accelerate.fsdp_config.fsdp_verison", 2)], "accelerate.fsdp_config.fsdp_verison"),
    ("deploy-unknown", "deploy.schema", [("deploy.gpuz", [0])], "deploy.gpuz"),
    ("deploy-relative", "deploy.schema", [("deploy.volumes.data", "data")], "deploy.volumes.data"),
    ("deploy-missing-volume", "deploy.schema", [("deploy.volumes.model", _DEL)], "deploy.volumes.model"),
    ("deploy-dup-gpus", "deploy.schema", [("deploy.gpus", [0, 0])], "deploy.gpus"),
    ("serve-one-request", "deploy.schema", [("deploy.serve.max_running_requests", 1)], "deploy.serve.max_running_requests"),
    ("kt-config-without-use-kt", "kt.requires_use_kt", [("train.use_kt", False)], "train.kt_config"),
    ("use-kt-not-bool", "kt.requires_use_kt", [("train.use_kt", "yes")], "train.use_kt"),
    ("cpu-activation-bad-value", "kt.cpu_activation", [("train.kt_cpu_activation", "keep")], "train.kt_cpu_activation"),
    ("recompute-without-gc", "kt.cpu_activation",
     [("train.kt_cpu_activation", "recompute"), ("train.disable_gradient_checkpointing", True)], "train.kt_cpu_activation"),
    ("gradient-checkpointing-true", "kt.gradient_checkpointing", [("train.gradient_checkpointing", True)],
     "train.gradient_checkpointing"),
    ("gc-kwargs", "kt.gradient_checkpointing", [("train.gradient_checkpointing_kwargs", {"use_reentrant": False})],
     "train.gradient_checkpointing_kwargs"),
    ("fsdp-activation-ckpt", "kt.gradient_checkpointing", [("accelerate.fsdp_config.fsdp_activation_checkpointing", True)],
     "accelerate.fsdp_config.fsdp_activation_checkpointing"),
    ("unsloth", "kt.incompatible_features", [("train.use_unsloth", True)], "train.use_unsloth"),
    ("predict-with-generate", "kt.incompatible_features", [("train.predict_with_generate", True)], "train.predict_with_generate"),
    ("compute-accuracy", "kt.incompatible_features", [("train.compute_accuracy", True)], "train.compute_accuracy"),
    ("zero3", "kt.incompatible_features", [("train.deepspeed", "ds_z3_config.json")], "train.deepspeed"),
    ("two-adapters", "kt.incompatible_features", [("train.adapter_name_or_path", "/a,/b")], "train.adapter_name_or_path"),
    ("overwrite-int", "types.catalog", [("train.overwrite_output_dir", 1)], "train.overwrite_output_dir"),
    ("packing-quoted-off", "types.catalog", [("train.packing", "off")], "train.packing"),
    ("save-strategy-bool", "types.catalog", [("train.save_strategy", False)], "train.save_strategy"),
    ("distributed-type-list", "types.catalog", [("accelerate.distributed_type", ["FSDP"])], "accelerate.distributed_type"),
    # 400 digits never reach the rules (the loader refuses them: tests/unit/adversarial); 65 digits do
    ("seed-65-digits", "lf.values", [("train.seed", 10**65)], "train.seed"),
    ("gpus-bools", "deploy.schema", [("deploy.gpus", [True, False])], "deploy.gpus.0"),
    ("bad-backend", "kt.values", [("train.kt_config.kt_backend", "BF16")], "train.kt_config.kt_backend"),
    ("bad-backend-unknown", "kt.values", [("train.kt_config.kt_backend", "AMXBF17")], "train.kt_config.kt_backend"),
    ("retain-amxint4", "kt.cpu_activation_retain",
     [("train.kt_config.kt_backend", "AMXINT4"), ("train.kt_cpu_activation", "retain"),
      ("train.kt_weight_path", "/data/models/q4")], "train.kt_cpu_activation"),
    ("retain-by-no-gc-amxint4", "kt.cpu_activation_retain",
     [("train.kt_config.kt_backend", "AMXINT4"), ("train.disable_gradient_checkpointing", True),
      ("train.kt_weight_path", "/data/models/q4")], "train.disable_gradient_checkpointing"),
    ("retain-gpu-experts", "kt.cpu_activation_retain",
     [("train.kt_cpu_activation", "retain"), ("train.kt_config.kt_num_gpu_experts", 2)], "train.kt_cpu_activation"),
    ("fp8-no-share-bb", "format.fp8_and_lifecycle",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_config.kt_share_backward_bb", False)],
     "train.kt_config.kt_share_backward_bb"),
    ("fp8-gpu-experts", "format.fp8_and_lifecycle",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_config.kt_num_gpu_experts", 2)],
     "train.kt_config.kt_num_gpu_experts"),
    ("int4-cookbook-nonexpert", "format.weight_paths",
     [("train.kt_config.kt_backend", "AMXINT4"), ("train.kt_weight_path", "/data/models/q4"),
      ("train.kt_non_expert_weight_path", "/data/models/ne")], "train.kt_non_expert_weight_path"),
    ("int8-original-checkpoint", "format.weight_paths",
     [("train.kt_config.kt_backend", "INT8"), ("train.kt_weight_path", "/data/models/Qwen3.5-397B-A17B"),
      ("train.kt_non_expert_weight_path", "/data/models/ne")], "train.kt_weight_path"),
    ("bad-format", "kt.values", [("train.kt_config.kt_expert_weight_format", "int4")], "train.kt_config.kt_expert_weight_format"),
    ("bad-lifecycle", "kt.values", [("train.kt_config.kt_weight_lifecycle", "forever")], "train.kt_config.kt_weight_lifecycle"),
    ("threads-float", "kt.values", [("train.kt_config.kt_num_threads", 8.0)], "train.kt_config.kt_num_threads"),
    ("threads-string", "kt.values", [("train.kt_config.kt_num_threads", "64")], "train.kt_config.kt_num_threads"),
    ("pools-zero-with-tp", "kt.values", [("train.kt_config.kt_threadpool_count", 0)], "train.kt_config.kt_threadpool_count"),
    ("backend-blank", "kt.values", [("train.kt_config.kt_backend", " auto")], "train.kt_config.kt_backend"),
    ("bool-not-bool", "kt.values", [("train.kt_config.kt_tp_enabled", "on")], "train.kt_config.kt_tp_enabled"),
    ("ft-type", "format.finetuning_type", [("train.finetuning_type", "freeze")], "train.finetuning_type"),
    ("full-with-fp8", "format.finetuning_type",
     [("train.finetuning_type", "full"), ("train.kt_config.kt_expert_weight_format", "fp8")],
     "train.kt_config.kt_expert_weight_format"),
    ("bf16-with-weight-path", "format.weight_paths", [("train.kt_weight_path", "/data/models/q-int8")], "train.kt_weight_path"),
    ("fp8-with-weight-path", "format.weight_paths",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_weight_path", "/data/models/fp8-elsewhere")],
     "train.kt_weight_path"),
    ("int8-without-paths", "format.weight_paths", [("train.kt_config.kt_expert_weight_format", "int8")], "train.kt_weight_path"),
    ("int4-same-dirs", "format.weight_paths",
     [("train.kt_config.kt_backend", "AMXINT4"), ("train.kt_config.kt_expert_weight_format", _DEL),
      ("train.kt_weight_path", "/data/models/q4"), ("train.kt_non_expert_weight_path", "/data/models/q4")],
     "train.kt_non_expert_weight_path"),
    ("int8-forced-backend", "format.int8",
     [("train.kt_config.kt_expert_weight_format", "int8"), ("train.kt_config.kt_backend", "AMXBF16"),
      ("train.kt_weight_path", "/data/models/i8"), ("train.kt_non_expert_weight_path", "/data/models/ne")],
     "train.kt_config.kt_backend"),
    ("int8-gpu-experts", "format.int8",
     [("train.kt_config.kt_expert_weight_format", "int8"), ("train.kt_config.kt_num_gpu_experts", 2),
      ("train.kt_weight_path", "/data/models/i8"), ("train.kt_non_expert_weight_path", "/data/models/ne")],
     "train.kt_config.kt_num_gpu_experts"),
    ("int8-no-share-bb", "format.int8",
     [("train.kt_config.kt_expert_weight_format", "int8"), ("train.kt_config.kt_share_backward_bb", False),
      ("train.kt_weight_path", "/data/models/i8"), ("train.kt_non_expert_weight_path", "/data/models/ne")],
     "train.kt_config.kt_share_backward_bb"),
    ("backend-format-mismatch", "format.backend_matches", [("train.kt_config.kt_backend", "FP8")], "train.kt_config.kt_backend"),
    ("fp8-ephemeral", "format.fp8_and_lifecycle",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_config.kt_weight_lifecycle", "ephemeral")],
     "train.kt_config.kt_weight_lifecycle"),
    ("fp8-rank-zero", "format.fp8_and_lifecycle",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.lora_rank", 0)], "train.lora_rank"),
    ("bf16-ephemeral", "format.fp8_and_lifecycle", [("train.kt_config.kt_weight_lifecycle", "ephemeral")],
     "train.kt_config.kt_weight_lifecycle"),
    ("lora-rank-negative", "lora.values", [("train.lora_rank", -1)], "train.lora_rank"),
    ("lora-dropout-one", "lora.values", [("train.lora_dropout", 1.5)], "train.lora_dropout"),
    ("cutoff-zero", "length.kt_model_max_length", [("train.cutoff_len", 0)], "train.cutoff_len"),
    ("mml-negative", "kt.values", [("train.kt_config.kt_model_max_length", -5)], "train.kt_config.kt_model_max_length"),
    ("cutoff-string", "length.kt_model_max_length", [("train.cutoff_len", "2k")], "train.cutoff_len"),
    ("gpus-vs-processes", "world.gpus_vs_num_processes", [("deploy.gpus", [0])], "deploy.gpus"),
    ("processes-zero", "world.gpus_vs_num_processes", [("accelerate.num_processes", 0)], "accelerate.num_processes"),
    ("two-machines", "world.gpus_vs_num_processes", [("accelerate.num_machines", 2)], "accelerate.num_machines"),
    ("use-cpu", "world.gpus_vs_num_processes", [("accelerate.use_cpu", True)], "accelerate.use_cpu"),
    ("fp16-precision", "precision.bf16", [("accelerate.mixed_precision", "fp16")], "accelerate.mixed_precision"),
    ("fp16-train", "precision.bf16", [("train.fp16", True)], "train.fp16"),
    ("stage-dpo", "task.basics", [("train.stage", "dpo")], "train.stage"),
    ("no-do-train", "task.basics", [("train.do_train", False)], "train.do_train"),
    ("no-model", "task.basics", [("train.model_name_or_path", _DEL)], "train.model_name_or_path"),
    ("no-dataset", "task.basics", [("train.dataset", _DEL)], "train.dataset"),
    ("unknown-template", "task.basics", [("train.template", "qwen35")], "train.template"),
    ("lr-string", "task.basics", [("train.learning_rate", "1e-4")], "train.learning_rate"),
    ("batch-zero", "task.basics", [("train.per_device_train_batch_size", 0)], "train.per_device_train_batch_size"),
    ("overwrite", "output.safety", [("train.overwrite_output_dir", True)], "train.overwrite_output_dir"),
    ("output-in-model", "output.safety", [("train.output_dir", "/data/models/Qwen3.5-397B-A17B/out")], "train.output_dir"),
    ("output-relative", "output.safety", [("train.output_dir", "saves/x")], "train.output_dir"),
    ("resume-not-checkpoint", "output.safety", [("train.resume_from_checkpoint", "/data/output/qwen35-bf16-lora")],
     "train.resume_from_checkpoint"),
    ("resume-true", "output.safety", [("train.resume_from_checkpoint", True)], "train.resume_from_checkpoint"),
    ("model-outside-volume", "deploy.paths", [("train.model_name_or_path", "/mnt/other/model")], "train.model_name_or_path"),
    ("hub-id", "deploy.paths", [("train.model_name_or_path", "Qwen/Qwen3.5-397B-A17B")], "train.model_name_or_path"),
    ("output-outside-volume", "deploy.paths", [("train.output_dir", "/tmp/out")], "train.output_dir"),
    ("output-is-volume", "deploy.paths", [("train.output_dir", "/data/output")], "train.output_dir"),
    ("dataset-dir-missing", "deploy.paths", [("train.dataset_dir", _DEL)], "train.dataset_dir"),
    ("dataset-dir-outside", "deploy.paths", [("train.dataset_dir", "/home/me/data")], "train.dataset_dir"),
    # issue #36: what the stack's own argument checks refuse
    ("scheduler-case", "lf.choices", [("train.lr_scheduler_type", "Cosine")], "train.lr_scheduler_type"),
    ("optim-unknown", "lf.choices", [("train.optim", "nope")], "train.optim"),
    ("save-strategy-never", "lf.choices", [("train.save_strategy", "never")], "train.save_strategy"),
    ("eval-no-data", "lf.evaluation", [("train.do_eval", True)], "train.do_eval"),
    ("eval-strategy-no-data", "lf.evaluation", [("train.eval_strategy", "steps")], "train.eval_strategy"),
    ("predict-no-generate", "lf.evaluation", [("train.do_predict", True), ("train.eval_dataset", "e")], "train.do_predict"),
    ("streaming-no-max-steps", "lf.evaluation", [("train.streaming", True)], "train.streaming"),
    ("best-model-mismatch", "lf.evaluation", [("train.load_best_model_at_end", True)], "train.load_best_model_at_end"),
    ("plateau-no-eval", "lf.evaluation", [("train.lr_scheduler_type", "reduce_lr_on_plateau")], "train.lr_scheduler_type"),
    ("seed-too-big", "lf.values", [("train.seed", 2**32)], "train.seed"),
    ("warmup-negative", "lf.values", [("train.warmup_ratio", -0.1)], "train.warmup_ratio"),
    ("save-steps-zero", "lf.values", [("train.save_steps", 0)], "train.save_steps"),
    ("logging-steps-fraction-above-one", "lf.values", [("train.logging_steps", 1.5)], "train.logging_steps"),
    ("lora-with-galore", "lf.methods", [("train.use_galore", True)], "train.use_galore"),
    ("quantization-full", "lf.methods", [("train.finetuning_type", "full"), ("train.quantization_bit", 4)],
     "train.quantization_bit"),
    ("badam-distributed", "lf.methods", [("train.finetuning_type", "full"), ("train.use_badam", True)], "train.use_badam"),
    ("liger-not-in-image", "lf.packages", [("train.enable_liger_kernel", True)], "train.enable_liger_kernel"),
    ("swanlab-not-in-image", "lf.packages", [("train.use_swanlab", True)], "train.use_swanlab"),
    ("quantization-no-bitsandbytes", "lf.packages", [("train.quantization_bit", 4)], "train.quantization_bit"),
    ("report-wandb", "lf.packages", [("train.report_to", "wandb")], "train.report_to"),
    ("fsdp-lowercase", "accelerate.launch", [("accelerate.distributed_type", "fsdp")], "accelerate.distributed_type"),
    ("multi-gpu-with-kt", "accelerate.launch", [("accelerate.distributed_type", "MULTI_GPU")],
     "accelerate.distributed_type"),
    ("fsdp-version-default", "accelerate.launch", [("accelerate.fsdp_config.fsdp_version", _DEL)],
     "accelerate.fsdp_config.fsdp_version"),
    ("fsdp-version-float", "accelerate.launch", [("accelerate.fsdp_config.fsdp_version", 2.0)],
     "accelerate.fsdp_config.fsdp_version"),
    ("fsdp-ram-loading-no-sync", "accelerate.launch", [("accelerate.fsdp_config.fsdp_sync_module_states", False)],
     "accelerate.fsdp_config.fsdp_sync_module_states"),
    ("sagemaker", "accelerate.launch", [("accelerate.compute_environment", "AMAZON_SAGEMAKER")],
     "accelerate.compute_environment"),
    ("no-distributed-type", "accelerate.launch", [("accelerate.distributed_type", _DEL)], "accelerate.distributed_type"),
    ("fp8-lora-experts", "kt.lora_experts_and_checkpoints",
     [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_use_lora_experts", True)],
     "train.kt_use_lora_experts"),
    ("int8-expert-checkpoint", "kt.lora_experts_and_checkpoints",
     [("train.kt_config.kt_expert_weight_format", "int8"), ("train.kt_weight_path", "/data/models/i8"),
      ("train.kt_non_expert_weight_path", "/data/models/ne"), ("train.kt_expert_checkpoint_path", "/data/models/x")],
     "train.kt_expert_checkpoint_path"),
    # issue 35 (core/recipe/rules_deploy.py)
    ("api-key-env-any-variable", "serve.api_key_env", [("deploy.serve.api_key_env", "AWS_SECRET_ACCESS_KEY")],
     "deploy.serve.api_key_env"),
    ("api-key-env-other-key", "serve.api_key_env", [("deploy.serve.api_key_env", "OPENAI_API_KEY")],
     "deploy.serve.api_key_env"),
    ("serve-host-flag", "serve.flag_values", [("deploy.serve.host", "--api-key")], "deploy.serve.host"),
    ("served-name-flag", "serve.flag_values", [("deploy.serve.served_model_name", "-x")],
     "deploy.serve.served_model_name"),
    ("model-basename-flag", "serve.flag_values", [("train.model_name_or_path", "/data/models/--api-key"),
                                                 ("train.output_dir", "/data/output/r")], "train.model_name_or_path"),
    ("lora-name-flag", "serve.flag_values", [("deploy.serve.lora_name", "-lora")], "deploy.serve.lora_name"),
    ("one-dash-extra-arg", "serve.flag_values", [("deploy.serve.extra_args", ["-api-key", "K"])],
     "deploy.serve.extra_args[0]"),
    ("data-volume-root", "deploy.volume_overlap", [("deploy.volumes.data", "/")], "deploy.volumes.data"),
    ("data-volume-is-model", "deploy.volume_overlap", [("deploy.volumes.data", "/data/models")], "deploy.volumes.data"),
    ("data-volume-is-output", "deploy.volume_overlap", [("deploy.volumes.data", "/data/output/")], "deploy.volumes.data"),
    ("data-volume-in-output", "deploy.volume_overlap", [("deploy.volumes.data", "/data/output/ds")],
     "deploy.volumes.data"),
    ("data-volume-in-model", "deploy.volume_overlap", [("deploy.volumes.data", "/data/models/ds"),
                                                      ("train.dataset_dir", "/data/models/ds")], "deploy.volumes.data"),
    ("data-volume-around-model", "deploy.volume_overlap", [("deploy.volumes.data", "/data"),
                                                          ("train.dataset_dir", "/data/datasets")], "deploy.volumes.data"),
    ("output-dir-newline", "paths.control_chars", [("train.output_dir", "/data/output/run\n#SBATCH --uid=0")],
     "train.output_dir"),
    ("image-repo-escape", "paths.control_chars", [("deploy.image_repo", "ktsft\x1b[2J")], "deploy.image_repo"),
    ("image-upper-case", "deploy.image_spelling", [("deploy.image", "AMX")], "deploy.image"),
    ("image-own-reference", "deploy.image_spelling", [("deploy.image", "ktsft:AMX")], "deploy.image"),
    ("image-path", "deploy.image_spelling", [("deploy.image", "./ktsft-amx.tar")], "deploy.image"),
    ("output-volume-etc", "deploy.system_volumes", [("deploy.volumes.output", "/etc"),
                                                   ("train.output_dir", "/etc/run")], "deploy.volumes.output"),
    ("fp8-backend-bf16-model", "format.fp8_model", [("train.kt_config.kt_backend", "FP8"),
                                                    ("train.kt_config.kt_expert_weight_format", _DEL)],
     "train.kt_config.kt_backend"),
    ("fp8-format-bf16-model", "format.fp8_model", [("train.kt_config.kt_expert_weight_format", "fp8")],
     "train.kt_config.kt_expert_weight_format"),
    ("rslora", "lora.servable", [("train.use_rslora", True)], "train.use_rslora"),
    ("dora", "lora.servable", [("train.use_dora", True)], "train.use_dora"),
    ("modules-to-save", "lora.servable", [("train.additional_target", "embed_tokens,lm_head")],
     "train.additional_target"),
    ("build-without-sft", "deploy.image_build", [("deploy.image", "avx512_vnni")], "deploy.image"),
    ("amxint4-on-avx512", "deploy.image_build",
     [("deploy.image", "avx512_bf16"), ("train.kt_config.kt_backend", "AMXINT4"),
      ("train.kt_weight_path", "/data/models/q4")], "deploy.image"),
    ("merge-pissa", "deploy.serve_merge", [("deploy.serve.merge", True), ("train.pissa_init", True)],
     "train.pissa_init"),
    ("merge-full", "deploy.serve_merge", [("deploy.serve.merge", True), ("train.finetuning_type", "full")],
     "deploy.serve.merge"),
    ("merge-no-kt", "deploy.serve_merge", [("deploy.serve.merge", True), ("train.use_kt", False),
                                           ("train.kt_config", _DEL)], "deploy.serve.merge"),
    # issue #36, the independent oracle's looser classes (bench/results/oracle-independent): what launch exports
    # from fsdp_config and the FSDP plugin refuses, keys the training parser does not read, report_to entries,
    # FP8 pool slices, files the stack opens while parsing
    ("fsdp-state-dict-list", "accelerate.launch", [("accelerate.fsdp_config.fsdp_state_dict_type", ["FULL_STATE_DICT"])],
     "accelerate.fsdp_config.fsdp_state_dict_type"),
    ("fsdp-state-dict-off", "accelerate.launch", [("accelerate.fsdp_config.fsdp_state_dict_type", False)],
     "accelerate.fsdp_config.fsdp_state_dict_type"),
    ("fsdp2-local-state-dict", "accelerate.launch", [("accelerate.fsdp_config.fsdp_state_dict_type", "LOCAL_STATE_DICT")],
     "accelerate.fsdp_config.fsdp_state_dict_type"),
    ("fsdp-prefetch-true", "accelerate.launch", [("accelerate.fsdp_config.fsdp_backward_prefetch", True)],
     "accelerate.fsdp_config.fsdp_backward_prefetch"),
    ("fsdp-wrap-policy-number", "accelerate.launch", [("accelerate.fsdp_config.fsdp_auto_wrap_policy", 1.0)],
     "accelerate.fsdp_config.fsdp_auto_wrap_policy"),
    ("fsdp-reshard-null", "accelerate.launch", [("accelerate.fsdp_config.fsdp_reshard_after_forward", None)],
     "accelerate.fsdp_config.fsdp_reshard_after_forward"),
    ("fsdp-offload-empty", "accelerate.launch", [("accelerate.fsdp_config.fsdp_offload_params", "")],
     "accelerate.fsdp_config.fsdp_offload_params"),
    ("fsdp-ram-loading-list", "accelerate.launch", [("accelerate.fsdp_config.fsdp_cpu_ram_efficient_loading", [True])],
     "accelerate.fsdp_config.fsdp_cpu_ram_efficient_loading"),
    ("mixed-precision-in-train", "lf.parser", [("train.mixed_precision", "bf16")], "train.mixed_precision"),
    ("eval-key-in-train", "lf.parser", [("train.task_dir", "evaluation")], "train.task_dir"),
    ("report-to-module-names", "lf.packages", [("train.report_to", ["q_proj", "v_proj"])], "train.report_to"),
    ("report-to-none-beside-other", "lf.packages", [("train.report_to", ["none", "tensorboard"])], "train.report_to"),
    ("fp8-pool-slices", "format.fp8_tp_slices",
     [("train.model_name_or_path", "/data/models/DeepSeek-V3"), ("train.kt_config.kt_expert_weight_format", "fp8"),
      ("train.kt_config.kt_threadpool_count", 512)], "train.kt_config.kt_threadpool_count"),
    ("special-tokens-outside-volumes", "lf.start_files", [("train.new_special_tokens_config", "/data/x.yaml")],
     "train.new_special_tokens_config"),
    ("accelerator-config-outside-volumes", "lf.start_files", [("train.accelerator_config", "/etc/acc.json")],
     "train.accelerator_config"),
    ("kt-adapter-relative", "lf.start_files", [("train.adapter_name_or_path", "org/adapter")],
     "train.adapter_name_or_path"),
    ("kt-adapter-two", "lf.start_files", [("train.adapter_name_or_path", "/data/output/a,/data/output/b")],
     "train.adapter_name_or_path"),
    # issue #49: the stack's own conditions (catalog_data.ARG_CONDITIONS, read from the wheels) and ddp_backend
    ("full-dora", "lf.conditions", [("train.finetuning_type", "full"), ("train.use_dora", True)], "train.use_dora"),
    ("full-rslora", "lf.conditions", [("train.finetuning_type", "full"), ("train.use_rslora", True)],
     "train.use_rslora"),
    ("full-loraplus-false", "lf.conditions", [("train.finetuning_type", "full"), ("train.loraplus_lr_ratio", False)],
     "train.loraplus_lr_ratio"),
    ("full-pissa", "lf.conditions", [("train.finetuning_type", "full"), ("train.pissa_init", True)],
     "train.pissa_init"),
    ("prefetch-without-workers", "lf.conditions", [("train.dataloader_num_workers", 0),
                                                   ("train.dataloader_prefetch_factor", 2)],
     "train.dataloader_prefetch_factor"),
    ("prefetch-default-workers", "lf.conditions", [("train.dataloader_num_workers", _DEL),
                                                   ("train.dataloader_prefetch_factor", 2)],
     "train.dataloader_prefetch_factor"),
    ("infer-backend-vllm", "lf.conditions", [("train.infer_backend", "vllm")], "train.infer_backend"),
    ("infer-backend-case", "lf.conditions", [("train.infer_backend", "HuggingFace")], "train.infer_backend"),
    ("reasoning-effort-high", "lf.conditions", [("train.reasoning_effort", "high")], "train.reasoning_effort"),
    ("full-eval-fp16-bf16", "lf.conditions", [("train.fp16_full_eval", True), ("train.bf16_full_eval", True)],
     "train.bf16_full_eval"),
    ("lora-target-null", "lora.values", [("train.lora_target", None)], "train.lora_target"),
    ("lora-target-empty", "lora.values", [("train.lora_target", "")], "train.lora_target"),
    ("lora-target-empty-list", "lora.values", [("train.lora_target", [])], "train.lora_target"),
    ("ddp-backend-unknown", "lf.ddp_backend", [("train.ddp_backend", "nccl2")], "train.ddp_backend"),
    ("ddp-backend-pair-unknown", "lf.ddp_backend", [("train.ddp_backend", "cuda:nccl,cpu:glo")], "train.ddp_backend"),
    ("ddp-backend-not-built-in", "lf.ddp_backend", [("train.ddp_backend", "mpi")], "train.ddp_backend"),
    ("ddp-backend-other-device", "lf.ddp_backend", [("train.ddp_backend", "hccl")], "train.ddp_backend"),
    # the oracle's last plain-check classes (bench/results/oracle-independent/issue49, rechecked)
    ("ddp-backend-padded", "lf.ddp_backend", [("train.ddp_backend", " nccl")], "train.ddp_backend"),
    ("ddp-backend-trailing", "lf.ddp_backend", [("train.ddp_backend", "nccl ")], "train.ddp_backend"),
    ("ddp-backend-pair-padded", "lf.ddp_backend", [("train.ddp_backend", "cpu:gloo, cuda:nccl")],
     "train.ddp_backend"),
    ("image-pixels-below-min", "lf.conditions", [("train.image_max_pixels", 100)], "train.image_max_pixels"),
    ("video-min-above-max", "lf.conditions", [("train.video_min_pixels", 10**9)], "train.video_min_pixels"),
    ("save-strategy-null", "lf.choices", [("train.save_strategy", None)], "train.save_strategy"),
    ("optim-null", "lf.choices", [("train.optim", None)], "train.optim"),
    ("kt-lora-alpha-negative", "lora.values", [("train.lora_alpha", -1)], "train.lora_alpha"),
    ("kt-lora-alpha-zero", "lora.values", [("train.lora_alpha", 0)], "train.lora_alpha"),
    ("kt-cache-depth-zero", "kt.values", [("train.kt_config.kt_max_cache_depth", 0)],
     "train.kt_config.kt_max_cache_depth"),
    ("train-fsdp-config-file", "kt.gradient_checkpointing", [("train.fsdp_config", "x")], "train.fsdp_config"),
    # the second seed's (20261208) plain-check classes
    ("lora-target-all-twice", "lora.values", [("train.lora_target", ["all", "all"])], "train.lora_target"),
    ("lora-target-all-upper", "lora.values", [("train.lora_target", "ALL")], "train.lora_target"),
    ("lora-target-all-and-more", "lora.values", [("train.lora_target", "all,q_proj")], "train.lora_target"),
    ("reward-quantization-2-bit", "lf.conditions", [("train.reward_model_quantization_bit", 2)],
     "train.reward_model_quantization_bit"),
    ("flash-attn-misspelt", "lf.enum_values", [("train.flash_attn", "fa3x")], "train.flash_attn"),
    ("flash-attn-null", "lf.enum_values", [("train.flash_attn", None)], "train.flash_attn"),
    # the third seed's (20261209) plain-check classes
    ("num-processes-missing", "accelerate.launch", [("accelerate.num_processes", _DEL)], "accelerate.num_processes"),
    ("train-fsdp-switch", "kt.train_fsdp", [("train.fsdp", " full_shard")], "train.fsdp"),
    ("llama-pro-61-layers", "lf.llama_pro_layers", [("train.use_llama_pro", True),
                                                    ("train.model_name_or_path", "/data/models/DeepSeek-V3"),
                                                    ("train.kt_config.kt_backend", "FP8")], "train.use_llama_pro"),
]


def _apply(doc, changes):
    for key, value in changes:
        _set(doc, key, value)
    return doc


@pytest.mark.parametrize("case,rule_id,changes,path", BAD, ids=[b[0] for b in BAD])
def test_bad_case_is_rejected_with_its_key_path(base_doc, check_doc, case, rule_id, changes, path):
    errs, _, _ = check_doc(_apply(base_doc, changes))
    assert path in errs, f"{case}: expected an error at {path}, got {sorted(errs)}"
    mine = [f for f in errs[path] if f.rule == rule_id]
    assert mine, f"{case}: {path} was flagged by {[f.rule for f in errs[path]]}, not {rule_id}"
    assert all(f.fix for f in mine), "every error carries a fix"
    # the location points into the file (line of the key, or of its parent for a missing key)
    assert all(f.file and f.line for f in mine)


def test_every_rule_has_a_bad_case():
    covered = {b[1] for b in BAD}
    assert {rid for rid, _ in RULES} <= covered


def test_every_rule_names_its_source():
    for rid, fn in RULES:
        assert fn.__doc__ and len(fn.__doc__.strip()) > 20, rid


@pytest.mark.parametrize("name", ["qwen35-397b-bf16-lora.yaml", "deepseek-v3-fp8-lora.yaml", "qwen3-235b-int8-lora.yaml",
                                  "qwen35-397b-amxint4-lora.yaml", "glm-4.5-air-bf16-full.yaml", "tiny-moe-lora.yaml"])
def test_shipped_recipes_check_clean(check_doc, name):
    from tests.unit.core.recipe.conftest import _read

    errs, warns, _ = check_doc(_read(name), name)
    assert errs == {}
    assert warns == {}


GOOD = [
    ("retain", [("train.kt_cpu_activation", "retain")]),
    ("recompute-with-gc", [("train.kt_cpu_activation", "recompute"), ("train.disable_gradient_checkpointing", False)]),
    ("mml-with-margin", [("train.kt_config.kt_model_max_length", 2176)]),
    ("resume-checkpoint", [("train.resume_from_checkpoint", "/data/output/qwen35-bf16-lora/checkpoint-500")]),
    ("fp8-persistent", [("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_config.kt_weight_lifecycle", "persistent"),
                        ("train.model_name_or_path", "/data/models/DeepSeek-V3")]),   # an FP8 model (format.fp8_model)
    ("fp8-backend-fp8-model", [("train.kt_config.kt_backend", "FP8"), ("train.kt_config.kt_expert_weight_format", _DEL),
                               ("train.model_name_or_path", "/data/models/DeepSeek-V3")]),
    ("api-key-env-ktdeploy", [("deploy.serve.api_key_env", "KTDEPLOY_API_KEY")]),
    ("serve-on-every-interface", [("deploy.serve.host", "0.0.0.0"), ("deploy.serve.extra_args", ["--chunked-prefill-size", "-1"])]),
    ("int8-ephemeral", [("train.kt_config.kt_expert_weight_format", "int8"), ("train.kt_config.kt_weight_lifecycle", "ephemeral"),
                        ("train.kt_weight_path", "/dev/shm/kt-int8-run-001"), ("train.kt_non_expert_weight_path", "/data/models/ne")]),
    ("one-gpu", [("deploy.gpus", [3]), ("accelerate.num_processes", 1)]),
    ("four-gpus", [("deploy.gpus", [0, 1, 2, 3]), ("accelerate.num_processes", 4)]),
    ("rank-16", [("train.lora_rank", 16), ("train.lora_alpha", 32)]),
    # issue #36: values the stack accepts (each was refused with a wrong reason before)
    ("kt-share-cache-pool", [("train.kt_config.kt_share_cache_pool", True)]),
    ("kt-checkpoint-files", [("train.kt_config.kt_checkpoint_files", ["/data/models/x.safetensors"])]),
    ("kt-wrap-kwargs", [("train.kt_config.kt_wrap_kwargs", {"a": 1})]),
    ("kt-enabled-true", [("train.kt_config.enabled", True), ("train.kt_config.kt_skip_expert_loading", True)]),
    ("downcast-bf16-no", [("accelerate.downcast_bf16", "no")]),
    ("save-steps-ratio", [("train.save_steps", 0.5), ("train.logging_steps", 0.01)]),
    ("lora-target-list", [("train.lora_target", ["q_proj", "v_proj"])]),
    ("dataset-list", [("train.dataset", ["a", "b"])]),
    ("fp8-weight-path-is-model", [("train.kt_config.kt_expert_weight_format", "fp8"),
                                  ("train.kt_weight_path", "/data/models/Qwen3.5-397B-A17B")]),
    ("threads-zero-warns", [("train.kt_config.kt_num_threads", 0)]),
    ("threads-below-pools-warns", [("train.kt_config.kt_num_threads", 1)]),
    ("int8-lifecycle-case", [("train.kt_config.kt_expert_weight_format", "int8"),
                             ("train.kt_config.kt_weight_lifecycle", "Ephemeral"),
                             ("train.kt_weight_path", "/dev/shm/kt-int8-run-001"), ("train.kt_non_expert_weight_path", "/data/models/ne")]),
    ("mixed-precision-upper", [("accelerate.mixed_precision", "BF16")]),
    ("lora-alpha-float", [("train.lora_alpha", 16.5)]),
    ("mml-below-cutoff-warns", [("train.kt_config.kt_model_max_length", 2048)]),
    ("mml-string", [("train.kt_config.kt_model_max_length", "4096")]),
    ("full-with-lora-fields-warns", [("train.finetuning_type", "full")]),
    ("eval-with-val-size", [("train.do_eval", True), ("train.val_size", 0.1), ("train.eval_strategy", "steps")]),
    ("fsdp-version-string", [("accelerate.fsdp_config.fsdp_version", "2")]),
    ("int8-without-nonexpert", [("train.kt_config.kt_expert_weight_format", "int8"),
                                ("train.kt_weight_path", "/data/models/q-int8")]),   # kt-kernel 0.7.2 accepts it
    ("rslora-off", [("train.use_rslora", False), ("train.use_dora", False)]),
    ("full-dora-off-warns", [("train.finetuning_type", "full"), ("train.use_dora", False)]),
    ("prefetch-with-workers", [("train.dataloader_num_workers", 2), ("train.dataloader_prefetch_factor", 2)]),
    ("prefetch-null-without-workers", [("train.dataloader_num_workers", 0), ("train.dataloader_prefetch_factor", None)]),
    ("infer-backend-hf", [("train.infer_backend", "huggingface")]),
    ("reasoning-effort-low", [("train.reasoning_effort", "low")]),
    ("ddp-backend-nccl", [("train.ddp_backend", "nccl")]),
    ("ddp-backend-upper", [("train.ddp_backend", "NCCL")]),
    ("ddp-backend-pairs", [("train.ddp_backend", "cuda:nccl,cpu:gloo")]),
    ("image-build-that-trains", [("deploy.image", "avx512_bf16")]),
    ("image-amx", [("deploy.image", "amx")]),
    ("merge", [("deploy.serve.merge", True)]),
    # issue #36: what the stack accepts next to the independent oracle's looser classes
    ("fsdp-state-dict-sharded-lower", [("accelerate.fsdp_config.fsdp_state_dict_type", "sharded_state_dict")]),
    ("fsdp-state-dict-number", [("accelerate.fsdp_config.fsdp_state_dict_type", 3)]),
    ("fsdp-prefetch-none", [("accelerate.fsdp_config.fsdp_backward_prefetch", "NO_PREFETCH")]),
    ("fsdp-offload-yes", [("accelerate.fsdp_config.fsdp_offload_params", "off")]),
    ("seed-is-a-training-key", [("train.seed", 42)]),
    ("report-to-all", [("train.report_to", "all")]),
    ("report-to-none-list", [("train.report_to", ["none"])]),
    ("fp8-pool-slices-fit", [("train.model_name_or_path", "/data/models/DeepSeek-V3"),
                             ("train.kt_config.kt_expert_weight_format", "fp8"), ("train.kt_config.kt_threadpool_count", 8)]),
    ("kt-adapter-in-output-warns", [("train.adapter_name_or_path", "/data/output/earlier-run")]),
    ("special-tokens-in-data-warns", [("train.new_special_tokens_config", "/data/datasets/tokens.yaml")]),
    # beside the oracle's last plain-check classes: what the stack takes
    ("image-pixels-equal", [("train.image_max_pixels", 1024), ("train.image_min_pixels", 1024)]),
    ("video-pixels-wider", [("train.video_max_pixels", 10**6), ("train.video_min_pixels", 256)]),
    ("debug-null", [("train.debug", None)]),
    ("fsdp-null", [("train.fsdp", None)]),
    ("kt-cache-depth-two", [("train.kt_config.kt_max_cache_depth", 2)]),
    ("train-fsdp-config-mapping", [("train.fsdp_config", {"min_num_params": 0})]),
    ("lora-target-all-in-a-list", [("train.lora_target", ["all"])]),
    ("reward-quantization-4-bit", [("train.reward_model_quantization_bit", 4)]),
    ("flash-attn-sdpa", [("train.flash_attn", "sdpa")]),
    ("rope-scaling-null", [("train.rope_scaling", None)]),
    ("rope-scaling-unknown-warns", [("train.rope_scaling", "ntk")]),
    ("train-fsdp-version-2", [("train.fsdp", "full_shard"), ("train.fsdp_config", {"version": 2})]),
]


@pytest.mark.parametrize("case,changes", GOOD, ids=[g[0] for g in GOOD])
def test_good_variants_have_no_errors(base_doc, check_doc, case, changes):
    errs, _, _ = check_doc(_apply(base_doc, changes))
    assert errs == {}


def test_all_violations_reported_at_once(base_doc, check_doc):
    doc = _apply(base_doc, [("train.lerning_rate", 1), ("accelerate.kt_config", {}), ("deploy.gpus", [0]),
                            ("train.overwrite_output_dir", True), ("train.kt_config.kt_lora_rank", 8)])
    errs, _, _ = check_doc(doc)
    assert {"train.lerning_rate", "accelerate.kt_config", "deploy.gpus", "train.overwrite_output_dir",
            "train.kt_config.kt_lora_rank"} <= set(errs)


def test_did_you_mean_and_home(base_doc, check_doc):
    errs, _, _ = check_doc(_apply(base_doc, [("train.lerning_rate", 1e-4), ("train.kt_backend", "auto")]))
    assert "learning_rate" in errs["train.lerning_rate"][0].fix
    assert "train.kt_config" in errs["train.kt_backend"][0].message


def test_warnings_do_not_fail(base_doc, check_doc):
    errs, warns, _ = check_doc(_apply(base_doc, [("train.lora_alpha", 64), ("train.kt_config.kt_model_max_length", 2100),
                                                 ("train.save_only_model", True)]))
    assert errs == {}
    assert {"train.lora_alpha", "train.kt_config.kt_model_max_length", "train.save_only_model"} <= set(warns)


def test_line_numbers_point_at_the_key(base_doc, check_doc, tmp_path):
    errs, _, _ = check_doc(_apply(base_doc, [("train.overwrite_output_dir", True)]))
    f = errs["train.overwrite_output_dir"][0]
    lines = open(f.file).read().splitlines()
    assert lines[f.line - 1].strip().startswith("overwrite_output_dir:")
