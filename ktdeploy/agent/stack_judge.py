"""The stack's own judgement of a rendered recipe, inside the image (the half that imports the ML stack).

Reads ``{"train_yaml", "accelerate_yaml", "launch_argv", "env"}`` (``core/recipe/stack_judge_payload.payload``) on stdin and
runs, in order, what a training start runs before any weight is read:

1. **accelerate-kt** (``accelerate launch``): ``launch_command_parser`` on the rendered launch argv,
   ``_validate_launch_command`` (which reads the config with ``load_config_from_file``: unknown keys, the
   ``distributed_type`` enum), the launcher ``launch_command`` would pick, and that launcher's environment
   (``prepare_multi_gpu_env`` / ``prepare_simple_launcher_cmd_env`` / ``prepare_deepspeed_cmd_env``).
2. **LlamaFactory-KT** (``llamafactory.launcher`` -> ``run_exp``): ``read_args`` on the rendered train.yaml given as
   ``sys.argv[1]`` (OmegaConf, exactly as the launcher reads it), ``get_ray_args``, then ``get_train_args`` under the
   launcher's environment. For a KT recipe this ends in ``apply_kt_config``, which registers the KT config with
   transformers-kt (``TrainingArguments.update_kt_config``).
3. **accelerate-kt in the Trainer**: the FSDP plugin the Accelerator would build
   (``FullyShardedDataParallelPlugin(**training_args.fsdp_plugin_args)``, else from the launcher's ``FSDP_*``
   environment) and ``KTransformersPlugin(...).validate_distributed_setup`` with the distributed type the launched
   process gets (counted as the *accelerate* stage).
4. **kt-kernel**: ``KTConfig.from_object`` on the config LlamaFactory registered (what ``from_pretrained`` hands
   to ``wrap_moe_layers_with_kt_wrapper``), then that wrapper's own config checks, run for real up to and including
   the activation-policy check: the wrapper is called with a stand-in Qwen3-MoE module and stopped right after
   ``_validate_rawint4_activation_policy`` returns, before any kernel is selected or weight is read.

5. **the model skeleton** (agent/stack_skeleton.py, issue #49): the recipe's model built from its config.json on
   the meta device (no weight read, nothing allocated), kt-kernel's wrapping run on it as a non-owner rank (format,
   dimension and checkpoint checks, expert discovery), then LlamaFactory's patch_model and init_adapter with PEFT
   (LoRA targets, additional targets, freeze settings). The config is the model's own directory when the judge sees
   it (``up``, ``train``), else the config.json ``check --stack`` sends; with neither it is skipped and said so.

What needs a GPU is not run, and is said in the answer (``bypassed``):

- the launched process's distributed state (torchrun + NCCL): the distributed type is derived from the launcher
  and its environment as ``PartialState._prepare_backend`` / ``AcceleratorState.__init__`` do with a CUDA device
  present (torchrun launchers -> MULTI_GPU, then FSDP / MEGATRON_LM by ``ACCELERATE_USE_*``; deepspeed ->
  DEEPSPEED; the simple launcher -> NO), and ``TrainingArguments.parallel_mode`` reports what that process would
  (DISTRIBUTED under torchrun; NOT_DISTRIBUTED for one process seeing several GPUs; NOT_PARALLEL otherwise);
- only where no CUDA device is visible (``check --stack`` on a controller, CI): transformers'
  ``is_torch_bf16_gpu_available`` / ``is_torch_tf32_available`` and LlamaFactory's ``pure_bf16`` device check are
  told the recipe's GPU host has bf16 and TF32 (an Ampere+ GPU). On the GPU host (up's image check, ``train``) they
  run unchanged, so a GPU without bf16 is refused by transformers itself;
- the weights, the CPU kernels (rank 0's kernel selection and INT8 manifest, doctor's checks) and what the
  Trainer does after FSDP placed the model (kt_adapt_peft_lora); kt-kernel is loaded with the build this CPU runs
  (``KT_KERNEL_CPU_VARIANT`` is dropped for the judge: it judges configuration, doctor judges the CPU).

Each judgement runs in a sandbox: the process environment, ``sys.argv``, the working directory, torch's thread
count, accelerate's shared state and transformers' KT registration are restored afterwards, so many recipes can be
judged in one process (``judge`` is what bench/stack_judge_oracle.py calls).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from ktdeploy.core.recipe.stack_judge_payload import (
    EXIT_ABSENT,
    EXIT_ACCEPTED,
    EXIT_BROKEN,
    EXIT_REFUSED,
    JUDGE_SECONDS,
    MARKER,
    MAX_MESSAGE,
    MAX_PAYLOAD,
    SCHEMA,
)
from ktdeploy.core.safeio import write_file

STACK_MODULES = ("torch", "transformers", "accelerate", "llamafactory", "kt_kernel", "omegaconf", "peft")
VERSIONS = ("llamafactory-kt", "transformers-kt", "accelerate-kt", "kt-kernel", "peft-kt", "torch")
TORCHRUN_LAUNCHERS = ("multi_gpu", "fsdp", "megatron_lm")


class _ChecksPassed(Exception):
    """Raised right after kt-kernel's wrapper finished its configuration checks: nothing past them runs."""


def missing_stack() -> list[str]:
    return [m for m in STACK_MODULES if importlib.util.find_spec(m) is None]


def versions() -> dict[str, str]:
    out = {}
    for dist in VERSIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


@contextlib.contextmanager
def _sandbox(env: dict[str, str]) -> Iterator[Path]:
    """A scratch directory as cwd, ``env`` applied; everything global restored afterwards."""
    import torch

    saved_env, saved_argv, saved_cwd = dict(os.environ), list(sys.argv), os.getcwd()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="ktdeploy-judge-") as tmp:
        os.chdir(tmp)
        os.environ.update(env)
        try:
            yield Path(tmp)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            sys.argv[:] = saved_argv
            torch.set_num_threads(threads)
            _reset_stack_state()


def _reset_stack_state() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    with contextlib.suppress(ImportError):
        from transformers.integrations.kt import unset_kt_config

        unset_kt_config()


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = obj.__dict__.get(name, missing) if isinstance(obj, type) else getattr(obj, name, missing)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


def _refusal(stage: str, err: BaseException, where: str) -> dict[str, str]:
    if isinstance(err, SystemExit):   # argparse / HfArgumentParser exit on a bad argument
        msg = f"the argument parser exited ({err.code})"
        return {"stage": stage, "error_type": "SystemExit", "message": msg, "where": where}
    return {"stage": stage, "error_type": type(err).__name__, "message": str(err)[:MAX_MESSAGE], "where": where}


# ---------------------------------------------------------------- 1. accelerate launch

class Launch:
    """What ``accelerate launch`` decided: the launcher, its environment, the processes it starts."""

    def __init__(self, kind: str, env: dict[str, str], num_processes: int):
        self.kind, self.env, self.num_processes = kind, env, num_processes

    @property
    def torchrun(self) -> bool:
        return self.kind in TORCHRUN_LAUNCHERS

    def distributed_type(self) -> Any:   # accelerate.utils.DistributedType (the stack is imported lazily)
        """The distributed type of the launched process (PartialState._prepare_backend with a CUDA device, then
        AcceleratorState.__init__'s FSDP / MEGATRON_LM switches)."""
        from accelerate.utils import DistributedType

        if self.kind == "deepspeed":
            return DistributedType.DEEPSPEED
        if not self.torchrun:
            return DistributedType.NO
        if self.env.get("ACCELERATE_USE_MEGATRON_LM", "false").lower() == "true":
            return DistributedType.MEGATRON_LM
        if self.env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            return DistributedType.FSDP
        return DistributedType.MULTI_GPU


def launch_stage(argv: list[str], acc_path: Path, train_path: Path, base_env: dict[str, str]) -> Launch:
    """accelerate launch's own argument and config handling, up to the launcher's environment (nothing started)."""
    from accelerate.commands import launch as al
    from accelerate.utils import launch as lu

    args = list(argv[2:] if argv[:2] == ["accelerate", "launch"] else argv)
    args = [str(acc_path) if a == "accelerate.yaml" else str(train_path) if a == "train.yaml" else a for a in args]
    parsed = al.launch_command_parser().parse_args(args)
    parsed, _defaults, _mp = al._validate_launch_command(parsed)
    # launch_command's choice of launcher
    if parsed.use_deepspeed and not parsed.cpu:
        kind = "deepspeed"
    elif parsed.use_fsdp and not parsed.cpu:
        kind = "fsdp"
    elif parsed.use_megatron_lm and not parsed.cpu:
        kind = "megatron_lm"
    elif parsed.multi_gpu and not parsed.cpu:
        kind = "multi_gpu"
    elif parsed.tpu and not parsed.cpu:
        kind = "tpu"
    else:
        kind = "simple"
    with _environ(base_env):
        if kind in TORCHRUN_LAUNCHERS:
            env = lu.prepare_multi_gpu_env(parsed)
        elif kind == "deepspeed":
            _cmd, env = lu.prepare_deepspeed_cmd_env(parsed)
        elif kind == "tpu":
            raise ValueError("accelerate would start the TPU launcher: KT trains on CUDA GPUs")
        else:
            _cmd, env = lu.prepare_simple_launcher_cmd_env(parsed)
    n = int(parsed.num_processes) if kind in TORCHRUN_LAUNCHERS or kind == "deepspeed" else 1
    return Launch(kind, dict(env), n)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------- 2. LlamaFactory

def _parallel_mode(launch: Launch | None, env: dict[str, str]) -> Any:   # transformers' ParallelMode
    from transformers.training_args import ParallelMode

    if launch is not None and launch.torchrun:
        return ParallelMode.DISTRIBUTED
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "0").split(",") if g.strip()]
    return ParallelMode.NOT_DISTRIBUTED if len(visible) > 1 else ParallelMode.NOT_PARALLEL


class BackendRefused(Exception):
    """torch refused the recipe's ddp_backend when it started the process group (the real exception inside)."""

    def __init__(self, err: BaseException):
        super().__init__(str(err))
        self.err = err


@contextlib.contextmanager
def process_group(backend: Any, bypass_gpu: bool, notes: list[str]) -> Iterator[None]:
    """With ``ddp_backend`` set, transformers hands it to accelerate's PartialState, which in each launched process
    (torchrun) starts torch's process group with it and reads its world size. The judge starts the same
    ``init_process_group(backend=...)`` for a one-process group on the loopback: torch itself refuses a name its build
    does not know (raised as BackendRefused). Only where no CUDA device is visible, NCCL's own refusal ("only
    supported with GPUs", a GPU gate) stands for the GPU host: a gloo group is started in its place (said in
    ``notes``). Without ``ddp_backend`` nothing is started (PartialState then starts no group either)."""
    import socket

    import torch.distributed as dist

    if backend is None:
        yield
        return

    def start(name: Any) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group(backend=name, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    try:
        start(backend)
    except Exception as err:  # noqa: BLE001 - torch's verdict on the name
        if not (bypass_gpu and "only supported with GPUs" in str(err)):
            raise BackendRefused(err) from err
        notes.append(f"no CUDA device here: ddp_backend {backend!r} (NCCL) needs a GPU; torch knows it, and a gloo "
                     "process group stood in for it while the arguments were parsed")
        start("gloo")
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def llamafactory_stage(train_path: Path, launch: Launch | None, env: dict[str, str],
                       bypass_gpu: bool, notes: list[str]) -> tuple[Any, tuple[Any, ...]]:
    """run_exp's own reading (read_args on sys.argv) and get_ray_args + get_train_args (under the recipe's
    ddp_backend process group, see ``process_group``)."""
    import llamafactory.hparams.parser as lf_parser
    import transformers.training_args as ta
    from llamafactory.hparams import get_ray_args, get_train_args, read_args

    mode = _parallel_mode(launch, env)
    patches: list[tuple[Any, str, Any]] = [(ta.TrainingArguments, "parallel_mode", property(lambda self: mode))]
    if bypass_gpu:
        patches += [(ta, "is_torch_bf16_gpu_available", lambda: True), (ta, "is_torch_tf32_available", lambda: True),
                    (lf_parser, "is_torch_bf16_gpu_available", lambda: True)]
    with contextlib.ExitStack() as stack:
        for obj, name, value in patches:
            stack.enter_context(_patched(obj, name, value))
        sys.argv[:] = ["llamafactory.launcher", str(train_path)]
        args = read_args()
        get_ray_args(args)
        backend = args.get("ddp_backend") if isinstance(args, dict) else None
        with process_group(backend, bypass_gpu, notes):
            return args, get_train_args(args)


# ---------------------------------------------------------------- 3. the Trainer's Accelerator (KT plugin)

def trainer_accelerate_stage(launch: Launch, training_args: Any, bypass_gpu: bool, use_kt: bool) -> None:
    """The FSDP plugin and (use_kt) the KT plugin's distributed contract, as Trainer -> Accelerator build them."""
    import accelerate.utils.dataclasses as acc_dc
    import torch
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, KTransformersPlugin

    with contextlib.ExitStack() as stack:
        if bypass_gpu:   # sync_module_states asks for the current CUDA device (the GPU host has one)
            stack.enter_context(_patched(acc_dc, "is_cuda_available", lambda: True))
            stack.enter_context(_patched(torch.cuda, "current_device", lambda: 0))
        stack.enter_context(_environ({**os.environ, **launch.env}))
        dt = launch.distributed_type()
        plugin = None
        if training_args.fsdp_plugin_args is not None:
            plugin = FullyShardedDataParallelPlugin(**training_args.fsdp_plugin_args)
            if launch.torchrun and dt == DistributedType.MULTI_GPU:
                dt = DistributedType.FSDP   # AcceleratorState: a plugin passed in makes the run FSDP
        elif launch.env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            plugin = FullyShardedDataParallelPlugin()
        if not use_kt:
            return
        is_fsdp2 = dt == DistributedType.FSDP and plugin is not None and plugin.fsdp_version == 2
        kt = KTransformersPlugin(enabled=True, kt_config=getattr(training_args, "kt_config", None))
        kt.validate_distributed_setup(dt, is_fsdp2=is_fsdp2, num_processes=launch.num_processes)


# ---------------------------------------------------------------- 4. kt-kernel

def _stand_in_model() -> Any:   # a torch.nn.Module
    """A module whose config is a tiny Qwen3-MoE: enough for the wrapper's architecture lookup; never run."""
    import torch
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(num_hidden_layers=1, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                            num_experts=4, num_experts_per_tok=2, num_attention_heads=2, num_key_value_heads=1,
                            vocab_size=256)
    config.architectures = ["Qwen3MoeForCausalLM"]
    model = torch.nn.Module()
    model.config = config
    return model


def kt_kernel_stage() -> None:
    """KTConfig.from_object on the registered config, then the wrapper's configuration checks."""
    from kt_kernel.sft import config as kt_config_mod
    from kt_kernel.sft import wrapper
    from transformers.integrations.kt import _get_kt_config

    registered = _get_kt_config()
    if registered is None:
        raise RuntimeError("LlamaFactory registered no KT config with transformers-kt (use_kt: true)")
    kt_config_mod.KTConfig.from_object(registered)
    original = wrapper._validate_rawint4_activation_policy

    def stop_after(fmt: Any, policy: Any) -> NoReturn:
        original(fmt, policy)
        raise _ChecksPassed

    with _patched(wrapper, "_validate_rawint4_activation_policy", stop_after):
        try:
            wrapper.wrap_moe_layers_with_kt_wrapper(_stand_in_model(), registered)
        except _ChecksPassed:
            return
    raise RuntimeError("kt-kernel's wrapper returned without reaching its activation-policy check")


# ---------------------------------------------------------------- the whole judgement

def _remote_code(config_text: str | None) -> str | None:
    """For a config.json whose model_type this transformers does not know: "untrusted" when it names its own code
    (auto_map's AutoConfig: built only with trust_remote_code), "none" when it names none (nothing builds it);
    None for a known model type or a config that cannot be read."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        doc = json.loads(config_text or "")
        model_type, auto_map = doc.get("model_type"), doc.get("auto_map")
    except (ValueError, AttributeError):
        return None
    if not isinstance(model_type, str) or model_type in CONFIG_MAPPING:
        return None
    return "untrusted" if isinstance(auto_map, dict) and auto_map.get("AutoConfig") else "none"


def skeleton_stage(model_args: Any, finetuning_args: Any, use_kt: bool, model_config: dict[str, Any] | None,
                   scratch: Path, gpu_here: bool) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The model skeleton (agent/stack_skeleton.py): (its summary, its refusal if any, what it left out)."""
    from ktdeploy.agent import stack_skeleton as sks

    text = model_config.get("text") if isinstance(model_config, dict) else None
    label = str(model_config.get("source") or "") if isinstance(model_config, dict) else ""
    source = sks.locate(getattr(model_args, "model_name_or_path", None), text if isinstance(text, str) else None,
                        label, scratch)
    if isinstance(source, str):
        return {"status": "skipped", "detail": source}, [], [source]
    try:
        sk = sks.run(model_args, finetuning_args, use_kt, source, gpu_here)
    except sks.Refused as refused:
        remote = _remote_code(text) if refused.stage == "model" and not source.own else None
        if remote == "none" or remote == "untrusted" and not getattr(model_args, "trust_remote_code", False):
            # no code to build it with, or code AutoConfig does not run without trust_remote_code
            refusal_rc = _refusal(refused.stage, refused.err, refused.where)
            refusal_rc["key"] = "train.trust_remote_code" if remote == "untrusted" else "train.model_name_or_path"
            return {"status": "refused", "source": source.label}, [refusal_rc], []
        if refused.stage == "model" and not source.own:   # a sent config transformers cannot build alone
            why = (f"the model skeleton was not built from {source.label} ({type(refused.err).__name__}: "
                   f"{str(refused.err)[:300]}); on the GPU host the model's own directory (and code) decides")
            return {"status": "skipped", "source": source.label, "detail": why}, [], [why]
        refusal: dict[str, Any] = _refusal(refused.stage, refused.err, refused.where)
        if refused.key:
            refusal["key"] = refused.key
        if refused.choices:
            refusal["choices"] = refused.choices
        return {"status": "refused", "source": source.label}, [refusal], []
    summary = {"status": sk.status, "source": sk.source, "steps": sk.steps, "seconds": sk.seconds,
               "modules": sk.modules, "lora_targets": sk.lora_targets}
    return summary, [], sk.bypassed


def judge(train_yaml: str, accelerate_yaml: str, launch_argv: list[str], env: dict[str, str],
          model_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stack's verdict on one rendered recipe: {"status", "stages", "refusals", "bypassed", "skeleton", ...}."""
    import torch

    t0 = time.monotonic()
    refusals: list[dict[str, Any]] = []
    stages = {"accelerate": "not reached", "llamafactory": "not reached", "kt-kernel": "not reached",
              "model": "not reached"}
    skeleton: dict[str, Any] = {}
    bypass_gpu = not torch.cuda.is_available()
    bypassed = ["the launched process's distributed state (torchrun, NCCL): derived from accelerate's launcher "
                "and its environment as PartialState/AcceleratorState do with a CUDA device"]
    if bypass_gpu:
        bypassed.append("no CUDA device here: transformers' bf16/TF32 GPU checks, LlamaFactory's pure_bf16 check "
                        "and the FSDP plugin's current-device lookup (sync_module_states) were told the target GPU "
                        "host has an Ampere+ CUDA device")
    bypassed.append("the weights: nothing is read; the model is a skeleton on the meta device (see `model`), and "
                    "what the Trainer does once FSDP has placed it on the GPUs (kt_adapt_peft_lora, the optimizer) "
                    "is not run")
    quiet = io.StringIO()
    with _sandbox({**env, "LLAMAFACTORY_VERBOSITY": "WARN"}) as tmp, \
            contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        os.environ.pop("KT_KERNEL_CPU_VARIANT", None)
        acc_path = write_file(tmp, "accelerate.yaml", accelerate_yaml)
        train_path = write_file(tmp, "train.yaml", train_yaml)
        base_env = dict(os.environ)
        launch = None
        try:
            launch = launch_stage(launch_argv, acc_path, train_path, base_env)
            stages["accelerate"] = "accepted"
        except (Exception, SystemExit) as err:  # noqa: BLE001 - the verdict is the exception itself
            refusals.append(_refusal("accelerate", err, "accelerate.commands.launch"))
            stages["accelerate"] = "refused"
        lf_env = {**base_env, **(launch.env if launch is not None else {})}
        training_args = None
        use_kt = False
        model_args = finetuning_args = None
        try:
            with _environ(lf_env):
                args, (model_args, _d, training_args, finetuning_args, _g) = llamafactory_stage(
                    train_path, launch, lf_env, bypass_gpu, bypassed)
            use_kt = isinstance(args, dict) and args.get("use_kt") is True
            stages["llamafactory"] = "accepted"
        except BackendRefused as refused:
            refusals.append({**_refusal("llamafactory", refused.err, "torch.distributed.init_process_group with "
                                        "ddp_backend (transformers -> accelerate PartialState, in each launched "
                                        "process)"), "key": "train.ddp_backend"})
            stages["llamafactory"] = "refused"
        except (Exception, SystemExit) as err:  # noqa: BLE001
            refusals.append(_refusal("llamafactory", err, "llamafactory.hparams.get_train_args"))
            stages["llamafactory"] = "refused"
        if training_args is not None and not use_kt:
            stages["kt-kernel"] = "skipped (use_kt is not true)"
        if training_args is not None and launch is not None:
            try:
                trainer_accelerate_stage(launch, training_args, bypass_gpu, use_kt)
            except (Exception, SystemExit) as err:  # noqa: BLE001
                refusals.append(_refusal("accelerate", err, "accelerate.utils.KTransformersPlugin"))
                stages["accelerate"] = "refused"
        if training_args is not None and use_kt:
            try:
                with _environ(lf_env):
                    kt_kernel_stage()
                stages["kt-kernel"] = "accepted"
            except (Exception, SystemExit) as err:  # noqa: BLE001
                refusals.append(_refusal("kt-kernel", err, "kt_kernel.sft (KTConfig, wrap_moe_layers_with_kt_wrapper)"))
                stages["kt-kernel"] = "refused"
        if training_args is not None and not refusals:   # the real start stops at the first refusal before this
            with _environ(lf_env):
                skeleton, found, left_out = skeleton_stage(model_args, finetuning_args, use_kt, model_config, tmp,
                                                           not bypass_gpu)
            refusals += found
            bypassed += left_out
            stages["model"] = {"skipped": "skipped (see bypassed)"}.get(skeleton["status"], skeleton["status"])
            if found and found[0]["stage"] != "model":
                stages[found[0]["stage"]] = "refused (model skeleton)"
    return {"schema": SCHEMA, "status": "refused" if refusals else "accepted", "stages": stages,
            "refusals": refusals, "bypassed": bypassed, "versions": versions(), "skeleton": skeleton,
            "seconds": round(time.monotonic() - t0, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _answer(data: dict[str, Any], code: int) -> int:
    sys.stdout.write(MARKER + json.dumps(data) + "\n")
    sys.stdout.flush()
    return code


def _read_payload(argv: list[str]) -> dict[str, Any]:
    source = argv[0] if argv else "-"
    raw = sys.stdin.buffer.read(MAX_PAYLOAD + 1) if source == "-" else Path(source).read_bytes()[:MAX_PAYLOAD + 1]
    if len(raw) > MAX_PAYLOAD:
        raise ValueError(f"the payload is larger than {MAX_PAYLOAD} bytes")
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("train_yaml"), str) \
            or not isinstance(data.get("accelerate_yaml"), str):
        raise ValueError("the payload has no train_yaml/accelerate_yaml")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python3 -c BOOTSTRAP [-|FILE]``: one judgement, one marker line, exit 0/2/7/1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    missing = missing_stack()
    if missing:
        return _answer({"schema": SCHEMA, "status": "absent", "missing": missing,
                        "detail": "this Python has no " + ", ".join(missing) + " (a reduced or test image?)"},
                       EXIT_ABSENT)

    def _timeout(signum: int, frame: FrameType | None) -> NoReturn:
        raise TimeoutError(f"the stack judge took longer than {JUDGE_SECONDS} s")

    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(JUDGE_SECONDS)
    try:
        data = _read_payload(argv)
        env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
        argv_launch = [str(a) for a in (data.get("launch_argv") or [])]
        model_config = data.get("model_config") if isinstance(data.get("model_config"), dict) else None
        verdict = judge(data["train_yaml"], data["accelerate_yaml"], argv_launch, env, model_config)
    except (Exception, TimeoutError) as err:  # noqa: BLE001 - any failure of the judge itself is reported as such
        return _answer({"schema": SCHEMA, "status": "broken", "detail": f"{type(err).__name__}: {err}"[:600]},
                       EXIT_BROKEN)
    finally:
        signal.alarm(0)
    return _answer(verdict, EXIT_REFUSED if verdict["refusals"] else EXIT_ACCEPTED)


if __name__ == "__main__":
    sys.exit(main())
