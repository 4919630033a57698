"""A seeded generator of recipe variants, independent of ktdeploy's rules.

``cases(seed, n)`` returns ``n`` distinct ``(case_id, recipe_dict, description)`` triples, deterministic for a seed
(case ``i`` is drawn from ``(seed, i)``, drawn again when it repeats an earlier case -- 40 of seed 20261204's 2,500 --
so it also depends on the cases before it; a longer run extends a shorter one). Each case is one shipped recipe
(recipes/*.yaml) with 1-4 mutations of its ``train:`` / ``accelerate:`` sections. Keys, value types and choices come
from the real stack's argument definitions only (stack_catalog.json, written from the wheels in the full image by
extract_stack_catalog.py: LlamaFactory's ModelArguments/DataArguments/FinetuningArguments/GeneratingArguments,
transformers-kt's TrainingArguments, kt-kernel's KTConfig, accelerate's ClusterConfig and launch arguments).

Mutations: a catalogue key set to a valid value, a value of the wrong type, a choice in another case or with
whitespace, a YAML 1.1 spelling (``yes``/``off``/``~``/``0x10``/``1e3``/``'08'``...), a boundary number, a list
for a scalar and the reverse, a dropped key, a misspelt key, and cross-key scenarios (evaluation without eval data,
streaming without max_steps, LoRA with GaLore/APOLLO/BAdam, quantization with full tuning, FSDP settings without
``fsdp_version: 2``, distributed_type variants, kt-kernel format/backend/lifecycle combinations, ...).

A value written as ``Raw("yes")`` is emitted unquoted, exactly as given, so the YAML loader of each reader decides
what it means; ``dump_recipe`` writes a case as YAML text.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CATALOG_PATH = Path(__file__).with_name("stack_catalog.json")
SECTIONS = ("train", "accelerate", "deploy")


class Raw(str):
    """A scalar written verbatim (unquoted) into the YAML: the reader's YAML rules decide its type."""

    def __repr__(self) -> str:
        return f"Raw({str(self)!r})"


# ---------------------------------------------------------------- YAML text

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"yes", "no", "on", "off", "y", "n", "true", "false", "null", "~", "nan", "inf"}


def _scalar(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "e" in text or "E" in text:  # YAML 1.1 floats need a dot and a signed exponent: 1e-05 -> 1.0e-05
            mant, exp = text.lower().split("e")
            if "." not in mant:
                mant += ".0"
            if exp[0] not in "+-":
                exp = "+" + exp
            return f"{mant}e{exp}"
        return text
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value)
    raise TypeError(f"not a scalar: {value!r}")


def _key(key: Any) -> str:
    return _scalar(key if isinstance(key, str) else str(key))


def _emit(obj: Any, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for k, v in obj.items():
        if isinstance(v, dict) and v:
            out.append(f"{pad}{_key(k)}:")
            _emit(v, indent + 1, out)
        elif isinstance(v, dict):
            out.append(f"{pad}{_key(k)}: {{}}")
        elif isinstance(v, list):
            items = ", ".join(_flow(x) for x in v)
            out.append(f"{pad}{_key(k)}: [{items}]")
        else:
            out.append(f"{pad}{_key(k)}: {_scalar(v)}")


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(x) for x in value) + "]"
    return _scalar(value)


def dump_section(section: dict) -> str:
    """One section's mapping as YAML text (what a native train.yaml / accelerate.yaml would hold)."""
    out: list[str] = []
    _emit(section, 0, out)
    return "\n".join(out) + "\n"


def dump_recipe(recipe: dict) -> str:
    """The recipe as one YAML document (block mappings, flow lists, Raw scalars verbatim)."""
    out: list[str] = []
    _emit(recipe, 0, out)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- inputs

@functools.lru_cache(maxsize=1)
def catalog() -> dict:
    return json.loads(CATALOG_PATH.read_text())


# The six recipes exactly as seed 20261204 was recorded from (copies: the shipped tiny recipe has since moved its
# paths under deploy.root, and the recorded cases and the stack's verdicts on them are of these texts).
BASES_V1_DIR = Path(__file__).with_name("bases_v1")


@functools.lru_cache(maxsize=4)
def _bases_frozen(names: tuple[str, ...], folder: Path = REPO / "recipes") -> tuple[tuple[str, str], ...]:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    out = []
    for name in names:
        p = folder / f"{name}.yaml"
        out.append((p.stem, json.dumps(yaml.load(p.read_text()))))
    return tuple(out)


# The shipped recipes the recorded seeds were drawn from (the generator mutates these; a recipe shipped later joins
# only with a new recording, so seed 20261204 keeps making the recorded cases).
BASES = ("deepseek-v3-fp8-lora", "glm-4.5-air-bf16-full", "qwen3-235b-int8-lora", "qwen35-397b-amxint4-lora",
         "qwen35-397b-bf16-lora", "tiny-moe-lora")
# Profile "issue49" adds the tiny recipes of every expert format (their model's config.json is small and real: the
# model-dependent checks see a second shape beside the big ones).
BASES_49 = BASES + ("tiny-moe-fp8-lora", "tiny-moe-amxint4-lora", "tiny-moe-int8-lora", "tiny-moe-full",
                    "tiny-moe-int8-ephemeral-lora")


def base_recipes(profile: str = "v1") -> dict[str, dict]:
    """The shipped recipes of a profile as plain dicts (fresh copies)."""
    frozen = _bases_frozen(BASES_49) if profile == "issue49" else _bases_frozen(BASES, BASES_V1_DIR)
    return {name: json.loads(text) for name, text in frozen}


@functools.lru_cache(maxsize=1)
def _fields() -> dict[str, dict[str, dict]]:
    cat = catalog()
    lf: dict[str, dict] = {}
    for cls_fields in cat["llamafactory"].values():
        for f in cls_fields:
            lf.setdefault(f["name"], f)
    kt = {f["name"]: f for f in cat["ktconfig"]}
    cluster = {f["name"]: f for f in cat["accelerate"]["cluster_config"]}
    cluster["distributed_type"] = {**cluster["distributed_type"], "choices": cat["accelerate"]["distributed_types"]}
    cluster["mixed_precision"] = {**cluster["mixed_precision"], "choices": cat["accelerate"]["mixed_precision"]}
    fsdp = {}
    for f in cat["accelerate"]["launch_args"]:
        if not f["name"].startswith("fsdp_"):
            continue
        # argparse types every flag as text; in the YAML file the launcher reads, flags are booleans/integers
        if f["default"] in ("true", "false"):
            f = {**f, "kinds": ["bool"]}
        elif f["name"] == "fsdp_version":
            f = {**f, "kinds": ["int"], "choices": [int(c) for c in f["choices"]]}
        fsdp[f["name"]] = f
    kt["kt_backend"] = {**kt["kt_backend"], "choices": cat["kt_backends"]}
    kt["kt_expert_weight_format"] = {**kt["kt_expert_weight_format"], "choices": cat["kt_expert_weight_formats"]}
    kt["kt_weight_lifecycle"] = {**kt["kt_weight_lifecycle"], "choices": cat["kt_weight_lifecycles"]}
    return {"train": lf, "kt_config": kt, "accelerate": cluster, "fsdp_config": fsdp}


# Fields left out of random draws: credentials, hub uploads and cluster launchers touch the world, not the recipe.
_SKIP = re.compile(r"token|hub_|^ray_|api_key|^push_to_hub|^trackio|^project$|^swanlab_(?!mode)|^mlflow|^dataloader_persistent")


@functools.cache
def _drawable(where: str) -> tuple[str, ...]:
    return tuple(sorted(n for n in _fields()[where] if not _SKIP.search(n)))


def _draw_field(rng: random.Random, where: str) -> tuple[str, dict]:
    name = rng.choice(_drawable(where))
    return name, _fields()[where][name]


# ---------------------------------------------------------------- value pools

_WRONG = {
    "bool": [True, False],
    "int": [7, 0, -3],
    "float": [0.5, 1.0e-4],
    "str": ["seven", "8", "true", ""],
    "list": [["a", "b"], [1, 2]],
    "dict": [{"k": 1}],
}
_Y11_BOOL = ["yes", "no", "on", "off", "Yes", "NO", "On", "OFF", "y", "n", "True", "FALSE", "~"]
_Y11_INT = ["0x10", "0o17", "010", "1_000", "1e3", "+5", "08", "09", "1.0", "0b101", "1:30", "2e0", "'8'"]
_Y11_FLOAT = ["1e-4", "1E-4", "1.0e-4", "1.0E-4", ".inf", "-.Inf", ".NaN", "1_000.5", "5e-5", "1.5e+3", "1:30.0", "'0.1'"]
_Y11_STR = ["no", "off", "yes", "on", "null", "~", "Null", "NO", "true", "0", "1.0"]
_BOUNDARY = [0, -1, 1, 2, 2**31 - 1, 2**31, 2**32, 2**63, -0.1, 0.5, 1.0, 1.5, 1.0e30, -1.0e-9, 0.999999]
_STR_PLAIN = ["x", "/data/x", "some_value"]


def _kinds(spec: dict) -> list[str]:
    return [k for k in spec["kinds"] if k not in ("none", "other")] or ["str"]


def valid_value(rng: random.Random, spec: dict, current: Any = None) -> Any:
    choices = [c for c in spec.get("choices", []) if c is not None]
    if choices and rng.random() < 0.85:
        return rng.choice(choices)
    kind = rng.choice(_kinds(spec))
    if kind == "bool":
        return (not current) if isinstance(current, bool) else rng.choice([True, False])
    if kind == "int":
        return rng.choice([1, 2, 4, 8, 16, 64, 100, 512])
    if kind == "float":
        return rng.choice([0.0, 0.01, 0.1, 0.5, 1.0e-4, 2.0])
    if kind == "list":
        return rng.choice([["all"], ["q_proj", "v_proj"], ["a"]])
    if kind == "dict":
        return {"k": 1}
    return rng.choice(_STR_PLAIN)


def wrong_type_value(rng: random.Random, spec: dict) -> tuple[Any, str]:
    kinds = set(_kinds(spec))
    if "float" in kinds:
        kinds.add("int")
    others = [k for k in _WRONG if k not in kinds]
    kind = rng.choice(others)
    return copy.deepcopy(rng.choice(_WRONG[kind])), kind


def yaml11_value(rng: random.Random, spec: dict) -> Raw:
    kinds = set(_kinds(spec))
    if "bool" in kinds:
        pool = _Y11_BOOL
    elif "int" in kinds and "float" not in kinds:
        pool = _Y11_INT
    elif "float" in kinds:
        pool = _Y11_FLOAT
    else:
        pool = _Y11_STR
    return Raw(rng.choice(pool))


def spelling_variants(value: str) -> list[str]:
    out = [value.upper(), value.title(), value.lower(), " " + value, value + " ", " " + value + " ",
           value.replace("_", "-"), value + "x", ""]
    return [v for v in dict.fromkeys(out) if v != value]


def misspell(rng: random.Random, key: str) -> str:
    ops = [
        lambda k: k.upper(),
        lambda k: k[:1].upper() + k[1:],
        lambda k: k.replace("_", "-"),
        lambda k: k + "s",
        lambda k: k[:-1] if len(k) > 3 else k + "_",
        lambda k: " " + k,
        lambda k: k.replace("_", "", 1),
    ]
    for _ in range(5):
        new = rng.choice(ops)(key)
        if new != key:
            return new
    return key + "_x"


# ---------------------------------------------------------------- where keys live

def _section(recipe: dict, where: str) -> dict:
    if where == "train":
        return recipe.setdefault("train", {})
    if where == "kt_config":
        kc = recipe.setdefault("train", {}).get("kt_config")
        if not isinstance(kc, dict):
            kc = {}
            recipe["train"]["kt_config"] = kc
        return kc
    if where == "accelerate":
        return recipe.setdefault("accelerate", {})
    if where == "fsdp_config":
        fc = recipe.setdefault("accelerate", {}).get("fsdp_config")
        if not isinstance(fc, dict):
            fc = {}
            recipe["accelerate"]["fsdp_config"] = fc
        return fc
    raise KeyError(where)


_WHERE_WEIGHTS = [("train", 6), ("kt_config", 3), ("accelerate", 2), ("fsdp_config", 2)]


def _where(rng: random.Random) -> str:
    names, weights = zip(*_WHERE_WEIGHTS, strict=True)
    return rng.choices(names, weights)[0]


def _path(where: str, key: str) -> str:
    return {"train": "train", "kt_config": "train.kt_config", "accelerate": "accelerate",
            "fsdp_config": "accelerate.fsdp_config"}[where] + "." + key


def _show(value: Any) -> str:
    return str(value) if isinstance(value, Raw) else json.dumps(value)


def _set(recipe: dict, where: str, key: str, value: Any) -> str:
    _section(recipe, where)[key] = value
    return f"{_path(where, key)}={_show(value)}"


def _drop(recipe: dict, where: str, key: str) -> str:
    _section(recipe, where).pop(key, None)
    return f"drop {_path(where, key)}"


# ---------------------------------------------------------------- mutations (each returns its description)

Mutation = Callable[[random.Random, dict], str]


def m_valid(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    name, spec = _draw_field(rng, where)
    return _set(recipe, where, name, valid_value(rng, spec, _section(recipe, where).get(name)))


def m_wrong_type(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    name, spec = _draw_field(rng, where)
    value, kind = wrong_type_value(rng, spec)
    return _set(recipe, where, name, value) + f" (a {kind} for {'/'.join(_kinds(spec))})"


def m_yaml11(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    if rng.random() < 0.6:  # prefer keys already in the recipe: their meaning changes most
        present = [k for k in _section(recipe, where) if k in _fields()[where]]
        if present:
            name = rng.choice(sorted(present))
            spec = _fields()[where][name]
            return _set(recipe, where, name, yaml11_value(rng, spec)) + " (YAML 1.1 spelling)"
    name, spec = _draw_field(rng, where)
    return _set(recipe, where, name, yaml11_value(rng, spec)) + " (YAML 1.1 spelling)"


@functools.cache
def _choice_fields(where: str) -> tuple[str, ...]:
    return tuple(sorted(n for n, s in _fields()[where].items()
                        if any(isinstance(c, str) for c in s.get("choices", [])) and not _SKIP.search(n)))


@functools.cache
def _number_fields(where: str) -> tuple[str, ...]:
    return tuple(sorted(n for n, s in _fields()[where].items()
                        if {"int", "float"} & set(s["kinds"]) and not _SKIP.search(n)))


def m_spelling(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    if not _choice_fields(where):
        where = "train"
    present = [k for k in _section(recipe, where) if k in _choice_fields(where)]
    pool = present if present and rng.random() < 0.6 else _choice_fields(where)
    name = rng.choice(sorted(pool))
    spec = _fields()[where][name]
    current = _section(recipe, where).get(name)
    base = current if isinstance(current, str) else rng.choice([c for c in spec["choices"] if isinstance(c, str)])
    value = rng.choice(spelling_variants(base))
    if rng.random() < 0.3:
        value = Raw(json.dumps(value))  # the same text, double-quoted in the YAML
    return _set(recipe, where, name, value) + " (spelling variant)"


def m_boundary(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    nums = _number_fields(where)
    present = [n for n in nums if n in _section(recipe, where)]
    name = rng.choice(present if present and rng.random() < 0.6 else nums)
    return _set(recipe, where, name, rng.choice(_BOUNDARY)) + " (boundary)"


def m_list_scalar(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    section = _section(recipe, where)
    present = sorted(k for k in section if not isinstance(section[k], dict))
    if present and rng.random() < 0.7:
        name = rng.choice(present)
        value = section[name]
    else:
        name, spec = _draw_field(rng, where)
        value = valid_value(rng, spec)
    if isinstance(value, list):
        new: Any = rng.choice([", ".join(map(str, value)), ",".join(map(str, value)), value[0] if value else ""])
        what = "scalar for a list"
    else:
        new = rng.choice([[value], [value, value], []])
        what = "list for a scalar"
    return _set(recipe, where, name, new) + f" ({what})"


_REQUIRED = {
    "train": ["model_name_or_path", "stage", "do_train", "finetuning_type", "dataset", "template", "output_dir",
              "use_kt", "kt_config", "bf16", "cutoff_len", "dataset_dir", "lora_rank", "lora_target",
              "kt_weight_path", "kt_non_expert_weight_path", "disable_gradient_checkpointing"],
    "kt_config": ["kt_backend", "kt_expert_weight_format", "kt_share_backward_bb", "kt_weight_lifecycle",
                  "kt_num_gpu_experts", "kt_num_threads", "kt_threadpool_count", "kt_tp_enabled"],
    "accelerate": ["distributed_type", "num_processes", "fsdp_config", "compute_environment", "mixed_precision",
                   "num_machines", "use_cpu", "rdzv_backend", "same_network"],
    "fsdp_config": ["fsdp_version", "fsdp_auto_wrap_policy", "fsdp_state_dict_type", "fsdp_reshard_after_forward",
                    "fsdp_cpu_ram_efficient_loading", "fsdp_offload_params"],
}


def m_drop(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    section = _section(recipe, where)
    present = [k for k in _REQUIRED[where] if k in section] or sorted(section)
    if not present:
        return m_valid(rng, recipe)
    return _drop(recipe, where, rng.choice(present))


def m_misspell(rng: random.Random, recipe: dict) -> str:
    where = _where(rng)
    section = _section(recipe, where)
    keys = sorted(k for k in section if isinstance(k, str))
    if not keys:
        return m_valid(rng, recipe)
    old = rng.choice(keys)
    new = misspell(rng, old)
    section[new] = section.pop(old)
    return f"rename {_path(where, old)} -> {json.dumps(new)}"


def m_move(rng: random.Random, recipe: dict) -> str:
    """A key in the wrong section: kt_config keys at the top level or in accelerate, and the reverse."""
    train, kt = _section(recipe, "train"), _section(recipe, "kt_config")
    choice = rng.randrange(4)
    if choice == 0 and kt:
        k = rng.choice(sorted(kt))
        train[k] = kt.pop(k)
        return f"move train.kt_config.{k} to train.{k}"
    if choice == 1:
        k = rng.choice(["kt_weight_path", "kt_non_expert_weight_path", "kt_lora_rank", "kt_train_mode",
                        "kt_activation_policy", "kt_lora_alpha", "kt_use_lora_experts", "kt_expert_checkpoint_path"])
        v = train.get(k, {"kt_activation_policy": {"cpu": "recompute", "gpu": "recompute"}, "kt_train_mode": "lora",
                          "kt_lora_rank": 8, "kt_lora_alpha": 16, "kt_use_lora_experts": False}.get(k, "/data/models/w"))
        kt[k] = v
        return f"train.kt_config.{k}={_show(v)} (a key LlamaFactory derives)"
    if choice == 2:
        recipe["accelerate"]["kt_config"] = copy.deepcopy(kt)
        return "copy train.kt_config into accelerate.kt_config"
    k = rng.choice(["num_processes", "mixed_precision", "fsdp_version", "distributed_type"])
    train[k] = {"num_processes": 2, "mixed_precision": "bf16", "fsdp_version": 2, "distributed_type": "FSDP"}[k]
    return f"train.{k} (an accelerate key in the training YAML)"


# ---------------------------------------------------------------- cross-key scenarios

def s_eval(rng: random.Random, recipe: dict) -> str:
    t = recipe["train"]
    parts = []
    kind = rng.choice(["do_eval", "eval_strategy", "do_predict", "predict_with_generate", "both"])
    if kind in ("do_eval", "both"):
        parts.append(_set(recipe, "train", "do_eval", True))
    if kind in ("eval_strategy", "both"):
        parts.append(_set(recipe, "train", "eval_strategy", rng.choice(["steps", "epoch", "no", "best"])))
        if rng.random() < 0.5:
            parts.append(_set(recipe, "train", "eval_steps", rng.choice([10, 0, 0.1, 500])))
    if kind == "do_predict":
        parts.append(_set(recipe, "train", "do_predict", True))
    if kind == "predict_with_generate":
        parts.append(_set(recipe, "train", "predict_with_generate", True))
    data = rng.choice(["none", "none", "val_size", "eval_dataset", "val_size0"])
    if data == "val_size":
        parts.append(_set(recipe, "train", "val_size", rng.choice([0.1, 0.05, 100])))
    elif data == "val_size0":
        parts.append(_set(recipe, "train", "val_size", 0.0))
    elif data == "eval_dataset":
        parts.append(_set(recipe, "train", "eval_dataset", t.get("dataset", "your_dataset")))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "per_device_eval_batch_size", rng.choice([1, 0, 4])))
    return "eval: " + ", ".join(parts)


def s_best_model(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "train", "load_best_model_at_end", True)]
    if rng.random() < 0.7:
        parts.append(_set(recipe, "train", "eval_strategy", rng.choice(["steps", "epoch", "no"])))
    if rng.random() < 0.5:
        parts.append(_set(recipe, "train", "save_strategy", rng.choice(["steps", "epoch", "best", "no"])))
    if rng.random() < 0.5:
        parts.append(_set(recipe, "train", "eval_steps", rng.choice([100, 250, 0.5])))
    if rng.random() < 0.6:
        parts.append(_set(recipe, "train", "val_size", 0.1))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "metric_for_best_model", rng.choice(["loss", "eval_loss", "accuracy"])))
    return "best model: " + ", ".join(parts)


def s_streaming(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "train", "streaming", rng.choice([True, Raw("yes"), Raw("on")]))]
    choice = rng.choice(["none", "max_steps", "max_steps_neg", "val", "max_samples"])
    if choice == "max_steps":
        parts.append(_set(recipe, "train", "max_steps", rng.choice([100, 1000])))
    elif choice == "max_steps_neg":
        parts.append(_set(recipe, "train", "max_steps", -1))
    elif choice == "val":
        parts.append(_set(recipe, "train", "max_steps", 100))
        parts.append(_set(recipe, "train", "val_size", rng.choice([0.1, 10])))
    elif choice == "max_samples":
        parts.append(_set(recipe, "train", "max_steps", 100))
        parts.append(_set(recipe, "train", "max_samples", 1000))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "buffer_size", rng.choice([16384, 0])))
    return "streaming: " + ", ".join(parts)


def s_optimizers(rng: random.Random, recipe: dict) -> str:
    parts = []
    if rng.random() < 0.5:
        ft = rng.choice(["lora", "full", "freeze", "oft", "Lora"])
        parts.append(_set(recipe, "train", "finetuning_type", ft))
    which = rng.sample(["use_galore", "use_apollo", "use_badam"], rng.choice([1, 1, 2]))
    for w in which:
        parts.append(_set(recipe, "train", w, True))
        if rng.random() < 0.4:
            layer = {"use_galore": "galore_layerwise", "use_apollo": "apollo_layerwise", "use_badam": "badam_mode"}[w]
            parts.append(_set(recipe, "train", layer, "ratio" if w == "use_badam" else True))
    return "optimizer: " + ", ".join(parts)


def s_quantization(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "train", "quantization_bit", rng.choice([4, 8, 2, 3, 16]))]
    if rng.random() < 0.6:
        parts.append(_set(recipe, "train", "finetuning_type", rng.choice(["full", "lora", "freeze"])))
    if rng.random() < 0.4:
        parts.append(_set(recipe, "train", "quantization_method", rng.choice(["bnb", "hqq", "eetq", "gptq"])))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "quantization_device_map", "auto"))
    return "quantization: " + ", ".join(parts)


_FSDP1_ONLY = {
    "fsdp_sharding_strategy": ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", 1],
    "fsdp_use_orig_params": [True, False],
    "fsdp_backward_prefetch": ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"],
    "fsdp_forward_prefetch": [True, False],
    "fsdp_sync_module_states": [True, False],
    "fsdp_reshard_after_forward": ["FULL_SHARD", "SHARD_GRAD_OP", True, False, Raw("yes")],
    "fsdp_activation_checkpointing": [True, False],
    "fsdp_cpu_ram_efficient_loading": [True, False],
    "fsdp_offload_params": [True, False],
    "fsdp_state_dict_type": ["FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT", "full_state_dict"],
    "fsdp_auto_wrap_policy": ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", "transformer_based_wrap"],
    "fsdp_transformer_layer_cls_to_wrap": ["Qwen3MoeDecoderLayer", ""],
    "fsdp_min_num_params": [0, 100000000],
}


def s_fsdp_version(rng: random.Random, recipe: dict) -> str:
    parts = []
    v = rng.choice(["drop", "drop", 1, "1", "2", 2.0, Raw("'2'"), 3, 0, Raw("0x2"), 2])
    parts.append(_drop(recipe, "fsdp_config", "fsdp_version") if v == "drop"
                 else _set(recipe, "fsdp_config", "fsdp_version", v))
    for k in rng.sample(sorted(_FSDP1_ONLY), rng.choice([0, 1, 1, 2])):
        parts.append(_set(recipe, "fsdp_config", k, rng.choice(_FSDP1_ONLY[k])))
    return "fsdp: " + ", ".join(parts)


def s_fsdp_options(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "fsdp_config", k, rng.choice(_FSDP1_ONLY[k]))
             for k in rng.sample(sorted(_FSDP1_ONLY), rng.choice([1, 2, 3]))]
    return "fsdp options: " + ", ".join(parts)


def s_distributed(rng: random.Random, recipe: dict) -> str:
    types = catalog()["accelerate"]["distributed_types"]
    dt = rng.choice(types + ["fsdp", "Fsdp", " FSDP", "FSDP2", "fsdp2", "MULTI_GPU", "NO", "DEEPSPEED"])
    parts = [_set(recipe, "accelerate", "distributed_type", dt)]
    if rng.random() < 0.5:
        n = rng.choice([1, 2, 4])
        parts.append(_set(recipe, "accelerate", "num_processes", n))
        if rng.random() < 0.7:
            recipe.setdefault("deploy", {})["gpus"] = list(range(n))
            parts.append(f"deploy.gpus={json.dumps(list(range(n)))}")
    if rng.random() < 0.25:
        parts.append(_drop(recipe, "accelerate", "fsdp_config"))
    return "distributed: " + ", ".join(parts)


def s_processes(rng: random.Random, recipe: dict) -> str:
    parts = []
    n = rng.choice([0, 1, 2, 3, 4, 8, -1, Raw("'2'"), Raw("2.0")])
    parts.append(_set(recipe, "accelerate", "num_processes", n))
    if rng.random() < 0.6 and isinstance(n, int) and 0 < n <= 8:
        recipe.setdefault("deploy", {})["gpus"] = list(range(n))
        parts.append(f"deploy.gpus={json.dumps(list(range(n)))}")
    if rng.random() < 0.3:
        parts.append(_set(recipe, "accelerate", "num_machines", rng.choice([1, 2, 0])))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "accelerate", "gpu_ids", rng.choice(["all", "0", "0,1", Raw("0,1")])))
    return "processes: " + ", ".join(parts)


def s_mixed_precision(rng: random.Random, recipe: dict) -> str:
    parts = []
    mp = rng.choice(catalog()["accelerate"]["mixed_precision"] + ["BF16", " bf16", "bfloat16", Raw("no")])
    parts.append(_set(recipe, "accelerate", "mixed_precision", mp))
    if rng.random() < 0.5:
        parts.append(_set(recipe, "train", "bf16", rng.choice([True, False])))
    if rng.random() < 0.4:
        parts.append(_set(recipe, "train", "fp16", rng.choice([True, False])))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "pure_bf16", True))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "accelerate", "downcast_bf16", rng.choice(["no", Raw("no"), True, False])))
    return "precision: " + ", ".join(parts)


def s_kt_combo(rng: random.Random, recipe: dict) -> str:
    cat = catalog()
    t = recipe["train"]
    parts = []
    pool: dict[str, Callable[[], str]] = {
        "format": lambda: _set(recipe, "kt_config", "kt_expert_weight_format",
                               rng.choice(cat["kt_expert_weight_formats"] + ["BF16", " int8", "Int8", "fp16", "FP8 "])),
        "backend": lambda: _set(recipe, "kt_config", "kt_backend",
                                rng.choice(cat["kt_backends"] + ["AMXINT8", "INT8", "FP8", "AMXBF16", " auto", "Auto",
                                                                 "BF16", "AMXINT4", "amxint4 ", "llamafile"])),
        "lifecycle": lambda: _set(recipe, "kt_config", "kt_weight_lifecycle",
                                  rng.choice(["persistent", "ephemeral", "Ephemeral", " persistent", "EPHEMERAL",
                                              "transient"])),
        "gpu_experts": lambda: _set(recipe, "kt_config", "kt_num_gpu_experts", rng.choice([0, 1, 4, -1])),
        "share_bb": lambda: _set(recipe, "kt_config", "kt_share_backward_bb", rng.choice([True, False])),
        "lora_experts": lambda: _set(recipe, "train", "kt_use_lora_experts", rng.choice([True, False])),
        "weight_path": lambda: (_set(recipe, "train", "kt_weight_path",
                                     rng.choice([t.get("model_name_or_path", "/data/models/m"),
                                                 "/data/models/converted-kt"]))
                                if rng.random() < 0.7 else _drop(recipe, "train", "kt_weight_path")),
        "non_expert": lambda: (_set(recipe, "train", "kt_non_expert_weight_path", "/data/models/non-expert-bf16")
                               if rng.random() < 0.7 else _drop(recipe, "train", "kt_non_expert_weight_path")),
        "expert_ckpt": lambda: _set(recipe, "train", "kt_expert_checkpoint_path",
                                    rng.choice([t.get("model_name_or_path", "/data/models/m"), "/data/ckpt/full"])),
        "full": lambda: _set(recipe, "train", "finetuning_type", "full"),
        "lora_rank": lambda: _set(recipe, "train", "lora_rank", rng.choice([0, 4, 8, 16, -1])),
        "fused": lambda: _set(recipe, "kt_config", "kt_force_fused_expert_lora", rng.choice([True, False])),
        "tp": lambda: _set(recipe, "kt_config", "kt_threadpool_count", rng.choice([1, 2, 3, 4, 0])),
        "lora_dropout": lambda: _set(recipe, "train", "lora_dropout", rng.choice([0.0, 0.05, 1.0, -0.1])),
    }
    for name in rng.sample(sorted(pool), rng.choice([1, 2, 2, 3, 4])):
        parts.append(pool[name]())
    return "kt: " + ", ".join(parts)


def s_activation(rng: random.Random, recipe: dict) -> str:
    parts = []
    if rng.random() < 0.7:
        parts.append(_set(recipe, "train", "kt_cpu_activation",
                          rng.choice(["retain", "recompute", "Retain", " retain", "keep", None])))
    if rng.random() < 0.6:
        parts.append(_set(recipe, "train", "disable_gradient_checkpointing", rng.choice([True, False, Raw("yes")])))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "gradient_checkpointing", rng.choice([True, False])))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "gradient_checkpointing_kwargs", {"use_reentrant": False}))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "fsdp_config", "fsdp_activation_checkpointing", True))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "kt_config", "kt_backend", rng.choice(["AMXINT4", "AMXBF16_SkipLoRA", "auto"])))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "kt_config", "kt_num_gpu_experts", rng.choice([0, 2])))
    return "activation: " + (", ".join(parts) or _set(recipe, "train", "kt_cpu_activation", "retain"))


def s_features(rng: random.Random, recipe: dict) -> str:
    options: list[tuple[str, Any]] = [
        ("report_to", "all"), ("report_to", ["none"]), ("report_to", "none"), ("report_to", Raw("none")),
        ("report_to", Raw("no")), ("flash_attn", "fa2"), ("flash_attn", "sdpa"), ("flash_attn", "auto"), ("flash_attn", "disabled"),
        ("optim", "adamw_bnb_8bit"), ("optim", "adamw_torch"), ("optim", "adamw_torch_fused"), ("optim", "galore_adamw"),
        ("optim", "adamw_8bit"), ("optim", "sgd"), ("optim", "adamw"), ("lr_scheduler_type", "cosine_with_restarts"),
        ("lr_scheduler_type", "reduce_lr_on_plateau"), ("lr_scheduler_type", "warmup_stable_decay"),
        ("mixture_of_depths", "convert"), ("infer_backend", "vllm"), ("use_llama_pro", True), ("use_dora", True),
        ("use_rslora", True), ("pissa_init", True), ("loraplus_lr_ratio", 16.0), ("deepspeed", "/data/ds_z3.json"),
        ("shift_attn", True), ("rope_scaling", "linear"), ("use_reentrant_gc", False), ("compute_accuracy", True),
        ("plot_loss", Raw("off")), ("neat_packing", True), ("packing", True), ("train_on_prompt", True),
        ("mask_history", True), ("torch_compile", True), ("tf32", True), ("fp8", True), ("include_tokens_per_second", True),
        ("adapter_name_or_path", "/data/output/adapter"), ("create_new_adapter", True), ("resize_vocab", True),
        ("new_special_tokens_config", "/data/x.yaml"), ("add_tokens", "<a>,<b>"), ("max_grad_norm", 0.0),
        ("enable_thinking", False), ("tokenized_path", "/data/tok"), ("freeze_vision_tower", False),
    ]
    picks = rng.sample(options, rng.choice([1, 1, 2]))
    parts = [_set(recipe, "train", k, copy.deepcopy(v)) for k, v in picks]
    return "feature: " + ", ".join(parts)


def s_packages(rng: random.Random, recipe: dict) -> str:
    """Features that need a package of their own (the image may not hold it)."""
    options: list[tuple[str, Any]] = [
        ("enable_liger_kernel", True), ("use_adam_mini", True), ("use_swanlab", True), ("use_unsloth", True),
        ("use_unsloth_gc", True), ("report_to", "wandb"), ("report_to", "tensorboard"), ("report_to", "swanlab"),
        ("report_to", "mlflow"), ("report_to", ["wandb", "tensorboard"]), ("report_to", "trackio"),
        ("optim", "adamw_bnb_8bit"), ("optim", "galore_adamw"), ("optim", "apollo_adamw"), ("optim", "lomo"),
        ("quantization_bit", 4), ("mixture_of_depths", "load"), ("deepspeed", "/data/ds_z2.json"),
        ("use_galore", True), ("use_apollo", True), ("use_badam", True), ("predict_with_generate", True),
    ]
    picks = rng.sample(options, rng.choice([1, 1, 2]))
    parts = [_set(recipe, "train", k, copy.deepcopy(v)) for k, v in picks]
    if rng.random() < 0.4:
        parts.append(_set(recipe, "train", "finetuning_type", rng.choice(["full", "freeze", "lora"])))
    return "package: " + ", ".join(parts)


def s_kt_config_shape(rng: random.Random, recipe: dict) -> str:
    t = recipe["train"]
    choice = rng.randrange(7)
    if choice == 0:
        t["kt_config"] = Raw('"{\\"kt_backend\\": \\"auto\\"}"')
        return 'train.kt_config="{...}" (a JSON string)'
    if choice == 1:
        t["kt_config"] = [copy.deepcopy(t.get("kt_config") or {})]
        return "train.kt_config as a list"
    if choice == 2:
        return _set(recipe, "train", "use_kt", rng.choice([False, Raw("no"), Raw("off")])) + " (with kt_config kept)"
    if choice == 3:
        return _set(recipe, "train", "use_kt", rng.choice([Raw("yes"), Raw("on"), "true", Raw("'true'"), 1, Raw("y")]))
    if choice == 4:
        t["kt_config"] = None
        return "train.kt_config=null"
    if choice == 5:
        t["kt_config"] = {}
        return "train.kt_config={}"
    return _set(recipe, "kt_config", "enabled", rng.choice([True, False, "yes", Raw("yes")]))


def s_steps(rng: random.Random, recipe: dict) -> str:
    parts = []
    for k in rng.sample(["save_steps", "logging_steps", "eval_steps", "warmup_steps", "max_steps",
                         "save_total_limit", "warmup_ratio"], rng.choice([1, 2])):
        parts.append(_set(recipe, "train", k, rng.choice([0, 0.5, 1.5, 1, -1, 10, "10", 1.0e-3, 0.1, -0.1])))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "save_strategy", rng.choice(["steps", "epoch", "no", "best", Raw("no")])))
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "logging_strategy", rng.choice(["steps", "epoch", "no"])))
    return "steps: " + ", ".join(parts)


def s_sizes(rng: random.Random, recipe: dict) -> str:
    options = {
        "cutoff_len": [0, -1, 1, 7, 131072, 2**31],
        "per_device_train_batch_size": [0, -1, 1, 3, 64],
        "gradient_accumulation_steps": [0, -1, 1, 3],
        "num_train_epochs": [0, -1, 0.5, 1.0e3],
        "learning_rate": [0, -1.0e-4, 1.0, 1.0e-4, "1e-4", Raw("1e-4"), Raw("1.0e-4")],
        "preprocessing_num_workers": [0, -1, 1, 512],
        "dataloader_num_workers": [0, -1, 2],
        "seed": [0, -1, 2**32 - 1, 2**32, 42],
        "ddp_timeout": [0, -1, 180000000, 2**63],
        "max_samples": [0, -1, 10],
    }
    parts = [_set(recipe, "train", k, rng.choice(options[k])) for k in rng.sample(sorted(options), rng.choice([1, 2]))]
    if rng.random() < 0.3:
        parts.append(_set(recipe, "kt_config", "kt_model_max_length",
                          rng.choice([0, -1, 512, 2176, "2048", 2.5, 2**31])))
    return "sizes: " + ", ".join(parts)


def s_kt_numbers(rng: random.Random, recipe: dict) -> str:
    options = {
        "kt_num_threads": [0, -1, 1, 64, 1024, "64", 2.0],
        "kt_threadpool_count": [0, -1, 1, 2, 3, 16],
        "kt_max_cache_depth": [0, -1, 1, 2, 64],
        "kt_num_gpu_experts": [0, 1, -1, 8],
        "kt_tp_enabled": [True, False, Raw("yes"), "true", 1],
        "kt_share_backward_bb": [True, False, Raw("off"), "false", 0],
        "kt_share_cache_pool": [True, False],
        "kt_force_fused_expert_lora": [True, False, Raw("on")],
        "kt_checkpoint_files": [["/data/models/m/model-00001.safetensors"], None],
        "kt_wrap_kwargs": [{"x": 1}, None],
        "kt_sharded_metadata": [{"weight_map": {}}],
        "kt_skip_expert_loading": [True, False],
        "kt_lora_expert_num": [0, 2, -1],
        "kt_lora_expert_intermediate_size": [0, 1024, -1],
        "kt_full_weight_grad": [True, False],
        "kt_unknown_field": [1],
    }
    parts = []
    for k in rng.sample(sorted(options), rng.choice([1, 2])):
        v = rng.choice(options[k])
        parts.append(_drop(recipe, "kt_config", k) if v is None else _set(recipe, "kt_config", k, copy.deepcopy(v)))
    return "kt numbers: " + ", ".join(parts)


def s_lora(rng: random.Random, recipe: dict) -> str:
    options = {
        "lora_rank": [0, -1, 1, 8, 8.0, "8", Raw("0x8")],
        "lora_alpha": [0, 16, 16.5, -1, "16"],
        "lora_dropout": [0.0, 0.1, 1.0, -0.1, 1.5],
        "lora_target": ["all", ["q_proj", "v_proj"], "q_proj, v_proj", "", [], ["all"], "ALL"],
        "additional_target": ["embed_tokens", ["lm_head"]],
        "finetuning_type": ["lora", "full", "freeze", "oft", "LoRA", " lora", "qlora"],
    }
    parts = [_set(recipe, "train", k, copy.deepcopy(rng.choice(options[k])))
             for k in rng.sample(sorted(options), rng.choice([1, 2]))]
    return "lora: " + ", ".join(parts)


def s_stage(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "train", "stage", rng.choice(["sft", "pt", "rm", "ppo", "dpo", "kto", "SFT", " sft"]))]
    if rng.random() < 0.4:
        parts.append(_set(recipe, "train", "do_train", rng.choice([False, Raw("no"), "true"])))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "reward_model", "/data/models/rm"))
    if rng.random() < 0.3:
        parts.append(_set(recipe, "train", "pref_loss", rng.choice(["sigmoid", "orpo", "simpo", "hinge"])))
    return "stage: " + ", ".join(parts)


def s_output(rng: random.Random, recipe: dict) -> str:
    t = recipe["train"]
    choice = rng.randrange(5)
    if choice == 0:
        return _set(recipe, "train", "overwrite_output_dir", rng.choice([True, Raw("yes")]))
    if choice == 1:
        return _set(recipe, "train", "output_dir", t.get("model_name_or_path", "/data/models/m"))
    if choice == 2:
        return _set(recipe, "train", "resume_from_checkpoint",
                    rng.choice([str(t.get("output_dir", "/data/output/x")) + "/checkpoint-500", "true", True, "/tmp/x"]))
    if choice == 3:
        return _set(recipe, "train", "output_dir", rng.choice(["", "relative/out", "~/out", "/data/output/a b"]))
    return _set(recipe, "train", "save_only_model", rng.choice([True, Raw("yes")]))


def s_accelerate_misc(rng: random.Random, recipe: dict) -> str:
    options: dict[str, list] = {
        "compute_environment": ["LOCAL_MACHINE", "AMAZON_SAGEMAKER", "local_machine", " LOCAL_MACHINE"],
        "use_cpu": [True, False, Raw("no"), "false"],
        "rdzv_backend": ["static", "c10d", "etcd", "STATIC"],
        "same_network": [True, False, Raw("yes")],
        "main_training_function": ["main", ""],
        "machine_rank": [0, 1],
        "main_process_port": [0, 29500, -1, 70000],
        "debug": [True, False],
        "enable_cpu_affinity": [True, False],
        "dynamo_config": [{"dynamo_backend": "INDUCTOR"}, {"dynamo_backend": "NO"}, {"dynamo_backend": "bogus"}],
        "downcast_bf16": ["no", Raw("no"), False, True],
        "tpu_use_cluster": [True, False],
        "parallelism_config": [{"parallelism_config_dp_shard_size": 2}],
        "deepspeed_config": [{"zero_stage": 3}],
        "megatron_lm_config": [{"megatron_lm_tp_degree": 2}],
        "fp8_config": [{"backend": "TE"}],
        "mpirun_config": [{"mpirun_ccl": 1}],
        "unknown_accelerate_key": [1],
    }
    parts = [_set(recipe, "accelerate", k, copy.deepcopy(rng.choice(options[k])))
             for k in rng.sample(sorted(options), rng.choice([1, 2]))]
    return "accelerate: " + ", ".join(parts)


# ---------------------------------------------------------------- issue 49: what bites after the arguments parse
#
# Values come from the stack catalogue (argument choices, the metadata choices transformers lists) and, for the
# model-dependent classes, from the model's config.json (recipes/models/<basename of model_name_or_path>.json, the
# same file the judge builds the model from) and the module names the real architecture has (the catalogue's
# model_modules, written in the image by building each config.json on the meta device).

MODELS_DIR = REPO / "recipes" / "models"
# Description prefixes of the classes whose verdict depends on the model (module names, dimensions, layout): plain
# `check` is judged on the other cases; `check --stack` with the config.json given is judged on these.
MODEL_DEPENDENT = ("modules: ", "kt dims: ", "model: ")


@functools.cache
def model_config(stem: str) -> dict:
    """A config.json of recipes/models (keys starting with '_' are our notes, not the model's)."""
    data = json.loads((MODELS_DIR / f"{stem}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def model_stems() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def model_stem_of(recipe: dict) -> str | None:
    """The config.json a recipe's model resolves to (basename of model_name_or_path), if recipes/models has it."""
    name = str((recipe.get("train") or {}).get("model_name_or_path", "")).rstrip("/").split("/")[-1]
    return name if name and (MODELS_DIR / f"{name}.json").is_file() else None


def _text(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def modules_known(stem: str | None) -> bool:
    """Whether the catalogue has the module names of this config.json (an architecture transformers builds)."""
    return bool(stem) and "linear" in catalog().get("model_modules", {}).get(stem, {})


def model_modules(stem: str) -> dict[str, list[str]]:
    """The module names the architecture builds (catalogue, extracted in the image): ``linear`` (leaf names of the
    Linear-class modules, what LlamaFactory's "all" finds) and ``names`` (every leaf module name)."""
    mods = catalog().get("model_modules", {})
    if "linear" not in mods.get(stem, {}):
        raise KeyError(f"stack_catalog.json has no model_modules for {stem}: rerun extract_stack_catalog.py")
    return mods[stem]


def _names_lacking(stem: str) -> list[str]:
    """Module names other architectures have and this one lacks (the realistic wrong guesses)."""
    own = set(model_modules(stem)["names"])
    other: set[str] = set()
    for s, m in catalog().get("model_modules", {}).items():
        if s != stem:
            other |= set(m.get("linear", []))
    return sorted(other - own) or ["query_key_value", "c_attn", "W_pack"]


def _mangle(rng: random.Random, name: str) -> str:
    return rng.choice([name.upper(), name + "s", name.replace("_", ""), name.replace("_", "-"), name[:-1],
                       "model." + name + ".weight", name + "_x"])


def s_lora_target_null(rng: random.Random, recipe: dict) -> str:
    """lora_target: null (LlamaFactory keeps None; adapter setup takes its len() after the weights load)."""
    parts = [_set(recipe, "train", "lora_target", rng.choice([None, None, Raw("~"), Raw("null"), Raw("Null")]))]
    if rng.random() < 0.25:
        parts.append(_set(recipe, "train", "finetuning_type", rng.choice(["lora", "full", "freeze"])))
    return "lora null: " + ", ".join(parts)


def s_full_adapter_flags(rng: random.Random, recipe: dict) -> str:
    """LoRA-only flags on a full/freeze fine-tune, or on LoRA (where they are allowed)."""
    parts = []
    if recipe["train"].get("finetuning_type") != "full" or rng.random() < 0.3:
        parts.append(_set(recipe, "train", "finetuning_type", rng.choice(["full", "full", "freeze", "lora"])))
    flags = rng.sample(["use_dora", "use_rslora", "pissa_init", "loraplus_lr_ratio"], rng.choice([1, 1, 2]))
    for f in flags:
        value = 16.0 if f == "loraplus_lr_ratio" else rng.choice([True, True, Raw("yes"), False])
        parts.append(_set(recipe, "train", f, value))
    return "adapter flags: " + ", ".join(parts)


def s_prefetch(rng: random.Random, recipe: dict) -> str:
    parts = [_set(recipe, "train", "dataloader_prefetch_factor", rng.choice([1, 2, 4, 0, None]))]
    workers = rng.choice(["keep", "drop", 0, 0, 2, 4, Raw("'0'")])
    if workers == "drop":
        parts.append(_drop(recipe, "train", "dataloader_num_workers"))
    elif workers != "keep":
        parts.append(_set(recipe, "train", "dataloader_num_workers", workers))
    return "prefetch: " + ", ".join(parts)


def _ddp_backends() -> list[str]:
    spec = _fields()["train"]["ddp_backend"]
    return list(spec.get("meta_choices") or spec.get("choices") or [])


def s_ddp_backend(rng: random.Random, recipe: dict) -> str:
    known = _ddp_backends()
    pool = known + ["NCCL", " nccl", "nccl ", "Gloo", "cuda:nccl,cpu:gloo", "cpu:gloo,cuda:nccl", "ucc", "smddp",
                    "fake", "nccl2", "tcp", "cuda:nccl", "cuda:gloo"]
    parts = [_set(recipe, "train", "ddp_backend", rng.choice(pool))]
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "ddp_timeout", rng.choice([60, 1800])))
    return "ddp backend: " + ", ".join(parts)


def s_infer_backend(rng: random.Random, recipe: dict) -> str:
    choices = [c for c in _fields()["train"]["infer_backend"]["choices"] if isinstance(c, str)]
    value = rng.choice(choices + choices + [rng.choice(spelling_variants(rng.choice(choices)))])
    return "infer backend: " + _set(recipe, "train", "infer_backend", value)


def _target_value(rng: random.Random, stem: str, kind: str) -> tuple[Any, str]:
    """A module-name value for lora_target/additional_target: (value, what it names)."""
    mods = model_modules(stem)
    has = mods["linear"] if kind == "lora" else mods["names"]
    lacks = _names_lacking(stem)
    choice = rng.choice(["present", "present", "absent", "absent", "mixed", "mangled", "expert"])
    if choice == "present":
        names = rng.sample(has, min(len(has), rng.choice([1, 1, 2, 3])))
    elif choice == "absent":
        names = rng.sample(lacks, min(len(lacks), rng.choice([1, 1, 2])))
    elif choice == "mixed":
        names = [rng.choice(has), rng.choice(lacks)]
    elif choice == "mangled":
        names = [_mangle(rng, rng.choice(has))]
    else:  # the routed experts' own names: KT owns those modules
        names = rng.sample(["gate_proj", "up_proj", "down_proj", "experts", "gate", "shared_experts",
                            "shared_expert"], rng.choice([1, 2]))
    shape = rng.choice(["list", "comma", "one"]) if len(names) > 1 else rng.choice(["one", "list"])
    value: Any = names if shape == "list" else (",".join(names) if shape == "comma" else names[0])
    return value, choice


def s_modules(rng: random.Random, recipe: dict) -> str:
    """lora_target / additional_target / modules_to_save naming modules the model has or lacks (model-dependent)."""
    stem = model_stem_of(recipe)
    if not modules_known(stem):
        return s_lora_target_null(rng, recipe)
    parts = []
    key = rng.choice(["lora_target", "lora_target", "additional_target", "additional_target", "modules_to_save"])
    value, what = _target_value(rng, stem, "lora" if key == "lora_target" else "any")
    parts.append(_set(recipe, "train", key, value) + f" ({what} in {stem})")
    if rng.random() < 0.2:
        parts.append(_set(recipe, "train", "finetuning_type", rng.choice(["lora", "full"])))
    return "modules: " + ", ".join(parts)


def s_kt_dims(rng: random.Random, recipe: dict) -> str:
    """kt-kernel's thread pools against the model's dimensions (FP8/RAWINT4 slices, pool/thread counts)."""
    stem = model_stem_of(recipe)
    cfg = _text(model_config(stem)) if stem else {}
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 1024)
    divisors = [d for d in (1, 2, 3, 4, 6, 8, 12, 16, 32) if inter % d == 0]
    non = [d for d in (3, 5, 6, 7, 12) if inter % d]
    slice_edge = [max(1, inter // 128), inter // 128 * 2 or 2, max(1, inter // 32), max(1, inter // 64)]
    tp = rng.choice(divisors + non + slice_edge + [0, -1])
    parts = [_set(recipe, "kt_config", "kt_threadpool_count", tp)]
    if rng.random() < 0.6:
        parts.append(_set(recipe, "kt_config", "kt_tp_enabled", rng.choice([True, True, False])))
    if rng.random() < 0.5:
        threads = rng.choice([1, max(1, abs(tp)), max(1, abs(tp)) * 2, 64, max(0, abs(tp) - 1), 0, -4])
        parts.append(_set(recipe, "kt_config", "kt_num_threads", threads))
    if rng.random() < 0.3:
        fmt = rng.choice(["fp8", "rawint4", "bf16", "int8"])
        parts.append(_set(recipe, "kt_config", "kt_expert_weight_format", fmt))
        parts.append(_set(recipe, "kt_config", "kt_backend", "auto"))
    return f"kt dims: ({stem}: moe_intermediate_size={inter}) " + ", ".join(parts)


def s_swap_model(rng: random.Random, recipe: dict) -> str:
    """The recipe pointed at another architecture's config.json (expert layout, FP8 metadata, module names)."""
    t = recipe["train"]
    old = str(t.get("model_name_or_path", "/data/models/m"))
    parent = old.rstrip("/").rsplit("/", 1)[0] or "/data/models"
    stem = rng.choice([s for s in model_stems() if s != model_stem_of(recipe)])
    parts = [_set(recipe, "train", "model_name_or_path", f"{parent}/{stem}")]
    if rng.random() < 0.4 and modules_known(stem):
        parts.append(_set(recipe, "train", "lora_target", rng.choice(model_modules(stem)["linear"])))
    return "model: " + ", ".join(parts)


MUTATIONS_49: list[tuple[Mutation, int]] = [
    (s_lora_target_null, 5), (s_full_adapter_flags, 5), (s_prefetch, 5), (s_ddp_backend, 5), (s_infer_backend, 4),
    (s_modules, 12), (s_kt_dims, 8), (s_swap_model, 6),
]


MUTATIONS: list[tuple[Mutation, int]] = [
    (m_valid, 10), (m_wrong_type, 8), (m_yaml11, 8), (m_spelling, 7), (m_boundary, 6), (m_list_scalar, 4),
    (m_drop, 6), (m_misspell, 3), (m_move, 3),
    (s_eval, 5), (s_best_model, 2), (s_streaming, 3), (s_optimizers, 3), (s_quantization, 3), (s_fsdp_version, 4),
    (s_fsdp_options, 3), (s_distributed, 4), (s_processes, 2), (s_mixed_precision, 3), (s_kt_combo, 9),
    (s_activation, 4), (s_features, 4), (s_packages, 4), (s_kt_config_shape, 3), (s_steps, 3), (s_sizes, 4), (s_kt_numbers, 5),
    (s_lora, 3), (s_stage, 2), (s_output, 2), (s_accelerate_misc, 3),
]


PROFILES = {"v1": MUTATIONS, "issue49": MUTATIONS + MUTATIONS_49}


def mutation_names(profile: str = "v1") -> list[str]:
    return [m.__name__ for m, _ in PROFILES[profile]]


def model_dependent(description: str) -> bool:
    """Whether a case's changes include a model-dependent class (its verdict needs the model's config.json)."""
    return any(part.startswith(MODEL_DEPENDENT) for part in description.split(": ", 1)[-1].split(" | "))


# ---------------------------------------------------------------- cases

def _fingerprint(recipe: dict) -> str:
    return hashlib.sha256(dump_recipe(recipe).encode()).hexdigest()


def _one(seed: int, i: int, bases: dict[str, dict], attempt: int, profile: str = "v1") -> tuple[str, dict, str]:
    rng = random.Random(f"ktdeploy-oracle-independent:{seed}:{i}:{attempt}")
    base_name = rng.choice(sorted(bases))
    recipe = copy.deepcopy(bases[base_name])
    funcs, weights = zip(*PROFILES[profile], strict=True)
    k = rng.choice([1, 1, 2, 2, 3, 4])
    descs = []
    for _ in range(k):
        op = rng.choices(funcs, weights)[0]
        descs.append(op(rng, recipe))
    return f"s{seed}-{i:05d}", recipe, f"{base_name}: " + " | ".join(descs)


def cases(seed: int, n: int = 2500, profile: str = "v1") -> list[tuple[str, dict, str]]:
    """``n`` distinct recipe variants for ``seed``: ``(case_id, recipe_dict, description)``; deterministic.

    ``profile`` "v1" is the mutation set seed 20261204 was recorded with; "issue49" adds the tiny recipes as bases
    and issue 49's classes (MUTATIONS_49: lora_target null, LoRA-only flags on full tuning, prefetch without
    workers, ddp_backend, infer_backend, module names, kt-kernel dimensions, another architecture)."""
    bases = base_recipes(profile)
    seen = {_fingerprint(b) for b in bases.values()}  # an unchanged shipped recipe is not a case
    out = []
    for i in range(n):
        for attempt in range(50):
            case_id, recipe, desc = _one(seed, i, bases, attempt, profile)
            fp = _fingerprint(recipe)
            if fp not in seen:
                seen.add(fp)
                out.append((case_id, recipe, desc))
                break
        else:  # pragma: no cover - 50 collisions in a row would mean the mutation pool is broken
            raise RuntimeError(f"case {i}: no new variant in 50 attempts")
    return out


if __name__ == "__main__":  # quick look: python -m tests.oracle.independent_gen [SEED] [N]
    import sys

    s = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    for cid, _rec, d in cases(s, count):
        print(cid, d)
