"""The real stack's start-up validation of rendered recipes, run in ONE process inside the full image.

    docker run --rm --user 0 -v "$PWD":/src -w /src -e PYTHONPATH=/src --entrypoint python3 ktsft:amx \
        -m tests.oracle.stack_judge CASES_DIR OUT.json [PER_CASE_SECONDS]

CASES_DIR/manifest.json lists the cases (written by harness.py): for each, the rendered ``train.yaml`` and
``accelerate.yaml`` (what ``ktdeploy up`` launches), the environment launch.sh exports (CUDA_VISIBLE_DEVICES), and the model's
config.json stand-in (recipes/models/*.json). The cases run in ORACLE_JUDGE_WORKERS processes forked after the
imports (default: one per CPU). Each case goes through what a training start runs, in its order:

1. ``accelerate_launch`` - ``accelerate launch --main_process_port 0 --config_file accelerate.yaml -m
   llamafactory.launcher train.yaml``: accelerate's own argument parser and ``_validate_launch_command`` (which loads
   the config file), the launcher ``launch_command`` would pick and its environment (``prepare_multi_gpu_env`` /
   ``prepare_simple_launcher_cmd_env`` / the DeepSpeed, TPU and SageMaker launchers' first checks), and for torchrun
   ``torch.distributed.run.config_from_args`` on the arguments accelerate filters for it. Nothing is spawned.
2. ``llamafactory_args`` - in the rank-0 training process's environment (the launcher's, torchrun's LOCAL_RANK,
   RANK and WORLD_SIZE included): ``llamafactory.train.tuner.run_exp()`` with ``sys.argv = [launcher,
   train.yaml]``: LlamaFactory's ``read_args`` (OmegaConf), ``get_ray_args``, ``get_train_args`` (HfArgumentParser
   over ModelArguments, DataArguments, transformers-kt's TrainingArguments, FinetuningArguments,
   GeneratingArguments, every check of get_train_args and the KT config it registers through ``apply_kt_config`` /
   ``update_kt_config``).
3. ``torch_distributed`` - inside TrainingArguments' device setup (step 2): accelerate's ``PartialState`` picks the
   backend from ``ddp_backend`` on a CUDA host and calls ``torch.distributed.init_process_group``; there torch's own
   ``Backend``/``BackendConfig`` parsing and the availability branch of ``_new_process_group_helper`` run against the
   backends this torch registers; the rendezvous (no peers here) is a fake process group of the world size.
4. ``llamafactory_workflow`` - the real ``run_sft`` up to the Trainer: tokenizer, template and dataset loading are
   stand-ins (no files), ``load_config`` reads the model's config.json stand-in (recipes/models/*.json),
   ``validate_kt_deepseek_v4_training`` and the KT metric checks run for real; the Trainer stand-in instantiates
   the ``report_to`` callbacks as ``Trainer.__init__`` does, then stops. Stages other than sft stop at their
   workflow's entry.
5. ``kt_kernel`` and 6. ``model_setup`` - LlamaFactory's real ``load_model`` (model_setup.py): ``from_pretrained``
   is the model built on the meta device from the config.json (the model class, the source quantizer, KT's config
   hooks), then kt-kernel's ``wrap_moe_layers_with_kt_wrapper`` over every layer (``kt_kernel``: KTConfig, every
   wrapper check, the architecture's expert layout, each layer's ``KTMoEWrapper`` with its dimension checks over
   the thread pools), then patch_model and ``init_adapter`` (``model_setup``: LoRA target resolution, peft's
   ``get_peft_model``, modules_to_save, DoRA/rsLoRA, full/freeze setup). Identical inputs to load_model give the
   outcome of the first such case (memoised: the same config.json, arguments, KT config and environment).
7. ``kt_plugin`` - what ``Accelerator.prepare`` checks: the FSDP plugin (from the training arguments' fsdp args or
   from the launcher's FSDP_* environment, as ``Accelerator.__init__`` builds it), the distributed type
   AcceleratorState derives on a CUDA host, and the real ``KTransformersPlugin.validate_distributed_setup``.

Bypassed, because this machine has no GPU, no AMX and no weights (each bypass is a hardware or file gate that would
refuse every case here, never a configuration rule): transformers' and LlamaFactory's bf16-GPU checks and the TF32
check (told a bf16/TF32-capable GPU is present); a CUDA host inside PartialState (one GPU per local process) and for
the source quantizer (compute capability 9.0); the FSDP plugin's ``torch.cuda.current_device`` (device 0); the
rendezvous (a fake process group); kt-kernel's INT8/FP8/RAWINT4/MXFP4 kernel selection and its SFT classes (those its
AMX build exports, read from that build's shared object: the target CPU has AMX); kt-kernel's CPU thread pool;
weight folders are taken to hold safetensors shards and every expert weight read (shards, ``.kt`` trees, the INT8
manifest, the ephemeral store, the C++ kernel's loading) is a no-op; LoRA experts are made on meta, not ``cuda``;
every tensor of the model setup is on the meta device (large ones never on the host). Not run: weight and dataset
loading, the Trainer's own init beyond its report_to callbacks (so kt-kernel's ``kt_adapt_peft_lora``, which the
Trainer calls), the C++ kernels. A model whose code comes with the checkpoint (trust_remote_code: Kimi's) is not
built: its model setup is skipped and the case marked partial.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STAGES = ("accelerate_launch", "llamafactory_args", "torch_distributed", "llamafactory_workflow", "kt_kernel",
          "model_setup", "kt_plugin")
# kt-kernel's SFT method -> the class its extension exports (kt_kernel/sft/amx.py's _SFT_METHOD_TO_CLASS)
AMX_CLASSES = {"AMXBF16_SFT": "AMXBF16_SFT_MOE", "AMXFP8_SFT": "AMXFP8_SFT_MOE", "MXFP4_SFT": "MXFP4_SFT_MOE",
               "INT8_SFT": "AMXInt8_SFT_MOE", "AMXINT8_SFT": "AMXInt8_SFT_MOE", "AMXINT4_SFT": "AMXInt4_SFT_MOE",
               "RAWINT4_SFT": "AMXInt4_KGroup_SFT_MOE", "AMXINT4_KGroup_SFT": "AMXInt4_KGroup_SFT_MOE",
               "AMXBF16_SFT_SkipLoRA": "AMXBF16_SFT_MOE_SkipLoRA", "AMXINT8_SFT_SkipLoRA": "AMXInt8_SFT_MOE_SkipLoRA",
               "AMXINT4_SFT_SkipLoRA": "AMXInt4_SFT_MOE_SkipLoRA"}


def model_setup_unbuildable() -> type[Exception]:
    from tests.oracle.model_setup import Unbuildable

    return Unbuildable


class _Stop(BaseException):
    """Raised by a stand-in where the real start would go on to load weights or train: the stage passed."""


class _Timeout(BaseException):
    pass


def _msg(exc: BaseException) -> str:
    text = str(exc) if str(exc) else repr(exc)
    return text.replace("\n", " ")[:600]


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(tb):
        if "/site-packages/" in frame.filename:
            return f"{frame.filename.split('/site-packages/')[1]}:{frame.lineno}"
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"


class _Tokenizer:
    additional_special_tokens_ids: list[int] = []
    eos_token_id = 1
    pad_token_id = 0
    init_kwargs: dict = {}

    def __len__(self) -> int:
        return 0

    def convert_tokens_to_ids(self, tokens):
        return [0 for _ in tokens]


class Judge:
    def __init__(self, per_case_seconds: float = 30.0) -> None:
        import torch

        self.per_case = per_case_seconds
        self.torch = torch
        self._model_configs: dict[str, Any] = {}
        self.setups: dict[str, dict] = {}
        from torch.distributed import distributed_c10d as c10d

        self._plugins_before = frozenset(c10d.Backend._plugins)  # before the judge registers its fake backend
        from torch.testing._internal.distributed.fake_pg import FakeStore

        self._FakeStore = FakeStore
        self._install_gates()
        self._amx_build()

    # -------------------------------------------------------------- bypassed gates (hardware / files only)

    def _install_gates(self) -> None:
        import accelerate.utils.dataclasses as acc_dc
        import kt_kernel.sft.wrapper as ktw
        import llamafactory.hparams.parser as lf_parser
        import transformers.training_args as tr_args

        tr_args.is_torch_bf16_gpu_available = lambda *a, **k: True
        tr_args.is_torch_tf32_available = lambda *a, **k: True
        tr_args.enable_tf32 = lambda *a, **k: None
        lf_parser.is_torch_bf16_gpu_available = lambda *a, **k: True
        acc_dc.is_cuda_available = lambda *a, **k: True
        self.torch.cuda.current_device = lambda: 0

        runtime = SimpleNamespace(cpu_variant="amx", kernel="(selection bypassed)", weight_layout="(bypassed)")
        for name in ("get_int8_runtime", "get_fp8_runtime", "get_rawint4_runtime", "get_mxfp4_runtime"):
            if hasattr(ktw, name):
                setattr(ktw, name, lambda *a, **k: runtime)

        def shards(path=None, *a, model_name_or_path=None, **k):
            root = str(model_name_or_path or path or "/model")
            return ([f"{root}/model-00001-of-00002.safetensors", f"{root}/model-00002-of-00002.safetensors"],
                    {"weight_map": {}})

        ktw._resolve_checkpoint_files = shards
        ktw._resolve_raw_safetensors_checkpoint_files = shards


    def _amx_build(self) -> None:
        """The target CPU has AMX: kt-kernel's SFT classes are those its AMX build exports (read from that build's
        shared object), whatever variant this CPU loaded."""
        import glob

        import kt_kernel.sft.amx as amx

        exported: set[str] = set()
        for path in glob.glob(os.path.join(os.path.dirname(amx.__file__), "..", "_kt_kernel_ext_amx*.so")):
            data = Path(path).read_bytes()
            exported |= {n for n in set(AMX_CLASSES.values()) if f"\0{n}\0".encode() in data}
        placeholders = {n: type(n, (), {}) for n in exported}
        if not amx._HAS_AMX_SFT_SUPPORT or any(v is None for v in amx._SFT_METHOD_TO_CLASS.values()):
            amx._HAS_AMX_SFT_SUPPORT = True
            for method, cls_name in AMX_CLASSES.items():
                if amx._SFT_METHOD_TO_CLASS.get(method) is None and cls_name in placeholders:
                    amx._SFT_METHOD_TO_CLASS[method] = placeholders[cls_name]

    @contextlib.contextmanager
    def process_group(self, state: dict):
        """The rank-0 training process under torchrun: accelerate's PartialState sees a CUDA host (one GPU per
        local process) and its ``torch.distributed.init_process_group`` call gets torch's own backend checks
        (``Backend``, ``BackendConfig``, the availability branch of ``_new_process_group_helper`` against the
        backends registered before the judge's own) and then, for the rendezvous (a gate: no peers here), a fake
        process group of the launcher's world size at rank 0."""
        import accelerate.state as acc_state
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        torch = self.torch
        real_init = dist.init_process_group
        real_partial_init = acc_state.PartialState.__init__
        plugins = self._plugins_before

        def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                               group_name="", pg_options=None, device_id=None):
            before, state["stage"] = state["stage"], "torch_distributed"
            b = c10d.Backend(backend if backend is not None else "undefined")
            if timeout is not None:
                c10d._check_valid_timeout(timeout)
            for _device, name in c10d.BackendConfig(b).get_device_backend_map().items():
                if name == c10d.Backend.MPI and not c10d.is_mpi_available():
                    raise RuntimeError("Distributed package doesn't have MPI built in. MPI is only included if you "
                                       "build PyTorch from source on a host that has MPI installed.")
                if name == c10d.Backend.GLOO and not c10d.is_gloo_available():
                    raise RuntimeError("Distributed package doesn't have Gloo built in")
                if name == c10d.Backend.NCCL and not c10d.is_nccl_available():
                    raise RuntimeError("Distributed package doesn't have NCCL built in")
                if name == c10d.Backend.XCCL and not c10d.is_xccl_available():
                    raise RuntimeError("Distributed package doesn't have XCCL built in")
                if name not in (c10d.Backend.MPI, c10d.Backend.GLOO, c10d.Backend.NCCL, c10d.Backend.XCCL) and not (
                        name == c10d.Backend.UCC and c10d.is_ucc_available()):
                    assert name.upper() in plugins, f"Unknown c10d backend type {name.upper()}"
            world = int(os.environ.get("WORLD_SIZE", "1"))
            real_init(backend="fake", store=self._FakeStore(), rank=int(os.environ.get("RANK", "0")), world_size=world)
            state["pg_note"] = f"backend={backend!r} (torch's checks passed), world_size={world}"
            state["stage"] = before

        def partial_init(self_, *a, **k):
            saved = (torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            torch.cuda.is_available, torch.cuda.device_count = (lambda: True), (lambda: local)
            torch.cuda.set_device = lambda *a, **k: None
            try:
                real_partial_init(self_, *a, **k)
            finally:
                torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device = saved

        saved_p2p = acc_state.check_cuda_p2p_ib_support
        dist.init_process_group = init_process_group
        acc_state.PartialState.__init__ = partial_init
        acc_state.check_cuda_p2p_ib_support = lambda: True
        try:
            yield
        finally:
            dist.init_process_group = real_init
            acc_state.PartialState.__init__ = real_partial_init
            acc_state.check_cuda_p2p_ib_support = saved_p2p
            if dist.is_initialized():
                dist.destroy_process_group()

    # -------------------------------------------------------------- memo of the model setup

    def setup_key(self, entry: dict, model_args, finetuning_args, is_trainable) -> str:
        """Everything load_model reads: the model's config.json, the model and fine-tuning arguments, whether it
        trains, the KT config LlamaFactory registered, and the process environment."""
        import dataclasses

        from transformers.integrations.kt import _get_kt_config

        def plain(obj):
            return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else vars(obj)

        kt = _get_kt_config()
        return json.dumps([entry.get("model_config"), plain(model_args), plain(finetuning_args), bool(is_trainable),
                           plain(kt) if kt is not None else None, sorted(os.environ.items())],
                          sort_keys=True, default=repr)

    def remember(self, key: str, outcome: dict) -> dict:
        if len(self.setups) >= 64:  # the oldest go (their models with them)
            self.setups.pop(next(iter(self.setups)))
        self.setups[key] = outcome
        return outcome

    # -------------------------------------------------------------- stage 1: accelerate launch

    def accelerate_launch(self, entry: dict) -> tuple[dict, dict]:
        import accelerate.commands.launch as acl
        import accelerate.utils.launch as acu
        import torch.distributed.run as distrib_run
        from accelerate.commands.config.config_args import ComputeEnvironment

        info: dict[str, Any] = {"launcher": None, "world_size": 1}
        parser = acl.launch_command_parser()
        args = parser.parse_args(["--main_process_port", "0", "--config_file", entry["accelerate_yaml"],
                                  "-m", "llamafactory.launcher", entry["train_yaml"]])
        args, defaults, _mp = acl._validate_launch_command(args)
        if args.use_deepspeed and not args.cpu:
            info["launcher"] = "deepspeed"
            from accelerate.utils import is_deepspeed_available

            if not is_deepspeed_available():
                acl.deepspeed_launcher(args)  # raises: DeepSpeed is not installed
            _cmd, env = acu.prepare_deepspeed_cmd_env(args)
        elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu:
            info["launcher"] = "torchrun"
            env = acu.prepare_multi_gpu_env(args)
            targs = acl._filter_args(args, distrib_run.get_args_parser(),
                                     ["--training_script", args.training_script,
                                      "--training_script_args", args.training_script_args])
            config, _cmd, _cmd_args = distrib_run.config_from_args(targs)
            world = int(config.nproc_per_node) * int(config.max_nodes)
            info["world_size"] = world
            env.update({"LOCAL_RANK": "0", "RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE":
                        str(config.nproc_per_node), "WORLD_SIZE": str(world)})
        elif args.tpu and not args.cpu:
            info["launcher"] = "tpu"
            import importlib.util

            if importlib.util.find_spec("torch_xla") is None:
                acl.tpu_launcher(args)  # raises: its first line imports torch_xla
            raise RuntimeError("harness: a TPU launch is not modelled")
        elif defaults is not None and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
            info["launcher"] = "sagemaker"
            from accelerate.utils import is_sagemaker_available

            if not is_sagemaker_available():
                acl.sagemaker_launcher(defaults, args)  # raises: sagemaker is not installed
            raise RuntimeError("harness: a SageMaker launch is not modelled")
        else:
            info["launcher"] = "simple"
            _cmd, env = acu.prepare_simple_launcher_cmd_env(args)
            info["world_size"] = 1
        return env, info

    # -------------------------------------------------------------- stages 2-4: the training process

    def model_config(self, path: str | None, trust_remote_code: bool = True):
        from transformers import AutoConfig, PretrainedConfig

        if path:
            raw = json.loads(Path(path).read_text())
            self._remote_code_gate(raw, trust_remote_code)
        key = path or ""
        if key not in self._model_configs:
            data = json.loads(Path(path).read_text()) if path else {"model_type": "qwen3_moe"}
            data = {k: v for k, v in data.items() if not k.startswith("_")}
            model_type = data.pop("model_type")
            try:
                cfg = AutoConfig.for_model(model_type, **data)
            except Exception:
                cfg = PretrainedConfig(**data)
                cfg.model_type = model_type
            self._model_configs[key] = cfg
        import copy

        return copy.deepcopy(self._model_configs[key])

    @staticmethod
    def _remote_code_gate(raw: dict, trust_remote_code: bool) -> None:
        """A model type transformers lacks whose config names its own code (Kimi-K2/K2.5's auto_map): AutoConfig
        refuses it untrusted (transformers' own words); trusted, only the checkpoint's code builds it, which a
        config stand-in does not carry (a generic PretrainedConfig in its place, text_config left a dict, is not
        what the real start loads): not judged."""
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        from tests.oracle import model_setup

        model_type, code = raw.get("model_type"), (raw.get("auto_map") or {}).get("AutoConfig")
        if model_type in CONFIG_MAPPING or not code:
            return
        if not trust_remote_code:
            raise ValueError("The repository contains custom code which must be executed to correctly load the "
                             "model. Please pass the argument `trust_remote_code=True` to allow custom code to be run.")
        raise model_setup.Unbuildable(f"model_type {model_type!r} is built by the checkpoint's own code ({code}), "
                                      "not here")

    def training_process(self, entry: dict, state: dict) -> None:
        import llamafactory.model.loader as lf_loader
        import llamafactory.train.sft.workflow as wf
        import llamafactory.train.tuner as tuner
        from transformers.integrations import get_reporting_integration_callbacks

        from tests.oracle import model_setup

        judge = self
        real_load_model = lf_loader.load_model
        saved = {}

        def patch(mod, name, value):
            saved[(mod, name)] = getattr(mod, name)
            setattr(mod, name, value)

        real_get_train_args = tuner.get_train_args

        def get_train_args(args=None):
            parsed = real_get_train_args(args)
            state["parsed"] = parsed
            state["stage"] = "llamafactory_workflow"
            return parsed

        def other_workflow(*a, **k):
            state["partial"] = True
            raise _Stop("reached a non-sft workflow (not modelled further)")

        def load_config(model_args):
            config = judge.model_config(entry.get("model_config"), bool(model_args.trust_remote_code))
            if model_args.use_kt:
                from transformers.integrations.kt_artifacts import prepare_kt_pretrained_config

                prepare_kt_pretrained_config(config)
            return config

        def load_model(tokenizer, model_args, finetuning_args, is_trainable=False, *a, **k):
            # LlamaFactory's own load_model; only from_pretrained is the meta build (model_setup.py)
            key = judge.setup_key(entry, model_args, finetuning_args, is_trainable)
            if judge.setups.get(key, {}).get("done"):  # the same inputs were set up before: the same outcome
                outcome = judge.setups[key]
                state["model_notes"] = list(outcome["notes"]) + ["(outcome of an identical setup earlier)"]
                state["kt_kernel_ran"] = outcome["kt_kernel_ran"]
                if outcome.get("exc") is not None:
                    state["stage"] = outcome["stage"]
                    raise outcome["exc"].with_traceback(outcome["tb"])
                if outcome.get("skipped"):
                    state["partial"], state["model_setup_skipped"] = True, outcome["skipped"]
                    raise _Stop(f"model setup not judged: {outcome['skipped']}")
                state["model_setup_ran"] = True
                state["stage"] = "llamafactory_workflow"
                return outcome["model"]
            notes: list[str] = []
            state["stage"] = "model_setup"
            state["model_notes"] = notes
            outcome = judge.remember(key, {"notes": notes, "kt_kernel_ran": False})
            # every tensor of the setup on meta (no weights): the base model's, the KT router Linears, the LoRA A/B
            try:
                with model_setup.meta_loading(notes, state), judge.torch.device("meta"), model_setup.no_host_weights():
                    model = real_load_model(tokenizer, model_args, finetuning_args, is_trainable, *a, **k)
            except model_setup.Unbuildable as exc:  # a file gate: the model's code is not here
                state["partial"] = True
                state["model_setup_skipped"] = outcome["skipped"] = str(exc)
                outcome["done"] = True
                raise _Stop(f"model setup not judged: {exc}") from None
            except Exception as exc:
                outcome.update(exc=exc, tb=exc.__traceback__, stage=state["stage"], done=True,
                               kt_kernel_ran=bool(state.get("kt_kernel_ran")))
                raise
            if model_args.use_kt:
                state["kt_kernel_ran"] = True
            outcome.update(model=model, kt_kernel_ran=bool(state.get("kt_kernel_ran")), done=True)
            state["model_setup_ran"] = True
            state["stage"] = "llamafactory_workflow"
            return model

        def trainer(*a, **k):
            args = k.get("args")
            for cb in get_reporting_integration_callbacks(args.report_to):  # as Trainer.__init__ does
                cb()
            raise _Stop("reached the Trainer")

        patch(tuner, "get_train_args", get_train_args)
        for name in ("run_pt", "run_rm", "run_ppo", "run_dpo", "run_kto"):
            patch(tuner, name, other_workflow)
        patch(wf, "load_tokenizer", lambda model_args, *a, **k: {"tokenizer": _Tokenizer(), "processor": None})
        patch(wf, "get_template_and_fix_tokenizer", lambda *a, **k: None)
        patch(wf, "get_dataset", lambda *a, **k: {})
        patch(wf, "load_model", load_model)
        patch(wf, "create_ref_model", lambda *a, **k: None)
        patch(wf, "SFTDataCollatorWith4DAttentionMask", lambda *a, **k: None)
        patch(wf, "CustomSeq2SeqTrainer", trainer)
        patch(lf_loader, "load_config", load_config)
        argv = sys.argv
        sys.argv = ["llamafactory.launcher", entry["train_yaml"]]
        try:
            tuner.run_exp()
            raise RuntimeError("harness: run_exp returned without reaching the Trainer")
        finally:
            sys.argv = argv
            for (mod, name), value in saved.items():
                setattr(mod, name, value)

    # -------------------------------------------------------------- stage 5: the KT plugin in Accelerator.prepare

    def kt_plugin(self, entry: dict, launch_env: dict, info: dict, state: dict) -> str:
        from accelerate.utils import FullyShardedDataParallelPlugin, KTransformersPlugin
        from accelerate.utils.dataclasses import DistributedType

        parsed = state.get("parsed")
        targs = parsed[2] if parsed else None
        margs = parsed[0] if parsed else None
        use_kt = bool(margs.use_kt) if margs is not None else bool(entry.get("use_kt_raw"))
        if not use_kt:
            return "skip: use_kt is off, no KT plugin"
        env = dict(launch_env)
        cpu = (targs is not None and bool(targs.use_cpu)) or env.get("ACCELERATE_USE_CPU", "false").lower() == "true"
        world = int(info.get("world_size") or 1)
        if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" or (targs is not None and targs.deepspeed):
            dt = DistributedType.DEEPSPEED
        elif "LOCAL_RANK" in env:
            dt = DistributedType.MULTI_CPU if cpu else DistributedType.MULTI_GPU
        else:
            dt = DistributedType.NO
        with _environ(env):
            plugin = None
            if targs is not None and targs.fsdp_plugin_args is not None:
                plugin = FullyShardedDataParallelPlugin(**targs.fsdp_plugin_args)
                os.environ["ACCELERATE_USE_FSDP"] = "true"
            elif os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
                plugin = FullyShardedDataParallelPlugin()
            if dt == DistributedType.MULTI_GPU:
                if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or plugin is not None:
                    dt = DistributedType.FSDP
                    mp = targs.mixed_precision if targs is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
                    if mp != "no" and plugin is not None:
                        plugin.set_mixed_precision(mp)
                if os.environ.get("ACCELERATE_USE_MEGATRON_LM", "false").lower() == "true":
                    dt = DistributedType.MEGATRON_LM
            is_fsdp2 = dt == DistributedType.FSDP and plugin is not None and plugin.fsdp_version == 2
            kt = KTransformersPlugin(enabled=True, kt_config={})
            kt.validate_distributed_setup(dt, is_fsdp2=is_fsdp2, num_processes=world)
        return f"pass: distributed_type={dt}, fsdp2={is_fsdp2}, num_processes={world}"

    # -------------------------------------------------------------- one case

    def run_case(self, entry: dict) -> dict:
        from accelerate.state import AcceleratorState
        from transformers.integrations.kt import unset_kt_config

        env0, threads0, t0 = dict(os.environ), self.torch.get_num_threads(), time.monotonic()
        rec: dict[str, Any] = {"case_id": entry["case_id"], "stages": {}}
        state: dict[str, Any] = {"stage": "accelerate_launch"}

        def refuse(stage, exc):
            rec["stages"][stage] = {"status": "refuse", "type": type(exc).__name__, "message": _msg(exc),
                                    "at": _where(exc)}

        def on_alarm(signum, frame):
            raise _Timeout(f"case exceeded {self.per_case} s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.per_case)
        launch_env: dict = {}
        info: dict = {"world_size": 1}
        try:
            base_env = dict(env0)
            base_env.update(entry.get("launch_env") or {})  # what launch.sh exports before `accelerate launch`
            try:
                with _environ(base_env):
                    launch_env, info = self.accelerate_launch(entry)
                rec["stages"]["accelerate_launch"] = {"status": "pass", "note": f"launcher={info['launcher']}, "
                                                      f"world_size={info['world_size']}"}
            except (Exception, SystemExit) as exc:
                refuse("accelerate_launch", exc)
                launch_env = dict(base_env)
            train_env = dict(launch_env)  # the rank-0 process's environment (torchrun's LOCAL_RANK/RANK/WORLD_SIZE)
            state["stage"] = "llamafactory_args"
            failed, note = None, ""
            try:
                with _environ(train_env), self.process_group(state):
                    self.training_process(entry, state)
            except _Stop as stop:
                note = str(stop)
            except model_setup_unbuildable() as exc:   # a file gate wherever the config is read: not judged
                state["partial"] = True
                note = f"model setup not judged: {exc}"
            except (Exception, SystemExit) as exc:
                failed = state["stage"]
                refuse(failed, exc)
            if failed not in ("llamafactory_args", "torch_distributed"):
                rec["stages"]["llamafactory_args"] = {"status": "pass"}
            if failed is None:
                rec["stages"]["llamafactory_workflow"] = {"status": "pass", "note": note}
            parsed = state.get("parsed")
            notes = "; ".join(state.get("model_notes") or [])
            if failed != "kt_kernel":
                if state.get("kt_kernel_ran"):
                    rec["stages"]["kt_kernel"] = {"status": "pass", "note": notes}
                elif parsed is not None and not parsed[0].use_kt:
                    rec["stages"]["kt_kernel"] = {"status": "skip", "note": "use_kt is off"}
            if state.get("model_setup_skipped"):
                rec["stages"]["model_setup"] = {"status": "skip", "note": state["model_setup_skipped"]}
            elif failed == "model_setup":
                rec["stages"]["model_setup"]["note"] = notes
            elif state.get("model_setup_ran"):
                rec["stages"]["model_setup"] = {"status": "pass", "note": notes}
            if failed != "torch_distributed":
                if state.get("pg_note"):
                    rec["stages"]["torch_distributed"] = {"status": "pass", "note": state["pg_note"]}
                elif parsed is not None:
                    rec["stages"]["torch_distributed"] = {"status": "skip", "note": "no process group asked for"}
            try:
                note = self.kt_plugin(entry, launch_env, info, state)
                rec["stages"]["kt_plugin"] = {"status": "skip" if note.startswith("skip") else "pass", "note": note}
            except (Exception, SystemExit) as exc:
                refuse("kt_plugin", exc)
        except _Timeout as exc:
            rec["stages"][state["stage"]] = {"status": "timeout", "message": str(exc)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            os.environ.clear()
            os.environ.update(env0)
            self.torch.set_num_threads(threads0)
            with contextlib.suppress(Exception):
                unset_kt_config()
            with contextlib.suppress(Exception):
                AcceleratorState._reset_state(reset_partial_state=True)
        for st in STAGES:
            rec["stages"].setdefault(st, {"status": "not_reached"})
        first = next((st for st in STAGES if rec["stages"][st]["status"] in ("refuse", "timeout")), None)
        rec["verdict"] = "refuse" if first else "accept"
        rec["partial"] = bool(state.get("partial"))
        rec["first_refusal"] = first
        rec["seconds"] = round(time.monotonic() - t0, 3)
        return rec


@contextlib.contextmanager
def _environ(env: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _chunks(entries: list[dict], workers: int) -> list[list[dict]]:
    """Cases of one model config go to one worker (its setups repeat there); the heaviest groups first, each to the
    least loaded worker (weight: cases x the model's layers)."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(e.get("model_config") or "", []).append(e)

    def layers(path: str) -> int:
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return 4
        return int((cfg.get("text_config") or cfg).get("num_hidden_layers") or 4)

    load = [0.0] * workers
    out: list[list[dict]] = [[] for _ in range(workers)]
    for path, members in sorted(groups.items(), key=lambda kv: -len(kv[1]) * layers(kv[0])):
        # a group larger than a worker's share is split, so no worker waits on one big model
        share = max(1, -(-len(members) // workers)) if len(groups) < workers * 2 else len(members)
        for i in range(0, len(members), share):
            w = load.index(min(load))
            out[w] += members[i:i + share]
            load[w] += len(members[i:i + share]) * (1 + layers(path) / 8)
    order = {e["case_id"]: i for i, e in enumerate(entries)}
    # each worker goes in manifest order: the cases finished at any time are a prefix of the manifest, per worker
    return [sorted(c, key=lambda e: order[e["case_id"]]) for c in out if c]


def judge_all(judge: Judge, entries: list[dict], workers: int, out: Path) -> list[dict]:
    """Every case, in ``workers`` processes forked from this one after the imports; results in manifest order.
    Each verdict is appended to OUT.partN.jsonl as it comes, and a rerun skips the cases found there (resume)."""
    done: dict[str, dict] = {}
    for part in sorted(out.parent.glob(out.stem + ".part*.jsonl")):
        for line in part.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                done[rec["case_id"]] = rec
    todo = [e for e in entries if e["case_id"] not in done]
    chunks = _chunks(todo, workers) if todo else []
    base = len(list(out.parent.glob(out.stem + ".part*.jsonl")))

    def run(chunk: list[dict], w: int) -> None:
        with out.with_name(f"{out.stem}.part{base + w}.jsonl").open("a") as fh:
            for e in chunk:
                fh.write(json.dumps(judge.run_case(e)) + "\n")
                fh.flush()

    if len(chunks) <= 1:
        for w, chunk in enumerate(chunks):
            run(chunk, w)
        failed: list[int] = []
    else:
        pids = []
        for w, chunk in enumerate(chunks):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 1
                try:
                    judge.torch.set_num_threads(1)
                    run(chunk, w)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    for part in sorted(out.parent.glob(out.stem + ".part*.jsonl")):
        for line in part.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                done[rec["case_id"]] = rec
    missing = [e["case_id"] for e in entries if e["case_id"] not in done]
    if failed or missing:
        raise SystemExit(f"judge workers failed ({len(failed)}); {len(missing)} cases unjudged, first {missing[:3]} "
                         f"(rerun to resume)")
    for part in out.parent.glob(out.stem + ".part*.jsonl"):
        part.unlink()
    return [done[e["case_id"]] for e in entries]


def main(argv: list[str]) -> int:
    cases_dir, out = Path(argv[1]), Path(argv[2])
    per_case = float(argv[3]) if len(argv) > 3 else 30.0
    os.environ.pop("KT_KERNEL_CPU_VARIANT", None)  # load the kernel build this CPU can run; no check depends on it
    os.environ["DISABLE_VERSION_CHECK"] = "1"
    os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    judge = Judge(per_case)
    import gc

    gc.freeze()  # the imported stack stays out of the collections kt-kernel's wrapper asks for (speed only)
    t_import = time.monotonic() - t0
    manifest = json.loads((cases_dir / "manifest.json").read_text())
    only = set(argv[4].split(",")) if len(argv) > 4 and argv[4] else None
    entries = []
    for entry in manifest["cases"]:
        if only and entry["case_id"] not in only:
            continue
        for key in ("train_yaml", "accelerate_yaml"):
            entry[key] = str((cases_dir / entry[key]).resolve())
        entries.append(entry)
    workers = max(1, min(int(os.environ.get("ORACLE_JUDGE_WORKERS", "0") or 0) or os.cpu_count() or 1, len(entries)))
    results = judge_all(judge, entries, workers, out)
    import importlib.metadata as md

    out.write_text(json.dumps({
        "versions": {d: md.version(d) for d in ("llamafactory-kt", "transformers-kt", "accelerate-kt", "kt-kernel",
                                                "torch", "omegaconf", "pyyaml")},
        "import_seconds": round(t_import, 2), "total_seconds": round(time.monotonic() - t0, 2),
        "per_case_limit_seconds": per_case, "workers": workers, "results": results}, indent=0) + "\n")
    print(f"judged {len(results)} cases in {time.monotonic() - t0:.1f} s -> {out}", file=sys.__stdout__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
