"""Rules that catch, without the stack, what the stack's own argument checks refuse (issue #36).

``ktdeploy check --stack`` runs the real code (core/recipe/stack_judge_payload.py); these rules make plain ``check``
never looser on the same classes. Values the stack takes from a closed set are generated from its definitions
(catalog_data: ENUM_CHOICES, LF_ENUM_FIELDS, FEATURE_PACKAGES, QUANTIZATION_PACKAGES, LOCKED, REPORT_INTEGRATIONS, TRAIN_DEFAULTS,
LAUNCH_DEFAULTS, DISTRIBUTED_TYPES, FSDP_*; tools/gen_key_catalog.py); the checks that live in code (conditions
on several arguments) are transcribed, each citing the line it mirrors, and tests/integration/test_stack_judge.py
holds every one of them against the real code on thousands of generated recipes.

Registered into rules.RULES by rules.py (before ``types.catalog``, which skips the keys reported here).
"""

from __future__ import annotations

import posixpath
from typing import Any

from ktdeploy.core.recipe import catalog_data as cd
from ktdeploy.core.recipe.rules_base import Ctx, RuleSet, _is_int, _num, inside

rule = RuleSet()

SEED_MAX = 2**32 - 1          # numpy's legacy seed range (transformers.set_seed -> np.random.seed)
EVAL_KEYS = ("do_eval", "do_predict", "predict_with_generate")
MULTI_DEVICE_TYPES = ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
                      "MULTI_NEURON")
TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")        # accelerate.utils.str_to_bool
FALSE_WORDS = ("n", "no", "f", "false", "off", "0")


def _v(ctx: Ctx, key: str) -> Any:
    """The training value LlamaFactory ends up with: the recipe's, else the dataclass default."""
    return ctx.t[key] if key in ctx.t else cd.TRAIN_DEFAULTS.get(key)


def _mapping(v: Any) -> dict[str, Any]:
    """A section the recipe should hold as a mapping: itself, else empty (the type rule reports the value)."""
    return v if isinstance(v, dict) else {}


def _launch(ctx: Ctx, key: str) -> Any:
    """An fsdp_config value as accelerate launch takes it: the recipe's, else launch's own default."""
    fsdp = _mapping(ctx.a.get("fsdp_config"))
    if key in fsdp:
        return fsdp[key]
    short = key[len("fsdp_"):] if key.startswith("fsdp_") else key
    return fsdp.get(short, cd.LAUNCH_DEFAULTS.get(key))


def _strategy(ctx: Ctx, key: str) -> str | None:
    v = _v(ctx, key)
    return v if isinstance(v, str) else None


# ---------------------------------------------------------------- LlamaFactory / transformers arguments

# LlamaFactory's hparams define these argument classes, but get_train_args parses a KT run with _TRAIN_ARGS
# (Model/Data/Training/Finetuning/GeneratingArguments) only: MegatronBridgeArguments is parsed only under
# USE_MEGATRON_BRIDGE=1, EvaluationArguments only by the evaluation entry (get_eval_args). The keys below are those
# two classes' fields that no _TRAIN_ARGS class defines (catalog_data.TRAIN_KEYS names one owner per key, so `seed`,
# also a TrainingArguments field, is not one of them); tests/unit/core/recipe/test_rules_stack_parser.py holds the list
# against the argument classes dumped from the image's wheels (tests/oracle/stack_catalog.json).
NOT_PARSED_FOR_TRAINING = {"MegatronBridgeArguments": "the Megatron-Bridge trainer (USE_MEGATRON_BRIDGE=1)",
                           "EvaluationArguments": "LlamaFactory's evaluation command (llamafactory-cli eval)"}
NOT_PARSED_KEYS = frozenset((
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "apply_rope_fusion", "batch_size",
    "bias_activation_fusion", "calculate_per_token_loss", "context_parallel_size", "cross_entropy_loss_fusion",
    "download_mode", "expert_model_parallel_size", "export_hf_on_finish", "extra_config", "lang",
    "masked_softmax_fusion", "megatron_pretrained_checkpoint", "mixed_precision", "moe_grouped_gemm",
    "moe_token_dispatcher_type", "n_shot", "overlap_grad_reduce", "overlap_param_gather",
    "pipeline_model_parallel_size", "recompute_granularity", "recompute_method", "recompute_num_layers", "save_dir",
    "sequence_parallel", "task", "task_dir", "tensor_model_parallel_size", "use_distributed_optimizer",
    "use_packed_sequences", "virtual_pipeline_model_parallel_size"))
ACCELERATE_HOMES = ("mixed_precision",)


@rule("lf.parser")
def lf_parser(ctx: Ctx) -> None:
    """Keys of LlamaFactory argument classes that its training parser does not read: HfArgumentParser.parse_dict
    (allow_extra_keys=False) refuses them ('Some keys are not used by the HfArgumentParser: [...]'), e.g.
    `mixed_precision` (MegatronBridgeArguments; accelerate's key) in the training YAML.

    Cookbook: §2.3 (the training YAML; mixed_precision belongs in the Accelerate YAML, A.2).
    Code: LF hparams/parser.py _TRAIN_ARGS / _parse_train_args and get_train_args (MegatronBridgeArguments only in _TRAIN_MBRIDGE_ARGS under USE_MEGATRON_BRIDGE, EvaluationArguments only in _EVAL_ARGS); transformers-kt hf_argparser.py parse_dict ('Some keys are not used by the HfArgumentParser'); owners from catalog_data.TRAIN_KEYS.
    """
    for key in ctx.t:
        owner = cd.TRAIN_KEYS.get(key)
        if key not in NOT_PARSED_KEYS or owner not in NOT_PARSED_FOR_TRAINING:
            continue
        fix = (f"move it to accelerate.{key} (KT trains in bf16: accelerate.mixed_precision: bf16 and train.bf16: true)"
               if key in ACCELERATE_HOMES else "remove it")
        ctx.error(f"train.{key}", f"'{key}' belongs to LlamaFactory's {owner}, which only {NOT_PARSED_FOR_TRAINING[owner]} "
                  "reads; the training parser refuses it ('Some keys are not used by the HfArgumentParser: "
                  f"[{key!r}]')", fix)


@rule("lf.choices")
def lf_choices(ctx: Ctx) -> None:
    """transformers' TrainingArguments converts these arguments with an enum, spelled exactly (case included):
    `IntervalStrategy(self.eval_strategy)`, `SchedulerType(...)`, `OptimizerNames(...)`, ... (values generated into
    catalog_data.ENUM_CHOICES). A null is converted too, and refused ('None is not a valid SaveStrategy'), except
    for fsdp and debug, which take None.

    Cookbook: A.1 (lr_scheduler_type cosine, save_strategy steps).
    Code: transformers-kt training_args.py TrainingArguments.__post_init__ (enum conversions); generated by tools/gen_key_catalog.py.
    """
    for key, (enum, values) in cd.ENUM_CHOICES.items():
        if key in ctx.t and ctx.t[key] is None and key not in ("fsdp", "debug"):
            # converted unconditionally (`SaveStrategy(self.save_strategy)`); fsdp and debug take None
            ctx.error(f"train.{key}", f"{key}: null is not a valid {enum} (transformers: 'None is not a valid "
                      f"{enum}, please select one of {list(values)}')",
                      f"remove {key} (default {cd.TRAIN_DEFAULTS.get(key)!r}) or use one of {', '.join(values[:12])}")
            continue
        if key not in ctx.t or not isinstance(ctx.t[key], str):
            continue
        value = ctx.t[key]
        parts = value.split() if key in ("fsdp", "debug") else [value]
        bad = [p for p in parts if p not in values]
        if bad:
            near = [v for v in values if v.lower() == bad[0].lower().strip()] or \
                [g for g in (ctx.guess(bad[0].lower().strip(), values),) if g]
            ctx.error(f"train.{key}", f"{bad[0]!r} is not a valid {enum} (transformers takes exactly: "
                      f"{', '.join(values)})", f"did you mean {near[0]!r}?" if near else
                      f"use one of {', '.join(values[:12])}")


# enum fields whose code raises on a value none of its branches takes
RAISES_ON_OTHER_VALUES = {"flash_attn": "LlamaFactory compares the text with them exactly and raises 'Unknown "
                                        "attention type' at model load (model/model_utils/attention.py)"}


@rule("kt.train_fsdp")
def kt_train_fsdp(ctx: Ctx) -> None:
    """transformers' own `fsdp` switch (TrainingArguments.fsdp, not accelerate's config) builds an FSDP plugin for the
    Trainer with `fsdp_version` from train.fsdp_config's `version`, default 1; the KT plugin refuses FSDP1.

    Cookbook: A.2 (FSDP2 comes from the Accelerate YAML).
    Code: transformers-kt training_args.py _process_fsdp_args (fsdp_version = int(fsdp_config.get("version", 1))); accelerate-kt utils/dataclasses.py KTransformersPlugin.validate_distributed_setup.
    """
    value = ctx.t.get("fsdp")
    on = bool(value.split()) if isinstance(value, str) else bool(value)
    cfg = ctx.t.get("fsdp_config")
    version = cfg.get("version", 1) if isinstance(cfg, dict) else 1
    if ctx.use_kt and on and str(version).strip() != "2":
        ctx.error("train.fsdp", f"fsdp {value!r} makes transformers build its own FSDP plugin, version "
                  f"{version!r} (train.fsdp_config.version, default 1): the KT plugin refuses it ('KT plugin supports "
                  "FSDP2, but not FSDP1')", "remove train.fsdp: the Accelerate YAML's fsdp_config (fsdp_version: 2) "
                  "sets up FSDP2 for KT")


@rule("lf.enum_values")
def lf_enum_values(ctx: Ctx) -> None:
    """LlamaFactory's own enums (extras/constants.py StrEnums: `flash_attn: AttentionFunction`, `rope_scaling`,
    `quantization_method`, `infer_backend`): HfArgumentParser keeps the text as given, and the code compares it with
    the members, exactly; a value that is none of them falls through: `flash_attn: fa3x` ends in "Unknown attention
    type: fa3x" at model load (model/model_utils/attention.py; an error), the others are handed on as written (a
    warning: `rope_scaling: ''` is ignored when the length fits). A null where the annotation has no None is
    compared the same way.

    Cookbook: A.1 (flash_attn: auto).
    Code: LF extras/constants.py AttentionFunction/EngineName/QuantizationMethod/RopeScaling; LF model/model_utils/attention.py configure_attn_implementation; generated by tools/gen_key_catalog.py (catalog_data.LF_ENUM_FIELDS).
    """
    refused = {f.path for f in ctx.findings if f.severity == "error"}
    conditioned = {a[0] for atoms, _m, _w in cd.ARG_CONDITIONS for a in atoms}   # lf.conditions quotes the stack
    for key, (enum, values) in cd.LF_ENUM_FIELDS.items():
        if key not in ctx.t or f"train.{key}" in refused or key in conditioned:
            continue
        value = ctx.t[key]
        if value is None and "None" in cd.KEY_TYPES.get(key, ""):
            continue
        if isinstance(value, str) and value in values:
            continue
        near = [v for v in values if isinstance(value, str) and v.lower() == value.strip().lower()] or \
            [g for g in (ctx.guess(str(value).strip().lower(), values),) if g]
        fix = f"did you mean {near[0]!r}?" if near else f"use one of {', '.join(values)}"
        if key in RAISES_ON_OTHER_VALUES:
            ctx.error(f"train.{key}", f"{key} {value!r} is not one of LlamaFactory's {enum} values "
                      f"({', '.join(values)}): {RAISES_ON_OTHER_VALUES[key]}", fix)
        else:   # handed on as written: a typo, but the stack does not refuse it (rope_scaling '' is ignored)
            ctx.warn(f"train.{key}", f"{key} {value!r} is not one of LlamaFactory's {enum} values "
                     f"({', '.join(values)}); LlamaFactory compares the text with them exactly", fix)


@rule("lf.evaluation")
def lf_evaluation(ctx: Ctx) -> None:
    """LlamaFactory's get_train_args and transformers' TrainingArguments: evaluation, prediction and streaming need
    what they read (eval data, predict_with_generate, max_steps, matching save/eval strategies).

    Cookbook: — (the cookbook trains without evaluation).
    Code: LF hparams/parser.py get_train_args (eval_dataset/val_size, predict_with_generate, max_steps in streaming); LF hparams/data_args.py __post_init__ (val_size, streaming); transformers-kt training_args.py __post_init__/_validate_args (do_eval from eval_strategy, load_best_model_at_end, reduce_lr_on_plateau/greedy).
    """
    t = ctx.t
    eval_strategy = _strategy(ctx, "eval_strategy")
    save_strategy = _strategy(ctx, "save_strategy")
    evaluating = eval_strategy not in (None, "no") or any(t.get(k) is True for k in EVAL_KEYS)
    val_size = _num(_v(ctx, "val_size"))
    if evaluating and t.get("eval_dataset") is None and (val_size is None or val_size < 1e-6):
        why = next((k for k in EVAL_KEYS if t.get(k) is True), "eval_strategy")
        ctx.error(f"train.{why}", f"{why} needs evaluation data: LlamaFactory refuses 'Please make sure "
                  "eval_dataset be provided or val_size >1e-6'",
                  "name an eval_dataset, or set val_size (e.g. 0.05), or remove the evaluation settings")
    if _v(ctx, "stage") == "sft" and t.get("do_predict") is True and t.get("predict_with_generate") is not True:
        ctx.error("train.do_predict", "do_predict without predict_with_generate: LlamaFactory refuses 'Please "
                  "enable `predict_with_generate` to save model predictions'", "remove do_predict")
    streaming = t.get("streaming") is True
    if streaming and _v(ctx, "max_steps") == -1:
        ctx.error("train.streaming", "streaming needs max_steps: LlamaFactory refuses 'Please specify `max_steps` in "
                  "streaming mode' (a stream has no length to count epochs by)", "set max_steps, or remove streaming")
    if streaming and t.get("max_samples") is not None:
        ctx.error("train.max_samples", "max_samples is incompatible with streaming (LlamaFactory DataArguments)",
                  "remove max_samples or streaming")
    if streaming and val_size is not None and 1e-6 < val_size < 1:
        ctx.error("train.val_size", "streaming needs an integer val_size (LlamaFactory DataArguments)",
                  "give a number of samples, e.g. val_size: 1000")
    if val_size is not None and val_size > 1e-6:
        if t.get("eval_dataset") is not None:
            ctx.error("train.val_size", "val_size cannot be combined with eval_dataset (LlamaFactory DataArguments)",
                      "remove one of them")
        elif t.get("dataset") is None:
            ctx.error("train.val_size", "val_size needs a dataset (LlamaFactory DataArguments)", "set dataset")
    if t.get("load_best_model_at_end") is True and save_strategy != "best" and eval_strategy != save_strategy:
        ctx.error("train.load_best_model_at_end", f"load_best_model_at_end needs eval_strategy equal to save_strategy "
                  f"({eval_strategy!r} vs {save_strategy!r}) unless save_strategy is 'best' (transformers "
                  "TrainingArguments)", "remove load_best_model_at_end, or set eval_strategy like save_strategy")
    elif t.get("load_best_model_at_end") is True and save_strategy == eval_strategy == "steps":
        save, ev = _num(_v(ctx, "save_steps")), _num(t.get("eval_steps", _v(ctx, "logging_steps")))
        if save and ev and save % ev:
            ctx.error("train.save_steps", f"load_best_model_at_end needs save_steps ({save:g}) to be a multiple of "
                      f"eval_steps ({ev:g}) (transformers TrainingArguments)", "make save_steps a multiple of eval_steps")
    scheduler = _v(ctx, "lr_scheduler_type")
    if scheduler in ("reduce_lr_on_plateau", "greedy") and eval_strategy in (None, "no"):
        ctx.error("train.lr_scheduler_type", f"lr_scheduler_type {scheduler} requires an eval strategy (transformers "
                  "TrainingArguments)", "use lr_scheduler_type: cosine (cookbook A.1), or add evaluation")


@rule("lf.values")
def lf_values(ctx: Ctx) -> None:
    """The value ranges the stack enforces before training: the seed numpy takes, non-negative warmup, steps that
    are a whole number above 1 or a ratio below 1 (transformers reads 0.5 as half the run), fp16 with bf16.

    Cookbook: A.1 (warmup_ratio 0.1, save_steps 500, logging_steps 10).
    Code: transformers-kt trainer_utils.py set_seed -> numpy (seed in [0, 2**32-1]); training_args.py _validate_args (warmup_steps >= 0, warmup_ratio -> warmup_steps; logging/eval/save steps: non-zero with a steps strategy, an integer when > 1; fp16 and bf16 exclusive).
    """
    t = ctx.t
    seed = t.get("seed")
    if _is_int(seed) and not 0 <= seed <= SEED_MAX:
        ctx.error("train.seed", f"seed {seed} is outside [0, 2**32 - 1]: transformers' set_seed hands it to numpy, "
                  "which refuses it ('Seed must be between 0 and 2**32 - 1')", "use a seed such as 42")
    # warmup_ratio, when set, replaces warmup_steps (TrainingArguments.__post_init__); the result must be >= 0
    key = "warmup_ratio" if t.get("warmup_ratio") is not None else "warmup_steps"
    v = _num(t.get(key))
    if v is not None and v < 0:
        ctx.error(f"train.{key}", f"{key} {t[key]} is negative: transformers refuses it ('warmup_steps must be an "
                  "integer or a float'; warmup_ratio is read as warmup_steps)", f"use {key}: 0.1 (cookbook A.1)")
    if _strategy(ctx, "logging_strategy") == "steps" and _num(_v(ctx, "logging_steps")) == 0:
        ctx.error("train.logging_steps", "logging_steps 0 with logging_strategy steps: transformers refuses it "
                  "('requires non-zero --logging_steps')", "e.g. logging_steps: 10 (cookbook A.1)")
    if _strategy(ctx, "save_strategy") == "steps" and _num(_v(ctx, "save_steps")) == 0:
        ctx.error("train.save_steps", "save_steps 0 with save_strategy steps: transformers' callback saves only when "
                  "save_steps > 0, so the run would write no checkpoint to resume from", "e.g. save_steps: 500")
    for key, strategy in (("logging_steps", "logging_strategy"), ("eval_steps", "eval_strategy"),
                          ("save_steps", "save_strategy")):
        v = _num(t.get(key))
        if v is None or _strategy(ctx, strategy) != "steps":
            continue
        if v > 1 and v != int(v):
            ctx.error(f"train.{key}", f"{key} {t[key]} is above 1 but not a whole number: transformers refuses it "
                      f"('--{key} must be an integer if bigger than 1')", f"write {int(v)}, or a ratio below 1")
    if t.get("fp16") is True and t.get("bf16") is True:
        ctx.error("train.fp16", "fp16 and bf16 together: transformers refuses 'At most one of fp16 and bf16 can be "
                  "True'", "remove fp16 (KT trains in bf16)")
    if t.get("mask_history") is True and t.get("train_on_prompt") is True:
        ctx.error("train.mask_history", "mask_history is incompatible with train_on_prompt (LlamaFactory DataArguments)",
                  "remove one of them")


@rule("lf.methods")
def lf_methods(ctx: Ctx) -> None:
    """LlamaFactory's combinations of fine-tuning methods: LoRA with GaLore/APOLLO/BAdam, two of those at once,
    quantization or LLaMA Pro with full fine-tuning, an adapter without LoRA, and the optimizers that do
    not run distributed (every KT launch with FSDP is distributed).

    Cookbook: §2.2 (LoRA / full fine-tuning).
    Code: LF hparams/finetuning_args.py FinetuningArguments.__post_init__ (LoRA vs GaLore/APOLLO/BAdam, use_llama_pro; the LoRA-only switches are lf.conditions'); LF hparams/parser.py _verify_model_args (quantization only LoRA/OFT; adapters only LoRA) and get_train_args (layer-wise GaLore/APOLLO and BAdam under distributed training).
    """
    t = ctx.t
    ft = _v(ctx, "finetuning_type")
    on = [k for k in ("use_galore", "use_apollo", "use_badam") if t.get(k) is True]
    if ft == "lora" and on:
        ctx.error(f"train.{on[0]}", f"{on[0]} with LoRA: LlamaFactory refuses 'Cannot use LoRA with GaLore, APOLLO or "
                  "BAdam together'", f"remove {on[0]} (KT trains LoRA adapters)")
    elif len(on) > 1:
        ctx.error(f"train.{on[1]}", f"{' and '.join(on)} together: LlamaFactory refuses 'Cannot use GaLore, APOLLO or "
                  "BAdam together'", "keep one of them")
    if t.get("use_llama_pro") is True and ft == "full":
        ctx.error("train.use_llama_pro", "use_llama_pro with full fine-tuning: LlamaFactory refuses it (Freeze or "
                  "LoRA only)", "remove use_llama_pro")
    # the LoRA-only switches (use_dora, pissa_init, ...) are lf.conditions', read from the wheel
    if ft != "lora" and t.get("adapter_name_or_path") is not None:
        ctx.error("train.adapter_name_or_path", f"adapter_name_or_path with finetuning_type {ft}: LlamaFactory "
                  "refuses 'Adapter is only valid for the LoRA method'", "remove adapter_name_or_path")
    if t.get("quantization_bit") is not None and ft not in ("lora", "oft"):
        ctx.error("train.quantization_bit", f"quantization_bit with finetuning_type {ft}: LlamaFactory refuses "
                  "'Quantization is only compatible with the LoRA or OFT method'", "remove quantization_bit")
    if _distributed_launch(ctx):
        if t.get("use_badam") is True:
            ctx.error("train.use_badam", "BAdam under a distributed launch (FSDP): LlamaFactory refuses it (layer-wise "
                      "BAdam needs DeepSpeed ZeRO-3, ratio BAdam is single-process)", "remove use_badam")
        for key, switch in (("galore_layerwise", "use_galore"), ("apollo_layerwise", "use_apollo")):
            if t.get(key) is True and t.get(switch) is True:
                ctx.error(f"train.{key}", f"{key} under a distributed launch: LlamaFactory refuses it", f"remove {key}")


def _distributed_launch(ctx: Ctx) -> bool:
    """accelerate starts the trainer with torchrun (FSDP, multi-GPU, Megatron-LM): TrainingArguments is DISTRIBUTED."""
    dt = ctx.a.get("distributed_type")
    return dt in ("FSDP", "MEGATRON_LM", *MULTI_DEVICE_TYPES)


@rule("lf.packages")
def lf_packages(ctx: Ctx) -> None:
    """Switches whose package the image does not install: LlamaFactory's check_version(..., mandatory=True) refuses
    them before training (Liger kernel, Adam-mini, SwanLab, GaLore, APOLLO, BAdam, Unsloth, ...), its quantizer at
    model load (bitsandbytes/HQQ/EETQ for quantization_bit), transformers' reporting callbacks at Trainer start
    (wandb, tensorboard, mlflow, ...). Packages from catalog_data.FEATURE_PACKAGES / QUANTIZATION_PACKAGES /
    REPORT_INTEGRATIONS against the image's lock (catalog_data.LOCKED).

    Cookbook: §1.2 (the stack's packages).
    Code: LF hparams/parser.py _check_extra_dependencies; LF model/model_utils/quantization.py (check_version per quantization_method); transformers-kt training_args.py TrainingArguments.__post_init__ (report_to 'all'/'none', a single value listed) and integrations/integration_utils.py get_reporting_integration_callbacks ('X is not supported, only ... are supported.'; each callback raises 'requires X to be installed'); docker/requirements/full.lock.
    """
    t = ctx.t
    fix = ("remove it; if the feature belongs in a KT fine-tune, add the package to docker/stack.toml and rebuild the "
           "image (docker/lock.py, ktdeploy image build)")
    for key, dists in cd.FEATURE_PACKAGES.items():
        if key in t and t[key] not in (None, False, "", 0) and (missing := [d for d in dists if d not in cd.LOCKED]):
            ctx.error(f"train.{key}", f"{key} needs {', '.join(missing)}, which the image does not install "
                      "(LlamaFactory's check_version refuses the run)", fix)
    if t.get("quantization_bit") is not None:
        method = _v(ctx, "quantization_method")
        dists = cd.QUANTIZATION_PACKAGES.get(str(method).lower() if isinstance(method, str) else "", ())
        missing = [d for d in dists if d not in cd.LOCKED]
        if missing:
            ctx.error("train.quantization_bit", f"quantization_bit ({method}) needs {', '.join(missing)}, which the "
                      "image does not install (LlamaFactory's quantizer refuses it at model load)",
                      "remove quantization_bit: KT keeps the routed experts in its own CPU formats")
    report = t.get("report_to")
    names = report if isinstance(report, list) else [report] if isinstance(report, str) else []
    if report is not None and report not in ("all", "none", ["all"], ["none"]):
        _report_names(ctx, report if isinstance(report, list) else [report])
    for name in names:
        if isinstance(name, str) and name in cd.REPORT_INTEGRATIONS and name.replace("_", "-") not in cd.LOCKED:
            ctx.error("train.report_to", f"report_to {name}: the image does not install {name}, and transformers' "
                      f"callback for it raises at Trainer start ('requires {name} to be installed')",
                      "use report_to: none (the run record keeps trainer_log.jsonl and the loss plot)")


def _report_names(ctx: Ctx, names: list[Any]) -> None:
    """transformers' TrainingArguments keeps report_to 'all'/'none' (alone) as keywords and wraps any other single
    value in a list; the Trainer then refuses every entry that is not an integration name, spelled exactly
    ('X is not supported, only azure_ml, ... are supported.'): a module name, 'none' beside another entry, true."""
    for name in names:
        if not (isinstance(name, str) and name in cd.REPORT_INTEGRATIONS):
            ctx.error("train.report_to", f"report_to entry {name!r}: transformers refuses it ('{name} is not supported, "
                      f"only {', '.join(cd.REPORT_INTEGRATIONS)} are supported.')",
                      "use report_to: none (the run record keeps trainer_log.jsonl and the loss plot)")
            return


# Files LlamaFactory (and transformers) open while parsing the training arguments, before anything is loaded:
# key -> (what it is, the stack's own refusal when it is not there, where such a file belongs).
START_FILES = {
    "new_special_tokens_config": ("a YAML file", "Failed to load special tokens config from '...' (llamafactory-kt "
                                  "0.9.6.dev0 then fails on its own logger: 'Logger' object has no attribute "
                                  "'error_rank0')", "data"),
    "accelerator_config": ("a JSON file", "[Errno 2] No such file or directory", "data"),
    "adapter_name_or_path": ("a directory", "KTransformers training requires a local adapter directory.", "output"),
}


@rule("lf.start_files")
def lf_start_files(ctx: Ctx) -> None:
    """Paths the stack opens while it parses the training arguments: LlamaFactory's ModelArguments loads
    new_special_tokens_config with OmegaConf; transformers loads a text accelerator_config as a JSON file; a KT run
    resolves adapter_name_or_path (one entry of the comma-separated list, plus adapter_folder) to a local directory.
    The training container sees only the three deploy volumes (at the same paths), so a path outside them, or a
    relative one, cannot be there: refused. Inside a volume it is a fact of the GPU host: a warning here; `train`
    runs the stack's own check on the real files before training starts.

    Cookbook: — (ktdeploy: three volumes, model read-only).
    Code: LF hparams/model_args.py ModelArguments.__post_init__ (adapter_name_or_path split on ',', OmegaConf.load(new_special_tokens_config), logger.error_rank0 + raise) and KTransformersArguments._resolve_kt_adapter_artifact_dir ('KTransformers accepts a single `adapter_name_or_path`.', 'KTransformers training requires a local adapter directory.'); transformers-kt training_args.py TrainingArguments.__post_init__ (AcceleratorConfig.from_json_file for a non-dict accelerator_config) and trainer_pt_utils.py AcceleratorConfig.from_json_file; ktdeploy/core/plan/docker_argv.py volume mounts.
    """
    deploy = ctx.recipe.deploy
    for key, (what, refusal, home) in START_FILES.items():
        value = ctx.t.get(key)
        if not isinstance(value, str) or (key == "adapter_name_or_path" and not ctx.use_kt):
            continue
        paths = [p.strip() for p in value.split(",")] if key == "adapter_name_or_path" else [value]
        if len(paths) > 1:
            ctx.error(f"train.{key}", f"{key} lists {len(paths)} adapters: KT refuses it ('KTransformers accepts a "
                      "single `adapter_name_or_path`.')", "give one adapter directory")
            continue
        path = paths[0]
        if key == "adapter_name_or_path" and isinstance(ctx.t.get("adapter_folder"), str):
            path = posixpath.join(path, ctx.t["adapter_folder"])
        if deploy is None:
            continue
        v = deploy.volumes
        volumes = (v.model, v.data, v.output)
        target = getattr(v, home)
        if not path.startswith("/") or not any(inside(path, root) for root in volumes):
            ctx.error(f"train.{key}", f"{key} {value!r} is {'relative' if not path.startswith('/') else 'outside'} "
                      f"the volumes the training container mounts ({', '.join(volumes)}), so the stack cannot open "
                      f"{what} there when it parses the arguments ('{refusal}')",
                      f"put it under deploy.volumes.{home} (e.g. {target.rstrip('/')}/...) and give its absolute path"
                      + (", or write accelerator_config as a mapping in the recipe" if key == "accelerator_config"
                         else ""))
        else:
            ctx.warn(f"train.{key}", f"{key} {path} must be {what} on the GPU host when training starts (the stack "
                     f"refuses otherwise: '{refusal}')", "make sure it is there; `train` runs the stack's own check "
                     "on the real files before training")


# ---------------------------------------------------------------- accelerate launch and the KT plugin

def _fsdp_version(ctx: Ctx) -> tuple[int | None, Any]:
    """(fsdp_version as accelerate's plugin reads it, the raw value): launch exports str(value) as FSDP_VERSION and
    FullyShardedDataParallelPlugin takes int() of it; None when that int() fails."""
    raw = _launch(ctx, "fsdp_version")
    try:
        return int(str(raw)), raw
    except ValueError:
        return None, raw


@rule("accelerate.launch")
def accelerate_launch(ctx: Ctx) -> None:
    """accelerate launch's reading of the Accelerate YAML and its defaults as it applies them: distributed_type is
    a DistributedType value (exact case) and must be given; only LOCAL_MACHINE takes ClusterConfig's keys; FSDP's
    fsdp_version defaults to 1 (the KT plugin refuses FSDP1); the KT plugin takes only one process or FSDP2; the
    FSDP plugin's choices (auto wrap policy, state dict type, sharding, prefetch, reshard_after_forward).

    Cookbook: A.2 (distributed_type FSDP, fsdp_version 2).
    Code: accelerate-kt commands/config/config_args.py (process_config, ClusterConfig.__post_init__ DistributedType); commands/launch.py _validate_launch_command / launch_command (launcher choice, --fsdp_version default "1"); utils/launch.py prepare_multi_gpu_env (PrecisionType, DynamoBackend, cpu_ram_efficient_loading needs sync_module_states); utils/launch.py prepare_multi_gpu_env (each fsdp_config value exported as str(value), the switches as str(value).lower()); utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__ (str_to_bool on the switches, BackwardPrefetch[...] / 'Invalid auto wrap policy'), set_state_dict_type (StateDictType[...], 'FSDP2 does not support LOCAL_STATE_DICT') and KTransformersPlugin.validate_distributed_setup; utils/environment.py str_to_bool ('invalid truth value'); generated lists catalog_data.DISTRIBUTED_TYPES / FSDP_*.
    """
    a = ctx.a
    if "accelerate" not in ctx.recipe.raw.doc:
        return
    env = a.get("compute_environment", "LOCAL_MACHINE")
    if env != "LOCAL_MACHINE":
        ctx.error("accelerate.compute_environment", f"compute_environment {env!r}: accelerate reads this config as "
                  "another cluster's (SageMaker), whose keys differ, and refuses it", "use LOCAL_MACHINE")
    if "distributed_type" not in a:
        ctx.error("accelerate.distributed_type", "accelerate requires distributed_type ('A `distributed_type` must be "
                  "specified in the config file')", "set distributed_type: FSDP (cookbook A.2)")
        return
    dt = a["distributed_type"]
    if isinstance(dt, str) and dt not in cd.DISTRIBUTED_TYPES:
        near = [d for d in cd.DISTRIBUTED_TYPES if d.lower() == dt.lower().strip()] or \
            [g for g in (ctx.guess(dt.upper().strip(), cd.DISTRIBUTED_TYPES),) if g]
        ctx.error("accelerate.distributed_type", f"{dt!r} is not a valid DistributedType (accelerate takes exactly: "
                  f"{', '.join(cd.DISTRIBUTED_TYPES)})", f"did you mean {near[0]!r}?" if near else "use FSDP (cookbook A.2)")
        return
    if "num_processes" not in a and dt != "NO":
        # ClusterConfig's default is -1 ("for instance if we use SLURM"); launch refuses it from a config file
        ctx.error("accelerate.num_processes", "num_processes is not set: accelerate reads -1 from the config file "
                  "and refuses it ('You need to manually pass in `--num_processes` using this config yaml.')",
                  "set num_processes to the number of GPUs in deploy.gpus")
    fsdp_on = dt == "FSDP"
    if ctx.use_kt and isinstance(dt, str) and dt in (*MULTI_DEVICE_TYPES, "MEGATRON_LM", "XLA"):
        ctx.error("accelerate.distributed_type", f"distributed_type {dt}: the KT plugin refuses it ('KT plugin "
                  "supports only single-process execution or FSDP2')", "use distributed_type: FSDP with "
                  "fsdp_version: 2 (cookbook A.2)")
    if not fsdp_on:
        return
    version, raw = _fsdp_version(ctx)
    if version is None:
        ctx.error("accelerate.fsdp_config.fsdp_version", f"fsdp_version {raw!r}: accelerate exports it as text and "
                  "reads it back with int(), which refuses it", "write fsdp_version: 2")
    elif ctx.use_kt and version != 2:
        said = "fsdp_config.fsdp_version is not set and accelerate launch defaults to 1" if raw == \
            cd.LAUNCH_DEFAULTS.get("fsdp_version") and "fsdp_version" not in _mapping(a.get("fsdp_config")) else \
            f"fsdp_version {raw!r}"
        ctx.error("accelerate.fsdp_config.fsdp_version", f"{said}: the KT plugin refuses FSDP1 ('KT plugin supports "
                  "FSDP2, but not FSDP1')", "set accelerate.fsdp_config.fsdp_version: 2 (cookbook A.2)")
    _fsdp_choices(ctx, version)
    if _truthy_raw(_launch(ctx, "fsdp_cpu_ram_efficient_loading")) and \
            not _truthy_raw(_launch(ctx, "fsdp_sync_module_states")):
        ctx.error("accelerate.fsdp_config.fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading needs "
                  "fsdp_sync_module_states: accelerate launch refuses the pair", "remove fsdp_sync_module_states "
                  "(it defaults to true) or set it to true")
    mp = a.get("mixed_precision")
    if isinstance(mp, str) and mp.lower() not in cd.PRECISION_TYPES:
        ctx.error("accelerate.mixed_precision", f"unknown mixed_precision {mp!r} (accelerate takes "
                  f"{', '.join(cd.PRECISION_TYPES)})", "use mixed_precision: bf16")
    dyn = a.get("dynamo_config")
    backend = dyn.get("dynamo_backend") if isinstance(dyn, dict) else None
    if isinstance(backend, str) and backend.upper() not in cd.DYNAMO_BACKENDS:
        ctx.error("accelerate.dynamo_config.dynamo_backend", f"unknown dynamo backend {backend!r}",
                  "remove dynamo_config")


def _truthy_raw(v: Any) -> bool:
    """Python truth of the value launch passes on unconverted (the string 'false' is true)."""
    return bool(v)


# accelerate launch exports each fsdp_config value into the training process's environment as text --
# str(value) for the choices, str(value).lower() for the switches (utils/launch.py prepare_multi_gpu_env) -- and
# FullyShardedDataParallelPlugin.__post_init__ reads it back from there, whatever type the YAML gave.
FSDP_SWITCHES_ALWAYS = ("fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading")
FSDP_SWITCHES_V1 = ("fsdp_use_orig_params", "fsdp_sync_module_states", "fsdp_forward_prefetch")
STATE_DICT_NUMBERS = (1, 2, 3)        # torch StateDictType: FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT
BACKWARD_PREFETCH_NUMBERS = (1, 2)    # torch BackwardPrefetch: BACKWARD_PRE, BACKWARD_POST


def _exported(v: Any) -> str:
    """The text launch exports for a choice: str(value) (a list becomes "['X']", true becomes 'True')."""
    return str(v)


def _fsdp_choices(ctx: Ctx, version: int | None) -> None:
    """The FSDP plugin's reading of what launch exported (accelerate-kt utils/dataclasses.py
    FullyShardedDataParallelPlugin.__post_init__ and set_state_dict_type; utils/environment.py str_to_bool)."""
    fsdp = ctx.a.get("fsdp_config")
    if not isinstance(fsdp, dict):
        return
    _fsdp_policy(ctx, fsdp)
    _fsdp_state_dict(ctx, fsdp, version)
    _fsdp_prefetch(ctx, fsdp)
    _fsdp_switches(ctx, fsdp, version)
    if version == 1:
        v = fsdp.get("fsdp_sharding_strategy")
        if isinstance(v, str) and not v.isdigit() and v.upper() not in cd.FSDP_SHARDING_STRATEGY:
            ctx.error("accelerate.fsdp_config.fsdp_sharding_strategy", f"unknown fsdp_sharding_strategy {v!r}: "
                      f"accelerate's FSDP plugin takes {', '.join(cd.FSDP_SHARDING_STRATEGY)}", "use fsdp_version: 2")
        raf = fsdp.get("fsdp_reshard_after_forward")
        if isinstance(raf, str) and not raf.isdigit() and raf.upper() not in cd.FSDP_SHARDING_STRATEGY:
            ctx.error("accelerate.fsdp_config.fsdp_reshard_after_forward", f"fsdp_reshard_after_forward {raf!r}: "
                      f"FSDP1 takes a sharding strategy ({', '.join(cd.FSDP_SHARDING_STRATEGY)})", "use fsdp_version: 2")


def _fsdp_policy(ctx: Ctx, fsdp: dict[str, Any]) -> None:
    """launch exports fsdp_auto_wrap_policy (unless null) as str(value); the plugin refuses any text whose upper case
    is not a policy name ('Invalid auto wrap policy: ... Must be one of [...]'): no numbers, no lists, no booleans."""
    if fsdp.get("fsdp_auto_wrap_policy") is None:
        return
    text = _exported(fsdp["fsdp_auto_wrap_policy"])
    if text.upper() not in cd.FSDP_AUTO_WRAP_POLICY:
        ctx.error("accelerate.fsdp_config.fsdp_auto_wrap_policy", f"fsdp_auto_wrap_policy {text!r}: accelerate's "
                  f"FSDP plugin refuses it ('Invalid auto wrap policy: {text}. Must be one of "
                  f"{list(cd.FSDP_AUTO_WRAP_POLICY)}'; launch passes the value on as text)",
                  "write fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (cookbook A.2)")


def _fsdp_state_dict(ctx: Ctx, fsdp: dict[str, Any], version: int | None) -> None:
    """launch exports fsdp_state_dict_type (unless null) as str(value); set_state_dict_type takes a number as
    StateDictType(int(text)) and anything else as StateDictType[text.upper()] (KeyError for a list, true/false or an
    unknown name); FSDP2 then refuses LOCAL_STATE_DICT."""
    if fsdp.get("fsdp_state_dict_type") is None:
        return
    text = _exported(fsdp["fsdp_state_dict_type"])
    path = "accelerate.fsdp_config.fsdp_state_dict_type"
    fix = "write fsdp_state_dict_type: FULL_STATE_DICT (cookbook A.2) or SHARDED_STATE_DICT"
    if text.isdigit():
        if int(text) not in STATE_DICT_NUMBERS:
            ctx.error(path, f"fsdp_state_dict_type {text}: accelerate's FSDP plugin reads a number as "
                      f"StateDictType({int(text)}), which refuses it ('is not a valid StateDictType')", fix)
            return
        name = cd.FSDP_STATE_DICT_TYPE[int(text) - 1]
    elif text.upper() not in cd.FSDP_STATE_DICT_TYPE:
        ctx.error(path, f"fsdp_state_dict_type {text!r}: accelerate's FSDP plugin looks StateDictType[{text.upper()!r}] "
                  f"up, which refuses it (KeyError; it takes {', '.join(cd.FSDP_STATE_DICT_TYPE)})", fix)
        return
    else:
        name = text.upper()
    if version == 2 and name == "LOCAL_STATE_DICT":
        ctx.error(path, "fsdp_state_dict_type LOCAL_STATE_DICT with FSDP2: accelerate refuses it ('FSDP2 does not "
                  "support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or "
                  "`FULL_STATE_DICT`.')", fix)


def _fsdp_prefetch(ctx: Ctx, fsdp: dict[str, Any]) -> None:
    """launch exports fsdp_backward_prefetch (unless null) as str(value); the plugin turns NO_PREFETCH into None, a
    known name or a number into BackwardPrefetch, and looks anything else up as BackwardPrefetch[text.upper()]
    (KeyError) -- before FSDP2 drops the setting."""
    if fsdp.get("fsdp_backward_prefetch") is None:
        return
    text = _exported(fsdp["fsdp_backward_prefetch"])
    if text.upper() in cd.FSDP_BACKWARD_PREFETCH or (text.isdigit() and int(text) in BACKWARD_PREFETCH_NUMBERS):
        return
    why = (f"BackwardPrefetch({int(text)}), which refuses it" if text.isdigit() else
           f"BackwardPrefetch[{text.upper()!r}], which refuses it (KeyError)")
    ctx.error("accelerate.fsdp_config.fsdp_backward_prefetch", f"fsdp_backward_prefetch {text!r}: accelerate's FSDP "
              f"plugin reads it as {why}; it takes {', '.join(cd.FSDP_BACKWARD_PREFETCH)}",
              "remove fsdp_backward_prefetch (FSDP2 does not use it) or write NO_PREFETCH")


def _fsdp_switches(ctx: Ctx, fsdp: dict[str, Any], version: int | None) -> None:
    """launch exports each switch as str(value).lower() and the plugin reads it with accelerate's str_to_bool, which
    takes only y/yes/t/true/on/1 and n/no/f/false/off/0 ('invalid truth value ...'): null, '', lists and other numbers
    are refused. FSDP2 does not read use_orig_params, sync_module_states or forward_prefetch; it reads
    reshard_after_forward the same way (FSDP1 reads a sharding strategy there)."""
    keys = FSDP_SWITCHES_ALWAYS + (FSDP_SWITCHES_V1 if version == 1 else ())
    if version == 2:
        keys += ("fsdp_reshard_after_forward",)
    for key in keys:
        if key not in fsdp:
            continue
        text = str(fsdp[key]).lower()
        if text not in (*TRUE_WORDS, *FALSE_WORDS):
            ctx.error(f"accelerate.fsdp_config.{key}", f"{key} {fsdp[key]!r}: accelerate launch exports it as "
                      f"{text!r} and the FSDP plugin's str_to_bool refuses that ('invalid truth value {text}')",
                      f"write {key}: true or false")


# ---------------------------------------------------------------- kt-kernel's KTConfig, beyond the cookbook setups

@rule("kt.lora_experts_and_checkpoints")
def kt_lora_experts_and_checkpoints(ctx: Ctx) -> None:
    """kt-kernel KTConfig: GPU LoRA experts only with BF16 experts; an expert checkpoint (online conversion) not with
    pre-quantized INT8 weights.

    Cookbook: §2.4 (quantized experts: pure expert LoRA, pre-converted INT8).
    Code: kt-kernel sft/config.py KTConfig.__post_init__ (int8/fp8 blocks: 'does not support GPU LoRA experts'; 'INT8 SFT requires pre-quantized .kt weights; kt_expert_checkpoint_path is not supported').
    """
    if not ctx.use_kt:
        return
    setup = ctx.recipe.weight_setup()
    if ctx.t.get("kt_use_lora_experts") not in (None, False) and setup in ("int8", "fp8"):
        ctx.error("train.kt_use_lora_experts", f"{setup.upper()} training does not support GPU LoRA experts "
                  f"(kt-kernel: '{setup.upper()} SFT does not support GPU LoRA experts; use pure expert LoRA')",
                  "remove kt_use_lora_experts")
    if ctx.t.get("kt_expert_checkpoint_path") and setup == "int8":
        ctx.error("train.kt_expert_checkpoint_path", "INT8 training reads pre-quantized .kt weights; kt-kernel refuses "
                  "kt_expert_checkpoint_path with INT8", "remove kt_expert_checkpoint_path")
