"""Write stack_catalog.json: the real stack's argument definitions, read from the installed wheels.

Runs inside the full image (it imports llamafactory, transformers-kt, accelerate-kt and kt-kernel):

    docker run --rm --user 0 -v "$PWD":/src -w /src -e PYTHONPATH=/src --entrypoint python3 \
        -e KT_KERNEL_CPU_VARIANT=avx512_bf16 ktsft:amx tests/oracle/extract_stack_catalog.py

The independent generator (independent_gen.py) draws its keys, types and choices from this file only: it never
reads ktdeploy's own key catalogue or rules. Each field is described by ``kinds`` (the scalar/container kinds its
annotation admits: bool, int, float, str, list, dict, none), ``choices`` (the values of a Literal or Enum in the
annotation) and ``default`` (JSON-able or null).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import json
import os
import sys
import types
import typing
from pathlib import Path

OUT = Path(__file__).with_name("stack_catalog.json")
MODELS = Path(__file__).resolve().parents[2] / "recipes" / "models"


def _kinds_and_choices(tp) -> tuple[set[str], list]:
    kinds: set[str] = set()
    choices: list = []
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            k, c = _kinds_and_choices(arg)
            kinds |= k
            choices += [x for x in c if x not in choices]
        return kinds, choices
    if origin is typing.Literal:
        for v in typing.get_args(tp):
            kinds.add(type(v).__name__ if v is not None else "none")
            choices.append(v)
        return kinds, choices
    if tp is type(None):
        return {"none"}, []
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"str"}, [m.value for m in tp]
    if tp is bool:
        return {"bool"}, []
    if tp is int:
        return {"int"}, []
    if tp is float:
        return {"float"}, []
    if tp is str:
        return {"str"}, []
    if origin in (list, tuple, set) or tp in (list, tuple, set):
        inner = typing.get_args(tp)
        sub_choices: list = []
        for a in inner:
            sub_choices += _kinds_and_choices(a)[1]
        return {"list"}, sub_choices
    if origin is dict or tp is dict or (isinstance(tp, type) and issubclass(tp, dict)):
        return {"dict"}, []
    if origin is typing.Union:
        return {"other"}, []
    return {"other"}, []


def _jsonable(value):
    if isinstance(value, enum.Enum):
        return value.value
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def describe_dataclass(cls) -> list[dict]:
    hints = typing.get_type_hints(cls, include_extras=False)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        kinds, choices = _kinds_and_choices(hints.get(f.name, typing.Any))
        if f.default is not dataclasses.MISSING:
            default = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _jsonable(f.default_factory())
        else:
            default = "<required>"
        row = {"name": f.name, "kinds": sorted(kinds), "choices": [_jsonable(c) for c in choices], "default": default}
        if f.metadata.get("choices"):  # choices argparse would enforce (HfArgumentParser.parse_dict does not)
            row["meta_choices"] = [_jsonable(c) for c in f.metadata["choices"]]
        out.append(row)
    return out


def accelerate_launch_args() -> list[dict]:
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        typ = getattr(action.type, "__name__", None) if action.type else None
        kind = {"int": "int", "float": "float", "str": "str", "str_to_bool": "bool", "_convert_nargs_to_dict": "dict"}.get(
            typ or "", "bool" if action.nargs == 0 else "str")
        out.append({"name": action.dest, "kinds": [kind], "choices": [_jsonable(c) for c in (action.choices or [])],
                    "default": _jsonable(action.default)})
    return out


def build_config(path: Path):
    """A recipes/models config.json as the judge builds it (AutoConfig.for_model on the file's fields)."""
    from transformers import AutoConfig

    data = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(data.pop("model_type"), **data)


def load_class(config):
    """The auto class LlamaFactory's load_model picks for a config (llamafactory/model/loader.py)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
        AutoModelForTextToWaveform,
    )

    for cls in (AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoModelForTextToWaveform):
        if type(config) in cls._model_mapping.keys():  # noqa: SIM118 - as LlamaFactory asks the lazy mapping
            return cls
    return AutoModelForCausalLM


def model_modules() -> dict:
    """Per recipes/models config.json: the module names the architecture builds (the model class the auto mapping
    names, under from_pretrained's init contexts: on the meta device, no weights).
    ``linear``: leaf names of the Linear-class modules (what LlamaFactory's lora_target "all" would collect, lm_head
    included); ``names``: every leaf module name."""
    import contextlib

    from transformers.models.auto.auto_factory import _get_model_class

    from tests.oracle.model_setup import init_contexts

    out: dict = {}
    for path in sorted(MODELS.glob("*.json")):
        try:
            config = build_config(path)
            model_cls = _get_model_class(config, load_class(config)._model_mapping)
            with contextlib.ExitStack() as stack:
                for ctx in init_contexts(model_cls, config, False):
                    stack.enter_context(ctx)
                model = model_cls(config)
        except Exception as exc:  # an architecture this transformers does not build (remote code)
            out[path.stem] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        linear, names = set(), set()
        for name, module in model.named_modules():
            leaf = name.split(".")[-1]
            if not name or leaf.isdigit():
                continue
            names.add(leaf)
            if "Linear" in type(module).__name__ and "Embedding" not in type(module).__name__:
                linear.add(leaf)
        out[path.stem] = {"model_class": type(model).__name__, "linear": sorted(linear), "names": sorted(names)}
    return out


def main() -> int:
    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils.dataclasses import DistributedType, DynamoBackend, PrecisionType
    from kt_kernel.sft import config as kt_config_mod
    from kt_kernel.sft.config import KTConfig
    from llamafactory.hparams import DataArguments, FinetuningArguments, GeneratingArguments, ModelArguments
    from llamafactory.hparams.training_args import TrainingArguments

    catalog = {
        "generated_by": "tests/oracle/extract_stack_catalog.py inside the full image",
        "versions": {d: importlib.metadata.version(d) for d in
                     ("llamafactory-kt", "transformers-kt", "accelerate-kt", "kt-kernel", "peft-kt", "torch")},
        "llamafactory": {cls.__name__: describe_dataclass(cls) for cls in
                         (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments)},
        "ktconfig": describe_dataclass(KTConfig),
        "kt_backends": sorted(kt_config_mod._KNOWN_SFT_BACKENDS),
        "kt_expert_weight_formats": list(typing.get_args(kt_config_mod.ExpertWeightFormat)),
        "kt_weight_lifecycles": list(typing.get_args(kt_config_mod.WeightLifecycle)),
        "accelerate": {
            "cluster_config": describe_dataclass(ClusterConfig),
            "launch_args": accelerate_launch_args(),
            "distributed_types": [m.value for m in DistributedType],
            "mixed_precision": [m.value for m in PrecisionType],
            "dynamo_backends": [m.value for m in DynamoBackend],
        },
        "model_modules": model_modules(),
    }
    OUT.write_text(json.dumps(catalog, indent=1, sort_keys=True) + "\n")
    n = sum(len(v) for v in catalog["llamafactory"].values())
    print(f"wrote {OUT}: {n} LlamaFactory/transformers fields, {len(catalog['ktconfig'])} KTConfig fields, "
          f"{len(catalog['accelerate']['launch_args'])} accelerate launch args")
    return 0


if __name__ == "__main__":
    sys.exit(main())
