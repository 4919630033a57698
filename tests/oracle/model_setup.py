"""The judge's model setup: the model built on the meta device from its config.json, then the real stack's setup.

Runs inside the full image, called by stack_judge.py for every case whose arguments parse. What a training start
does from ``load_model`` on, each piece the stack's own code:

- LlamaFactory's ``load_model`` (patch_config, patch_model, register_autoclass, ``init_adapter``, the Conv3D check,
  the parameter count) runs for real; only ``from_pretrained`` of the auto class it picks is stood in for by
  :func:`meta_from_pretrained`, which does what transformers-kt's ``from_pretrained`` does to the model's structure
  without weights: the model class the auto mapping names, built under accelerate's ``init_empty_weights`` (every
  parameter on the meta device), KT's ``prepare_kt_pretrained_config`` and ``claim_kt_routed_expert_subtrees``, and
  kt-kernel's ``wrap_moe_layers_with_kt_wrapper`` over every layer (KTConfig, every wrapper check, the expert layout
  of the architecture, each layer's ``KTMoEWrapper`` construction with its dimension checks, the layer wrappers that
  replace the MoE blocks);
- ``init_adapter`` then resolves the LoRA targets (``find_all_linear_modules`` / ``patch_target_modules``) and runs
  peft's ``get_peft_model`` on that model: target matching ("Target modules ... not found in the base model"),
  ``modules_to_save``, DoRA/rsLoRA layers.

Gates (hardware or files only, never a configuration rule): kt-kernel's CPU thread pool (``_get_cpu_infer``: the
host's NUMA nodes and cores), the expert weights (reading safetensors shards, ``.kt`` trees, the persistent INT8
manifest, the ephemeral store, extracting meta tensors) and the C++ kernel's weight loading, and LoRA experts made on
the meta device instead of ``cuda``; the source quantizer (``get_hf_quantizer``: FP8 checkpoints, bitsandbytes) is
asked for on a CUDA host with a compute-capability 9.0 GPU (the target), then its ``preprocess_model`` replaces
modules on the meta model as from_pretrained does.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace
from typing import Any

BIG = 2 ** 24  # elements: a tensor this large in the model setup is weights (or a buffer sized like them)


def no_host_weights():
    """A torch function mode for the model setup: a tensor of BIG elements or more is made on the meta device
    instead of the host. The real setup holds the experts in host memory (that is the point of KT: hundreds of GB
    on the training box); here those tensors keep their shapes, dtypes and strides, without the memory. Small
    tensors stay real."""
    import torch
    from torch.overrides import TorchFunctionMode

    factories = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
                 torch.empty_strided, torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like}

    def big(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() >= BIG

    def to_meta(x):
        if big(x):
            return x.to("meta")
        if isinstance(x, (list, tuple)):
            return type(x)(to_meta(y) for y in x)
        return x

    class NoHostWeights(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories:
                probe = func(*args, **{**kwargs, "device": "meta"})
                if probe.numel() >= BIG:
                    return probe
                return func(*args, **kwargs)
            if any(big(a) or (isinstance(a, (list, tuple)) and any(big(y) for y in a)) for a in args) or \
                    any(big(v) for v in kwargs.values()):
                args = tuple(to_meta(a) for a in args)
                kwargs = {k: to_meta(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return NoHostWeights()


class Unbuildable(Exception):
    """An architecture this transformers does not have (its code lives in the checkpoint: trust_remote_code)."""


def _placeholders(*a, **k):
    import torch

    return torch.empty(0), torch.empty(0), torch.empty(0)


class _EphemeralStore:
    @classmethod
    def open(cls, *a, **k):
        return cls()

    def consume_layer(self, *a, **k):
        return None

    def finish(self):
        return None

    def cleanup(self):
        return None


@contextlib.contextmanager
def kt_gates(notes: list[str]):
    """Install the hardware/file gates of kt-kernel's per-layer wrapping; restore them afterwards."""
    import kt_kernel.experts_base as eb
    import kt_kernel.sft.ephemeral as eph
    import kt_kernel.sft.weight_manifest as wm
    import kt_kernel.sft.wrapper as ktw

    saved: list[tuple[Any, str, Any]] = []

    def patch(obj, name, value):
        saved.append((obj, name, obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)))
        setattr(obj, name, value)

    pools: list[tuple[int, int]] = []

    def cpu_infer(cls, cpuinfer_threads, threadpool_count, numa_nodes=None):
        # the real one starts a thread pool on the host's NUMA nodes; record what it was asked for
        pools.append((cpuinfer_threads, threadpool_count))
        return SimpleNamespace(threads=cpuinfer_threads, pools=threadpool_count)

    real_wrapper = ktw.KTMoEWrapper

    def kt_moe_wrapper(*a, **k):
        w = real_wrapper(*a, **k)  # every constructor check (dimensions over the pools, methods, LoRA settings)
        for name in ("load_weights", "load_weights_from_tensors", "load_block_fp8_weights", "load_rawint4_weights",
                     "load_mxfp4_weights", "init_full_weight_grad_buffers"):
            setattr(w, name, lambda *a, **k: None)  # the C++ kernel reading the weights
        return w

    real_lora_experts = ktw.LoRAExperts

    def lora_experts(*a, **k):
        k["device"] = "meta"
        return real_lora_experts(*a, **k)

    patch(eb._MoEBase if hasattr(eb, "_MoEBase") else eb.BaseMoEWrapper, "_get_cpu_infer", classmethod(cpu_infer))
    patch(ktw, "KTMoEWrapper", kt_moe_wrapper)
    patch(ktw, "LoRAExperts", lora_experts)
    patch(ktw, "extract_moe_weights", _placeholders)
    patch(ktw, "load_experts_from_checkpoint_files", _placeholders)
    patch(ktw, "load_block_fp8_experts_from_checkpoint_files", lambda *a, **k: {})
    patch(ktw, "load_rawint4_experts_from_checkpoint_files", lambda *a, **k: {})
    patch(ktw, "load_full_weight_layer", _placeholders)
    patch(wm, "validate_persistent_int8_weights", lambda path, **k: SimpleNamespace(
        path=path, schema_version=0, is_legacy=False, layout="(not read)", layer_indices=k.get("layer_indices", []),
        file_count=0, size_bytes=0))
    patch(eph, "EphemeralKTWeightStore", _EphemeralStore)
    try:
        yield pools
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        if pools:
            notes.append("kt thread pools asked for (threads, pools): " + ", ".join(map(str, sorted(set(pools)))))


def meta_from_pretrained(auto_cls, notes: list[str], state: dict, **kwargs):
    """What transformers-kt's ``from_pretrained`` does to the model's structure, with every tensor on meta."""
    import torch
    from transformers.integrations.kt import _get_kt_config, is_kt_expert_loading_enabled
    from transformers.integrations.kt_artifacts import claim_kt_routed_expert_subtrees, prepare_kt_pretrained_config
    from transformers.models.auto.auto_factory import _get_model_class

    config = copy.deepcopy(kwargs["config"])
    path = kwargs.get("pretrained_model_name_or_path")
    if type(config) not in auto_cls._model_mapping.keys():  # noqa: SIM118
        raise Unbuildable(f"{type(config).__name__} (model_type {getattr(config, 'model_type', None)!r}) has no "
                          f"class in {auto_cls.__name__}: its code comes with the checkpoint")
    model_cls = _get_model_class(config, auto_cls._model_mapping)
    prepare_kt_pretrained_config(config, kwargs.get("quantization_config"))
    quantizer, config, device_map = _quantizer(config, kwargs)
    if quantizer is not None:
        notes.append(f"source quantizer {type(quantizer).__name__}")
    config.name_or_path = path
    model = _build(model_cls, config, quantizer, device_map)
    if is_kt_expert_loading_enabled():
        claim_kt_routed_expert_subtrees(model)
        kt_config = _get_kt_config()
        if kt_config is not None:
            root = str(path)
            kt_config.set_runtime_metadata(
                kt_checkpoint_files=[f"{root}/model-00001-of-00002.safetensors",
                                     f"{root}/model-00002-of-00002.safetensors"],
                kt_sharded_metadata={"weight_map": {}}, kt_pretrained_load_plan=None,
                kt_source_model_name_or_path=path)
            from kt_kernel.sft import wrap_moe_layers_with_kt_wrapper

            state["stage"] = "kt_kernel"
            with kt_gates(notes), torch.device("meta"):  # tensors the wrapper makes (router Linears): no weights
                model._kt_wrappers = wrap_moe_layers_with_kt_wrapper(model, kt_config)
            state["stage"] = "model_setup"
            state["kt_kernel_ran"] = True
            notes.append(f"kt wrapped {len(model._kt_wrappers)} MoE layers")
    else:
        notes.append("KT expert loading disabled: from_pretrained does not wrap")
    if quantizer is not None and quantizer.pre_quantized and getattr(quantizer.quantization_config, "dequantize", False):
        # postprocess_model once the weights are in: a dequantized checkpoint is not quantized any more (the real
        # load_model with the tiny FP8 weights: tests/integration/probes/fp8_full_load.py; this stand-in refused
        # full fine-tuning there before)
        quantizer.remove_quantization_config(model)
        notes.append("dequantized when loaded: quantization config removed (postprocess_model)")
    model.eval()
    return model


_BUILT: dict[str, Any] = {}  # the model as its class builds it from one exact config (before any setup touches it)


def _build(model_cls, config, quantizer, device_map):
    """``model_cls(config)`` under from_pretrained's init contexts (+ the quantizer's preprocessing). A model built
    from an identical config (every field, as JSON) is taken as a deep copy of the one built before: the same
    structure, made ~5x faster than building 60-94 layers again."""
    import json

    key = json.dumps([model_cls.__name__, quantizer is not None, config.to_dict()], sort_keys=True, default=str)
    if key not in _BUILT:
        with contextlib.ExitStack() as stack:
            for ctx in init_contexts(model_cls, config, quantizer is not None):
                stack.enter_context(ctx)
            model = model_cls(config)
            if quantizer is not None:  # replaces modules with quantized ones (touches no weights)
                quantizer.preprocess_model(model=model, dtype=_dtype(config), device_map=device_map,
                                           checkpoint_files=None, use_kernels=False)
        if len(_BUILT) >= 12:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = model
    return copy.deepcopy(_BUILT[key])


def init_contexts(model_cls, config, is_quantized: bool) -> list:
    """from_pretrained's own init contexts (the model class's get_init_context: every tensor made on meta, the
    checkpoint's dtype), with accelerate's init_empty_weights for buffers made off those contexts."""
    from accelerate import init_empty_weights

    return [*model_cls.get_init_context(_dtype(config), is_quantized, False, None), init_empty_weights()]


def _dtype(config):
    """The checkpoint's dtype (torch_dtype "auto", as LlamaFactory asks for)."""
    import torch

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.bfloat16
    return getattr(torch, dtype, torch.bfloat16) if isinstance(dtype, str) else dtype


def _quantizer(config, kwargs: dict):
    """The source quantizer from_pretrained makes (``get_hf_quantizer``: FP8 checkpoints, bitsandbytes, ...), asked
    on the target: a CUDA host with an H100-class GPU (compute capability 9.0; a gate: this machine has none)."""
    import torch
    from transformers.quantizers.auto import get_hf_quantizer

    saved = (torch.cuda.is_available, torch.cuda.get_device_capability, torch.cuda.device_count)
    torch.cuda.is_available, torch.cuda.get_device_capability = (lambda: True), (lambda *a, **k: (9, 0))
    torch.cuda.device_count = lambda: 1
    try:
        quantizer, config, device_map = get_hf_quantizer(config, kwargs.get("quantization_config"),
                                                         kwargs.get("device_map"), True, {})
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability, torch.cuda.device_count = saved
    return quantizer, config, device_map


@contextlib.contextmanager
def meta_loading(notes: list[str], state: dict):
    """Stand ``from_pretrained`` of the auto classes LlamaFactory's load_model may pick in for the meta build."""
    import transformers

    names = ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModelForSeq2SeqLM",
             "AutoModelForTextToWaveform")
    saved = {}
    for name in names:
        cls = getattr(transformers, name)
        saved[name] = cls.__dict__.get("from_pretrained")

        def stand_in(klass, *a, _notes=notes, _state=state, **k):
            if a:
                k.setdefault("pretrained_model_name_or_path", a[0])
            return meta_from_pretrained(klass, _notes, _state, **k)

        cls.from_pretrained = classmethod(stand_in)
    try:
        yield
    finally:
        for name in names:
            cls = getattr(transformers, name)
            if saved[name] is None:
                with contextlib.suppress(AttributeError):
                    del cls.from_pretrained
            else:
                cls.from_pretrained = saved[name]
