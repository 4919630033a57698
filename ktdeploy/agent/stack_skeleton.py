"""The model skeleton (issue #49): the recipe's model built from its config.json without weights, and the stack's own
model setup run on it as far as it goes without tensors. Part of the stack judge (agent/stack_judge.py), in the image.

What a training start does after the arguments and before the first step, in its order, each step the stack's own:

1. **transformers / LlamaFactory** (``llamafactory.model.loader.load_model``): ``load_config`` (AutoConfig with the
   recipe's ``trust_remote_code``, then KT's ``prepare_kt_pretrained_config``), ``patch_config``, the model class
   LlamaFactory picks, instantiated by ``from_config`` on the meta device (no parameter is allocated: a 1T-parameter
   config costs what its module tree costs), the checkpoint's source quantizer as ``from_pretrained`` applies it
   (``get_hf_quantizer`` + ``preprocess_model``).
2. **kt-kernel** (what ``from_pretrained`` runs when KT owns the routed experts): ``claim_kt_routed_expert_subtrees``
   and ``wrap_moe_layers_with_kt_wrapper`` on that model, with the registered KT config, as a *non-owner rank*
   (``RANK=1``): every rank runs the format, dimension (FP8/RAWINT4 slices over the thread pools) and checkpoint
   checks, the expert discovery of the architecture and the fused-expert check of each MoE layer; rank 0 alone picks
   the CPU kernels and reads expert weights, which is what is left out. The MoE layers are replaced by KT's wrappers,
   so what PEFT sees next is what it sees on the GPU host.
3. **LlamaFactory + PEFT** (still ``load_model``): ``patch_model`` and ``init_adapter``: full/freeze settings, LoRA
   target resolution (``all``, names, ``null``), additional targets (``modules_to_save``), PEFT's own module matching,
   with the LoRA parameters created on the meta device too.

Where the config comes from: the model's own directory when the judge sees it (``up`` and ``train`` run the judge on
the GPU host with the volumes mounted: the real ``config.json``, its code files, its checkpoint index), else the
config text ``check --stack`` sends (``--model-config``, the model directory on the controller, or the shipped
recipes/models/<name>.json): then the checkpoint files are taken as present (doctor checks them on the host), and a
config transformers cannot build without the model's own code is a skip, not a refusal.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 512 << 10     # a config.json is a few KB; the payload limit is 1 MiB
NON_OWNER_RANK = {"RANK": "1", "WORLD_SIZE": "2"}   # kt-kernel: only rank 0 selects kernels and reads weights
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class Refused(Exception):
    """A refusal of the stack on the skeleton: (stage, the key it is about, the real exception, where)."""

    def __init__(self, stage: str, key: str, err: BaseException, where: str, choices: list[str] | None = None):
        super().__init__(str(err))
        self.stage, self.key, self.err, self.where = stage, key, err, where
        self.choices = choices or []     # what the key could name on this model (LoRA: its linear modules)


@dataclass
class Skeleton:
    """What the skeleton stage did: its verdict per step, what it left out and why, and its cost."""

    status: str = "not reached"             # accepted | refused | skipped (...) | not reached
    source: str = ""                        # where the config came from
    steps: dict[str, str] = field(default_factory=dict)
    bypassed: list[str] = field(default_factory=list)
    modules: int = 0                        # modules of the skeleton (after KT's wrapping and PEFT)
    lora_targets: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class ModelSource:
    """The config the skeleton is built from: a directory holding config.json, and whether it is the model's own."""

    directory: Path
    own: bool
    label: str


def locate(model_name_or_path: str | None, config_text: str | None, config_source: str, scratch: Path) -> ModelSource | str:
    """The model's own directory when it is here, else the sent config written to ``scratch``; a str says why none."""
    if model_name_or_path and (Path(model_name_or_path) / "config.json").is_file():
        return ModelSource(Path(model_name_or_path), True, f"{model_name_or_path}/config.json")
    if config_text is None:
        where = f"{model_name_or_path}/config.json" if model_name_or_path else "train.model_name_or_path"
        return (f"no config.json for the model ({where} is not on this machine and none was sent): LoRA targets, "
                "modules to save and kt-kernel's model checks were not run; `up` and `train` run them on the GPU "
                "host, where the model is; `check --stack --model-config PATH` runs them here")
    if len(config_text.encode()) > MAX_CONFIG_BYTES:
        return f"the sent config.json is larger than {MAX_CONFIG_BYTES} bytes: the skeleton was not built"
    directory = scratch / "model-config"
    directory.mkdir(parents=True, exist_ok=True)
    from ktdeploy.core.safeio import write_file

    write_file(directory, "config.json", config_text)
    return ModelSource(directory, False, config_source or "the sent config.json")


@contextlib.contextmanager
def _env(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load_class(config: Any) -> Any:
    """The auto class LlamaFactory's load_model picks for this config (llamafactory/model/loader.py)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
        AutoModelForTextToWaveform,
    )

    for auto in (AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForTextToWaveform):
        if type(config) in auto._model_mapping.keys():  # noqa: SIM118 - LlamaFactory's own test
            return auto
    return AutoModelForCausalLM


def build(model_args: Any, source: ModelSource, sk: Skeleton) -> tuple[Any, Any, Any]:
    """Steps 1: (config, model on the meta device, the source quantizer it applied or None). Raises
    Refused('model', ...)."""
    import torch
    from llamafactory.model import loader
    from llamafactory.model.patcher import patch_config
    from transformers.integrations.kt_artifacts import prepare_kt_pretrained_config
    from transformers.quantizers.auto import get_hf_quantizer

    model_args.model_name_or_path = str(source.directory)
    try:
        init_kwargs = loader._get_init_kwargs(model_args)
        config = loader.load_config(model_args)
        patch_config(config, None, model_args, init_kwargs, True)
        load_class = _load_class(config)
        # from_pretrained's order: KT may drop the source quantizer for what it owns, then the quantizer is made
        # from the checkpoint's config merged with LlamaFactory's (FP8: FineGrainedFP8Config(dequantize=True))
        explicit = init_kwargs.get("quantization_config")
        prepare_kt_pretrained_config(config, explicit)
        with torch.device("meta"):
            hf_quantizer, config, _device_map = get_hf_quantizer(config, explicit, None, True, {})
            model = load_class.from_config(config, trust_remote_code=model_args.trust_remote_code)
            model.config.name_or_path = str(source.directory)   # as from_pretrained sets it
            if hf_quantizer is not None:
                hf_quantizer.preprocess_model(model=model, dtype=getattr(config, "dtype", None), device_map=None,
                                              checkpoint_files=None, use_kernels=False)
    except Exception as err:  # noqa: BLE001 - the verdict is the exception itself
        raise Refused("model", "train.model_name_or_path", err,
                      "llamafactory.model.loader (load_config, patch_config, from_config on the meta device)") from err
    sk.steps["model"] = f"{type(model).__name__} ({load_class.__name__}) on the meta device"
    if hf_quantizer is not None:
        sk.steps["model"] += f", source quantizer {type(hf_quantizer).__name__}"
    return config, model, hf_quantizer


def _checkpoint_files(source: ModelSource) -> tuple[list[str] | None, dict[str, Any] | None, str]:
    """The checkpoint shards from_pretrained would hand KT (set_runtime_metadata): the model directory's own, or,
    for a sent config, a placeholder (doctor checks the files on the host)."""
    if source.own:
        from kt_kernel.sft.wrapper import _resolve_raw_safetensors_checkpoint_files

        files, meta = _resolve_raw_safetensors_checkpoint_files(str(source.directory))
        return files, meta, f"{len(files or [])} checkpoint file(s) of {source.directory}"
    return ([str(source.directory / "model.safetensors")], None,
            "the checkpoint's safetensors files are taken as present (only config.json is here; doctor checks the "
            "files on the GPU host)")


def loaded(model: Any, hf_quantizer: Any) -> None:
    """What ``postprocess_model`` does first once the weights are in (after KT wrapped the experts, which reads the
    checkpoint's quantization_config): a dequantized checkpoint (LlamaFactory's FineGrainedFP8Config(dequantize=True))
    is not quantized any more, so init_adapter's "Quantized models can only be used for the LoRA or OFT tuning"
    does not apply to it."""
    if hf_quantizer is not None and hf_quantizer.pre_quantized and \
            getattr(hf_quantizer.quantization_config, "dequantize", False):
        hf_quantizer.remove_quantization_config(model)


def kt_wrap(model: Any, source: ModelSource, sk: Skeleton, gpu_here: bool) -> None:
    """Step 2: kt-kernel's own wrapping as a non-owner rank. Raises Refused('kt-kernel', ...)."""
    from kt_kernel.sft import wrapper as kt_wrapper
    from transformers.integrations.kt import _get_kt_config, is_kt_expert_loading_enabled
    from transformers.integrations.kt_artifacts import claim_kt_routed_expert_subtrees

    if not is_kt_expert_loading_enabled():
        sk.steps["kt-kernel"] = "KT does not own the routed experts (expert loading not enabled)"
        return
    kt_config = _get_kt_config()
    files, meta, said = _checkpoint_files(source)
    sk.bypassed.append("kt-kernel ran as a non-owner rank: rank 0 alone selects the CPU kernels (doctor proves the "
                       "CPU) and reads the expert weights and the INT8 manifest (doctor's weights.converted); " + said)
    patches: list[tuple[Any, str, Any]] = []
    if not gpu_here:   # LoRA experts are built on the GPU; here on the meta device
        real = kt_wrapper.LoRAExperts

        def on_meta(*args: Any, **kwargs: Any) -> Any:
            return real(*args, **{**kwargs, "device": "meta"})

        patches.append((kt_wrapper, "LoRAExperts", on_meta))
    try:
        with _env(NON_OWNER_RANK), contextlib.ExitStack() as stack:
            for obj, name, value in patches:
                stack.enter_context(_patch(obj, name, value))
            claim_kt_routed_expert_subtrees(model)
            set_meta = getattr(kt_config, "set_runtime_metadata", None)
            if set_meta is not None:
                set_meta(kt_checkpoint_files=files, kt_sharded_metadata=meta,
                         kt_source_model_name_or_path=str(source.directory))
            model._kt_wrappers = kt_wrapper.wrap_moe_layers_with_kt_wrapper(model, kt_config)
    except Exception as err:  # noqa: BLE001
        raise Refused("kt-kernel", "", err, "kt_kernel.sft.wrap_moe_layers_with_kt_wrapper on the model skeleton") from err
    sk.steps["kt-kernel"] = f"{len(model._kt_wrappers)} MoE layer(s) wrapped"


def placeholders_to_meta(model: Any) -> list[Any]:
    """kt-kernel leaves zero-storage placeholders (stride 0 over one element, on the CPU) where the routed experts
    were; anything that copies one (LlamaFactory's fp32 cast of a full fine-tune's parameters) materialises the whole
    tensor. On the skeleton they become meta tensors of the same shape, dtype and markers; returns them, so what the
    stack did to them can be read afterwards."""
    import torch

    moved = []
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type == "meta" or param.untyped_storage().nbytes() >= \
                    param.numel() * param.element_size():
                continue
            meta = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                      requires_grad=param.requires_grad)
            for attr in ("_kt_zero_storage", "_kt_original_shape"):
                if hasattr(param, attr):
                    setattr(meta, attr, getattr(param, attr))
            module._parameters[name] = meta
            moved.append(meta)
    return moved


def cast_note(moved: list[Any]) -> str | None:
    """What the stack's own setup did to the placeholders: a dtype change means it copied them (on the GPU host, a
    real allocation of that size in every training process)."""
    import torch

    cast = [p for p in moved if p.dtype == torch.float32]
    if not cast:
        return None
    gib = sum(p.numel() * p.element_size() for p in cast) / 2**30
    return (f"LlamaFactory's setup cast {len(cast)} of kt-kernel's zero-storage expert placeholders to float32 "
            f"(init_adapter: cast_trainable_params_to_fp32): on the GPU host that copy allocates {gib:,.1f} GiB in "
            "each training process; on the skeleton they are meta tensors")


@contextlib.contextmanager
def _patch(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def adapter_key(err: BaseException, finetuning_args: Any) -> str:
    """The recipe key an adapter-setup refusal is about."""
    msg = str(err)
    ft = getattr(finetuning_args, "finetuning_type", "lora")
    if ft == "freeze":
        return "train.freeze_extra_modules" if "freeze_extra" in msg or any(
            m in msg for m in (finetuning_args.freeze_extra_modules or [])) else "train.freeze_trainable_modules"
    extra = finetuning_args.additional_target or []
    if "modules_to_save" in msg or (extra and any(f"'{m}'" in msg for m in extra)
                                    and not any(f"'{t}'" in msg for t in finetuning_args.lora_target or [])):
        return "train.additional_target"
    return "train.lora_target"


def linear_modules(model: Any, finetuning_args: Any) -> list[str]:
    """The names `lora_target: all` resolves to on this model (LlamaFactory's own find_all_linear_modules)."""
    from llamafactory.model.model_utils.misc import find_all_linear_modules

    try:
        return sorted(find_all_linear_modules(model, getattr(finetuning_args, "freeze_vision_tower", True)))[:50]
    except Exception:  # noqa: BLE001 - a hint only
        return []


def adapt(config: Any, model: Any, model_args: Any, finetuning_args: Any, sk: Skeleton) -> Any:
    """Step 3: LlamaFactory's patch_model and init_adapter (PEFT), LoRA parameters on the meta device."""
    import torch
    from llamafactory.model.adapter import init_adapter
    from llamafactory.model.patcher import patch_model

    try:
        with torch.device("meta"):
            patch_model(model, None, model_args, True, False)
            model = init_adapter(config, model, model_args, finetuning_args, True)
    except Exception as err:  # noqa: BLE001
        key = adapter_key(err, finetuning_args)
        raise Refused("llamafactory", key, err,
                      "llamafactory.model.adapter.init_adapter (PEFT get_peft_model) on the model skeleton",
                      linear_modules(model, finetuning_args) if key == "train.lora_target" else None) from err
    peft_config = getattr(model, "peft_config", {}).get("default")
    if peft_config is not None:
        sk.lora_targets = sorted(str(t) for t in (peft_config.target_modules or []))[:50]
    sk.steps["adapter"] = f"{getattr(finetuning_args, 'finetuning_type', '?')} set up" + (
        f", LoRA on {', '.join(sk.lora_targets[:12])}" if sk.lora_targets else "")
    return model


def run(model_args: Any, finetuning_args: Any, use_kt: bool, source: ModelSource, gpu_here: bool) -> Skeleton:
    """The three steps on one model; Refused for the first refusal, as the real start stops at it."""
    t0 = time.monotonic()
    sk = Skeleton(source=source.label)
    if getattr(model_args, "resize_vocab", False):
        sk.bypassed.append("resize_vocab needs the tokenizer: the embedding resize was not run on the skeleton")
        model_args.resize_vocab = False
    try:
        with _env(OFFLINE):
            config, model, hf_quantizer = build(model_args, source, sk)
            if use_kt:
                kt_wrap(model, source, sk, gpu_here)
            loaded(model, hf_quantizer)
            moved = placeholders_to_meta(model)
            model = adapt(config, model, model_args, finetuning_args, sk)
            note = cast_note(moved)
            if note:
                sk.bypassed.append(note)
        sk.modules = sum(1 for _ in model.named_modules())
        sk.status = "accepted"
    finally:
        sk.seconds = round(time.monotonic() - t0, 3)
    return sk
