"""Rules on what a recipe from someone else could make ktdeploy do, and on values that pass the other rules but
fail hours later (issue 35). Kept apart from rules.py (other rules are added there concurrently); registered on
rules.py's RULES, after the serving rules.

- ``serve.api_key_env``: the variable whose value ``up`` uploads to the host must be one the operator made for
  this: ``KTDEPLOY_`` then a name holding ``KEY`` (``KTDEPLOY_API_KEY``). A recipe naming AWS_SECRET_ACCESS_KEY
  or OPENAI_API_KEY would otherwise move the operator's secret to a host of the recipe author's choosing.
- ``serve.flag_values``: a value ktdeploy puts on sglang's command line never reads as an option: serve.host,
  served_model_name (and the model folder's name it defaults to), lora_name; extra_args may hold long options
  (``--name``) and values, never a one-dash option (``-api-key`` slips past a check of ``--`` spellings).
- ``deploy.volume_overlap``: no volume is ``/`` and the data volume neither equals nor nests with the model or
  output volume (docker refuses a duplicate mount point at TRAIN; ``/`` would mount the whole host).
- ``format.fp8_model``: kt_backend FP8 (or kt_expert_weight_format fp8) reads the routed experts as FP8; a model
  whose config.json stores them in BF16 fails at load. Judged where the model's config.json is known (its folder
  here, or recipes/models/<name>.json); on the host doctor's ``weights.format`` reads the real one.
- ``format.fp8_tp_slices``: FP8 experts split over kt_threadpool_count pools (kt_tp_enabled) need slices of the
  routed intermediate size that are multiples of 128 (kt-kernel's wrapper refuses others); judged the same way.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.rules_base import Ctx, RuleSet
from ktdeploy.core.safeio import inside, norm_path

if TYPE_CHECKING:
    from ktdeploy.core.sizing.model_config import MoEArchitecture

rule = RuleSet()

API_KEY_ENV = re.compile(r"^KTDEPLOY_[A-Z0-9_]*KEY[A-Z0-9_]*$")
HOST = re.compile(r"^(?!-)[A-Za-z0-9._:\[\]%-]{1,253}$")     # a name, an IPv4 or an (bracketed or bare) IPv6
NUMBER = re.compile(r"^-\d+(\.\d+)?$")


def flag_shaped(value: str) -> bool:
    """A value argparse would read as an option (``-x``, ``--x``), not a negative number."""
    return value.startswith("-") and not NUMBER.match(value)


@rule("serve.api_key_env")
def api_key_env(ctx: Ctx) -> None:
    """The variable up uploads to the host is one the operator made for it: KTDEPLOY_ and a name holding KEY.

    Cookbook: — (ktdeploy's promise, docs/security.md: a recipe from someone else never moves the operator's secrets).
    Code: ktdeploy/core/plan/host_plan.py serve.key (PUT_SECRET uploads the variable's value); ktdeploy/agent/serve.py.
    """
    d = ctx.recipe.deploy
    name = d.serve.api_key_env if d is not None else None
    if name and not API_KEY_ENV.match(name):
        ctx.error("deploy.serve.api_key_env",
                  f"{name!r} may name any variable of the operator's shell; ktdeploy uploads its value to the host, "
                  "so it takes only a variable made for this: KTDEPLOY_ and a name holding KEY",
                  "export KTDEPLOY_API_KEY=<the server's key> and set deploy.serve.api_key_env: KTDEPLOY_API_KEY")


@rule("serve.flag_values")
def serve_flag_values(ctx: Ctx) -> None:
    """No value ktdeploy puts on sglang's command line reads as an option; extra_args hold long options only.

    Cookbook: — (ktdeploy: every value is one argv item, never an option of its own).
    Code: ktdeploy/agent/serve.py build_serve_command (--host, --served-model-name, --lora-paths, extra_args); Python argparse.
    """
    d = ctx.recipe.deploy
    if d is None:
        return
    s = d.serve
    if not HOST.match(s.host):
        ctx.error("deploy.serve.host", f"{s.host!r} is not an address (a host name or IP address, not an option)",
                  "e.g. 127.0.0.1 (this host only) or 0.0.0.0 (every interface, deliberately)")
    model = ctx.t.get("model_name_or_path")
    served = s.served_model_name
    if served is not None and (not served.strip() or flag_shaped(served) or "\n" in served):
        ctx.error("deploy.serve.served_model_name", f"{served!r} would read as an option on sglang's command line",
                  "a name that does not start with '-', e.g. the model folder's name")
    elif served is None and isinstance(model, str) and flag_shaped(PurePosixPath(model.rstrip("/")).name):
        ctx.error("train.model_name_or_path", f"the model folder's name {PurePosixPath(model).name!r} is the default "
                  "served model name and would read as an option on sglang's command line",
                  "set deploy.serve.served_model_name, or rename the folder")
    if flag_shaped(s.lora_name):
        ctx.error("deploy.serve.lora_name", f"{s.lora_name!r} would read as an option on sglang's command line",
                  "a name that does not start with '-', e.g. adapter")
    for i, arg in enumerate(s.extra_args):
        if arg.startswith("-") and not arg.startswith("--") and not NUMBER.match(arg):
            ctx.error(f"deploy.serve.extra_args[{i}]", f"{arg.split('=', 1)[0]!r} is a one-dash option; ktdeploy "
                      "passes only long options (--name) and their values to sglang",
                      "write the long option (e.g. --tp-size 2)")


@rule("deploy.volume_overlap")
def volume_overlap(ctx: Ctx) -> None:
    """The data volume is not / and neither equals nor nests with the model or output volume.

    Cookbook: — (ktdeploy: three volumes, model read-only).
    Code: ktdeploy/core/plan/docker_argv.py volume mounts; docker's "Duplicate mount point" refusal at create.
    """
    d = ctx.recipe.deploy
    if d is None:
        return
    v = d.volumes
    for key in ("model", "data", "output"):
        if norm_path(getattr(v, key)) == "/":
            ctx.error(f"deploy.volumes.{key}", "a volume of / mounts the whole host into the training container",
                      f"give the folder that holds the {key}, e.g. /srv/ktdeploy/{key}")
    for other in ("model", "output"):
        a, b = norm_path(v.data), norm_path(getattr(v, other))
        if a == "/" or b == "/":
            continue
        if a == b:
            ctx.error("deploy.volumes.data", f"the data volume is the {other} volume ({b}): docker refuses a "
                      "duplicate mount point when training starts", f"give the data its own folder, apart from {b}")
        elif inside(a, b) or inside(b, a):
            why = ("the trainer's outputs and the dataset would mix" if other == "output" else
                   "a writable mount would sit inside (or around) the read-only model volume")
            ctx.error("deploy.volumes.data", f"the data volume ({a}) and the {other} volume ({b}) lie one inside the "
                      f"other: {why}", "keep the three volumes in separate folders")


@rule("lf.llama_pro_layers")
def llama_pro_layers(ctx: Ctx) -> None:
    """LLaMA Pro (`use_llama_pro`) trains every k-th block: LlamaFactory needs the model's layer count divisible by
    `freeze_trainable_layers` (default 2) and refuses it at model setup otherwise, after the weights are read.
    Judged where the model's config.json is known (the planner's: the model folder, or recipes/models/NAME.json).

    Cookbook: — (not a cookbook setup).
    Code: LF model/adapter.py _setup_freeze_tuning and model/model_utils/misc.py find_expanded_modules ("`num_layers` N should be divisible by `num_layer_trainable` K").
    """
    if not ctx.t.get("use_llama_pro") or ctx.t.get("finetuning_type", "lora") not in ("lora", "freeze"):
        return
    k = ctx.t.get("freeze_trainable_layers", 2)
    arch = model_arch(ctx.t)
    if arch is None or not isinstance(k, int) or isinstance(k, bool) or k <= 0 or arch.num_layers % k == 0:
        return
    ctx.error("train.freeze_trainable_layers" if "freeze_trainable_layers" in ctx.t else "train.use_llama_pro",
              f"use_llama_pro: {ctx.t.get('model_name_or_path')} has {arch.num_layers} layers, not divisible by "
              f"freeze_trainable_layers {k}: LlamaFactory refuses it at model setup ('`num_layers` {arch.num_layers} "
              f"should be divisible by `num_layer_trainable` {k}')",
              f"set freeze_trainable_layers to a divisor of {arch.num_layers}, or remove use_llama_pro")


@rule("format.fp8_model")
def fp8_model(ctx: Ctx) -> None:
    """An FP8 expert setup needs a model that stores its experts as FP8 (by the config.json the planner resolves).

    Cookbook: §2.4, A.3.1 (native FP8: DeepSeek-V3-style checkpoints).
    Code: kt-kernel 0.7.2 kt_kernel/sft/config.py (format follows kt_backend); ktdeploy/core/recipe/expert_format.py; ktdeploy/core/sizing/model_config.py native_format.
    """
    if not ctx.use_kt or expert_setup(ctx.k) != "fp8" or ctx.t.get("kt_weight_path"):
        return
    native = model_native_format(ctx.t)
    if native is None or native == "fp8":
        return
    how = ("kt_expert_weight_format: fp8" if ctx.k.get("kt_expert_weight_format") is not None
           else f"kt_backend {ctx.k.get('kt_backend')} with no kt_expert_weight_format")
    ctx.error("train.kt_config.kt_backend" if ctx.k.get("kt_expert_weight_format") is None
              else "train.kt_config.kt_expert_weight_format",
              f"{how} reads the routed experts as FP8, but {ctx.t.get('model_name_or_path')} stores them as "
              f"{native.upper()} (its config.json has no FP8 quantization_config): loading fails when training starts",
              "for a BF16 model use kt_backend: AMXBF16 (or auto); FP8 training needs the model's native FP8 "
              "checkpoint")


FP8_BLOCK = 128   # kt-kernel's FP8 kernels work on 128-wide blocks of the routed experts' weights


@rule("format.fp8_tp_slices")
def fp8_tp_slices(ctx: Ctx) -> None:
    """FP8 experts are split over the thread pools along the routed intermediate dimension (one slice per pool when
    kt_tp_enabled), and kt-kernel's FP8 kernels need every slice a multiple of 128: it refuses the wrap otherwise
    ('FP8 SFT requires each TP intermediate slice divisible by 128; intermediate_size=..., threadpool_count=...').
    Judged where the model's config.json is known (moe_intermediate_size, hidden_size), as format.fp8_model.

    Cookbook: §2.4.1 (native FP8), A.3.1.
    Code: kt-kernel 0.7.2 kt_kernel/sft/wrapper.py wrap_moe_layers_with_kt_wrapper (threadpool_count = kt_threadpool_count if kt_tp_enabled else 1; 'FP8 SFT requires hidden and routed intermediate dimensions divisible by 128'; 'FP8 SFT requires each TP intermediate slice divisible by 128').
    """
    if not ctx.use_kt or expert_setup(ctx.k) != "fp8":
        return
    pools = ctx.k.get("kt_threadpool_count")
    if ctx.k.get("kt_tp_enabled") is not True or not isinstance(pools, int) or isinstance(pools, bool) or pools < 1:
        return   # one pool, or a count kt.values already refuses
    arch = model_arch(ctx.t)
    if arch is None:
        return
    inter, hidden = arch.moe_intermediate_size, arch.hidden_size
    if inter % FP8_BLOCK or hidden % FP8_BLOCK:
        ctx.error("train.model_name_or_path", f"FP8 experts need hidden_size ({hidden}) and moe_intermediate_size "
                  f"({inter}) divisible by 128: kt-kernel refuses the model ('FP8 SFT requires hidden and routed "
                  "intermediate dimensions divisible by 128')", "train this model in BF16 (kt_backend: AMXBF16)")
    elif inter % pools or (inter // pools) % FP8_BLOCK:
        fits = [n for n in range(1, min(inter // FP8_BLOCK, 64) + 1) if inter % n == 0 and (inter // n) % FP8_BLOCK == 0]
        ctx.error("train.kt_config.kt_threadpool_count", f"kt_threadpool_count {pools} with kt_tp_enabled splits the "
                  f"FP8 experts' intermediate size {inter} into slices that are not multiples of 128: kt-kernel refuses "
                  f"it ('FP8 SFT requires each TP intermediate slice divisible by 128; intermediate_size={inter}, "
                  f"threadpool_count={pools}')", f"use one pool per NUMA node among {', '.join(map(str, fits))}")


def model_arch(train: dict[str, Any]) -> MoEArchitecture | None:
    """The recipe's model architecture by the config.json the planner would use, or None when none is known here."""
    try:
        from ktdeploy.core.sizing.model_config import resolve_model_config

        arch, _where = resolve_model_config(train)
    except Exception:  # noqa: BLE001 - no config here, or one the planner cannot read: the planner rules say so
        return None
    return arch


def model_native_format(train: dict[str, Any]) -> str | None:
    """How the recipe's model stores its routed experts (bf16 | fp8 | int4) by the config.json the planner would
    use, or None when none is known here (the host's doctor then reads the real one)."""
    arch = model_arch(train)
    return None if arch is None else arch.native_format
