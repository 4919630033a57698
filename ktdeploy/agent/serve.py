"""``ktdeploy serve``: the sglang-kt command that serves the base model plus the converted KT adapter.

The argv is built from the recipe (model, weight format, KT backend, serve section) and host facts
(physical cores / NUMA nodes for the CPU expert pool, AMX for the kernel choice); it is an argv
list, never a shell string, and binds 127.0.0.1 unless the recipe says otherwise. The API key is
read from the environment variable the recipe names, so it never lands in a recipe or a log.

A live server needs a GPU host with the full image (torch 2.9.1, CUDA 12: sglang-kt's kernels are
built for it). ``tests/integration/test_serve_args_image.py`` parses this argv with sglang-kt's
own ``ServerArgs`` parser inside that image.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ktdeploy.agent.sglang_launch import KEY_ENV_VAR
from ktdeploy.core.errors import UsageError

LAUNCHER = "ktdeploy.agent.sglang_launch"

# A merged model (`ktdeploy merge`) is BF16 whatever the training format was, and served without a LoRA: sglang-kt
# then builds kt-kernel's wrapper in inference mode and passes --kt-method as is, where BF16 is the method for plain
# BF16 experts (AMXBF16 is mapped only in sft mode, i.e. with a KT LoRA; docs/serving-merged.md).
MERGED_METHOD = "BF16"

# kt_config.kt_backend values that name one sglang-kt --kt-method directly.
_BACKEND_METHOD = {"AMXBF16": "AMXBF16", "AMXINT8": "AMXINT8", "AMXINT4": "AMXINT4", "FP8": "FP8", "BF16": "BF16",
                   "INT8": "AMXINT8"}


@dataclass
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)   # names only for secrets: values come from os.environ
    redacted: list[str] = field(default_factory=list)   # argv with the API key masked, for printing

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.redacted or self.argv)


def kt_method(weight_format: str, backend: str | None, amx: bool) -> str:
    """sglang-kt --kt-method for the recipe's expert weights (cookbook §2.1; sglang-kt kt_ep_wrapper)."""
    b = (backend or "auto").upper()
    if b != "AUTO":
        if b not in _BACKEND_METHOD:
            raise UsageError(f"kt_config.kt_backend {backend!r} has no sglang-kt serving method",
                             key="train.kt_config.kt_backend", fix=f"use one of {sorted(_BACKEND_METHOD)} or auto")
        return _BACKEND_METHOD[b]
    fmt = weight_format.lower()
    if fmt == "bf16":
        return "AMXBF16" if amx else "BF16"
    if fmt == "fp8":
        return "FP8"
    if fmt == "int8":
        return "AMXINT8"
    if fmt == "int4":
        return "AMXINT4"
    raise UsageError(f"unknown expert weight format {weight_format!r}", key="train.kt_config.kt_expert_weight_format",
                     fix="use bf16, fp8 or int8 (or kt_backend: AMXINT4)")


def build_serve_command(recipe, adapter_dir: str | os.PathLike | None, *, cpuinfer: int, threadpools: int,
                        amx: bool = True, python: str = "python3", host: str | None = None,
                        port: int | None = None, weights_dir: str | os.PathLike | None = None,
                        merged_dir: str | os.PathLike | None = None) -> ServeCommand:
    """argv of sglang-kt's server for ``recipe`` serving ``adapter_dir`` (LoRA), ``weights_dir`` (full fine-tune)
    or ``merged_dir`` (the base with the LoRA merged in by `ktdeploy merge`: a BF16 model, --kt-method BF16).

    The server starts through ``ktdeploy.agent.sglang_launch`` (sglang's own launch, in-process) so that the
    API key is read from the environment and never appears in an argv.
    A full fine-tune's output is a whole model (config, tokenizer, BF16 safetensors incl. the experts): it is
    both ``--model-path`` and ``--kt-weight-path`` (native BF16 experts are read from the model itself), no LoRA."""
    if recipe.deploy is None:
        raise UsageError("the recipe has no valid deploy: section", key="deploy", fix="run `ktdeploy check RECIPE`")
    s = recipe.deploy.serve
    train = recipe.train
    model = train.get("model_name_or_path")
    if not model:
        raise UsageError("train.model_name_or_path is not set", key="train.model_name_or_path",
                         fix="set it to the base model directory")
    if sum(x is not None for x in (adapter_dir, weights_dir, merged_dir)) != 1:
        raise UsageError("give exactly one of --adapter (LoRA run), --weights (full fine-tune) and --merged (merged "
                         "LoRA)", fix="--adapter <output_dir>-sglang for a LoRA run, --weights <output_dir> for a full "
                                      "fine-tune, --merged <output_dir>-merged for `ktdeploy merge`'s model")
    whole = weights_dir if weights_dir is not None else merged_dir
    if whole is not None:
        model = str(whole)
    if cpuinfer < 1 or threadpools < 1:
        raise UsageError(f"--kt-cpuinfer {cpuinfer} / --kt-threadpool-count {threadpools} must be >= 1",
                         fix="run on a host with CPU facts (ktdeploy doctor) or set kt_num_threads in the recipe")
    kt = recipe.kt_config
    fmt = recipe.weight_setup()
    method = MERGED_METHOD if merged_dir is not None else kt_method(fmt, kt.get("kt_backend"), amx)
    weights = model if whole is not None else (train.get("kt_weight_path") or model)
    served = s.served_model_name or Path(str(train.get("model_name_or_path"))).name
    argv = [python, "-m", LAUNCHER,
            "--model-path", str(model),
            "--served-model-name", served,
            "--host", host or s.host,
            "--port", str(port or s.port),
            "--tp-size", str(len(recipe.deploy.gpus)),
            "--kt-weight-path", str(weights),
            "--kt-method", method,
            "--kt-cpuinfer", str(cpuinfer),
            "--kt-threadpool-count", str(threadpools),
            "--kt-num-gpu-experts", "0"]
    if adapter_dir is not None:
        argv += ["--enable-lora",
                 "--lora-backend", "triton",
                 "--lora-paths", f"{s.lora_name}={Path(adapter_dir)}",
                 "--max-loras-per-batch", "1"]
    argv += ["--max-running-requests", str(s.max_running_requests)]
    if train.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    if s.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(s.mem_fraction_static)]
    redacted = list(argv)
    env = {"CUDA_VISIBLE_DEVICES": recipe.deploy.cuda_visible_devices}
    if s.api_key_env:
        key = os.environ.get(s.api_key_env)
        if not key:
            raise UsageError(f"deploy.serve.api_key_env names {s.api_key_env}, which is not set",
                             key="deploy.serve.api_key_env", fix=f"export {s.api_key_env}=<key> before serving")
        # Not in argv: the launcher reads it from the variable this names (inherited from the container's env).
        env[KEY_ENV_VAR] = s.api_key_env
    argv += list(s.extra_args)
    redacted += list(s.extra_args)
    return ServeCommand(argv=argv, env=env, redacted=redacted)
