"""The stack's own argument conditions, evaluated on the recipe: plain ``check`` refuses what they refuse.

The conditions are not written here: tools/gen_arg_conditions.py reads them from the locked wheels
(transformers' ``TrainingArguments._validate_args``, LlamaFactory's ``FinetuningArguments`` / ``DataArguments``
``__post_init__`` and ``get_train_args`` / ``_verify_model_args``) into catalog_data.ARG_CONDITIONS: each an ``and`` of
(field, op, literal) and the message the stack raises. This module only evaluates them, on the value the stack
receives (the recipe's, else the dataclass default), and quotes the stack's message.

Registered into rules.RULES by rules.py after rules_stack's rules: a condition whose keys another rule already
refused is not reported twice.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ktdeploy.core.recipe import catalog_data as cd
from ktdeploy.core.recipe.rules_base import Ctx, RuleSet

rule = RuleSet()

_UNKNOWN = object()
_ORDER: dict[str, Callable[[Any, Any], bool]] = {">": operator.gt, "<": operator.lt, ">=": operator.ge,
                                                 "<=": operator.le}


def _value(ctx: Ctx, key: str) -> Any:
    if key in ctx.t:
        return ctx.t[key]
    return cd.TRAIN_DEFAULTS.get(key, _UNKNOWN)


def holds(op: str, value: Any, literal: Any) -> bool | None:
    """One atom as the stack evaluates it; None when the stack would not get that far (a string compared with a
    number raises TypeError there, which is another refusal) or the value is not known."""
    if value is _UNKNOWN:
        return None
    if op == "truthy":
        return bool(value)
    if op == "falsy":
        return not value
    if op == "is None":
        return value is None
    if op == "is not None":
        return value is not None
    if op == "==":
        return bool(value == literal)
    if op == "!=":
        return bool(value != literal)
    if op in ("in", "not in"):
        inside = any(value == x for x in literal)
        return inside if op == "in" else not inside
    if not isinstance(value, (int, float)):
        return None
    return _ORDER[op](value, literal)


def atom_holds(ctx: Ctx, key: str, op: str, literal: Any) -> bool | None:
    """One atom on the recipe: a ``field <op>`` atom compares with the other field's value (as the stack receives
    it), any other with its literal."""
    if op.startswith("field "):
        other = _value(ctx, literal)
        return None if other is _UNKNOWN else holds(op.removeprefix("field "), _value(ctx, key), other)
    return holds(op, _value(ctx, key), literal)


def _names(atoms: tuple[tuple[str, str, Any], ...]) -> list[str]:
    """The fields a condition reads: each atom's, and the other field of a ``field <op>`` atom."""
    out = [key for key, _op, _lit in atoms]
    return out + [lit for _key, op, lit in atoms if op.startswith("field ") and lit not in out]


def _fix(ctx: Ctx, atoms: tuple[tuple[str, str, Any], ...], first: str) -> str:
    """How to make the condition false: one way per key the recipe sets, the reported key's first."""
    ways = []
    for key, op, literal in sorted(atoms, key=lambda a: a[0] != first and a[2] != first):
        if op.startswith("field ") and (key in ctx.t or literal in ctx.t):
            a, b = (literal, key) if literal == first else (key, literal)
            ways.append(f"change {a} or {b} (the stack refuses {key} {op.removeprefix('field ')} {literal})")
            continue
        if key not in ctx.t:
            continue
        if op in ("truthy", "is not None"):
            ways.append(f"remove {key}")
        elif op == "!=":
            ways.append(f"set {key}: {literal} (or remove it)")
        elif op == "not in":
            ways.append(f"set {key} to one of {', '.join(map(str, literal))}")
        elif op in ("==", "in", "is None", "falsy"):
            ways.append(f"change {key}")
        else:
            ways.append(f"change {key} (the stack refuses {key} {op} {literal})")
    return " or ".join(ways) or "change the keys the message names"


def _blame(ctx: Ctx, atoms: tuple[tuple[str, str, Any], ...], message: str) -> str:
    """The key to report on: the first the message names among those the recipe sets, else the last it sets."""
    keys = _names(atoms)
    set_keys = [k for k in keys if k in ctx.t]
    named = sorted((k for k in set_keys if k in message), key=message.index)
    return named[0] if named else (set_keys or keys)[-1]


def lora_only_refused(ctx: Ctx) -> set[str]:
    """Keys a LoRA-only condition (one with `finetuning_type != 'lora'`) refuses in this recipe."""
    out = set()
    for atoms, _message, _where in cd.ARG_CONDITIONS:
        if ("finetuning_type", "!=", "lora") in atoms and \
                all(atom_holds(ctx, key, op, lit) is True for key, op, lit in atoms):
            out |= {key for key, _op, _lit in atoms if key != "finetuning_type"}
    return out


@rule("lf.conditions")
def lf_conditions(ctx: Ctx) -> None:
    """The stack's argument checks that are a conjunction of field-vs-literal tests (catalog_data.ARG_CONDITIONS,
    read from the wheels by tools/gen_arg_conditions.py): `use_dora`/`use_rslora`/`pissa_init`/`loraplus_lr_ratio`
    without LoRA ('... is only valid for LoRA training.'), `dataloader_prefetch_factor` without dataloader workers,
    `infer_backend` other than huggingface ('vLLM/SGLang backend is only available for API, CLI and Web.'),
    `reasoning_effort` outside its three values, fp16 with bf16 for full eval, `image_max_pixels` below
    `image_min_pixels` (a comparison of two fields), ... One error per condition that
    holds, quoting the stack's message, unless an earlier rule already refused one of its keys.

    Cookbook: §2.2 (LoRA / full fine-tuning), A.1.
    Code: transformers-kt training_args.py TrainingArguments._validate_args; LF hparams/finetuning_args.py FinetuningArguments.__post_init__; LF hparams/data_args.py DataArguments.__post_init__; LF hparams/model_args.py BaseModelArguments/ProcessorArguments/ExportArguments/KTransformersArguments.__post_init__; LF hparams/parser.py get_train_args and _verify_model_args; extracted by tools/gen_arg_conditions.py into catalog_data.ARG_CONDITIONS.
    """
    refused = {f.path for f in ctx.findings if f.severity == "error"}
    for atoms, template, where in cd.ARG_CONDITIONS:
        verdicts = [atom_holds(ctx, key, op, literal) for key, op, literal in atoms]
        names = _names(atoms)
        if not all(v is True for v in verdicts) or not any(key in ctx.t for key in names):
            continue
        if any(f"train.{key}" in refused for key in names):
            continue
        values = {key: _value(ctx, key) for key in names}
        try:
            message = template.format_map(values)
        except (KeyError, IndexError, ValueError):
            message = template
        key = _blame(ctx, atoms, message)
        compared = {k for key, op, lit in atoms if op.startswith("field ") for k in (key, lit)}
        shown = ", ".join(f"{k}: {values[k]!r}" + ("" if k in ctx.t else " (default)")
                          for k in names if k in ctx.t or k in compared)
        ctx.error(f"train.{key}", f"{shown}: {where.split()[0]} refuses it ('{message}'; {where})",
                  _fix(ctx, atoms, key))
        refused.add(f"train.{key}")


@rule("lf.ddp_backend")
def lf_ddp_backend(ctx: Ctx) -> None:
    """ddp_backend goes from transformers (TrainingArguments: `backend=self.ddp_backend`) through accelerate's
    PartialState to torch.distributed.init_process_group in each launched process, which refuses a name its build
    does not know. transformers lists the names it passes on (the field's metadata choices, catalog_data.FIELD_CHOICES);
    the image's torch refuses some of those too (catalog_data.TORCH_REFUSED_DDP_BACKENDS, measured in the image:
    mpi and xccl are not built in, hccl/cncl/mccl are other devices' plugins). Case-insensitive, as torch's Backend;
    the `device:backend,...` form torch also takes. Not stripped: torch looks up `' nccl'.upper()` and fails.

    Cookbook: A.2 (NCCL between the GPUs).
    Code: transformers-kt training_args.py ddp_backend field (metadata choices) and _setup_devices (AcceleratorState backend); accelerate-kt state.py PartialState._prepare_backend; torch distributed_c10d.py init_process_group / BackendConfig; tools/torch_backends.py -> docker/requirements/torch_backends.json.
    """
    value = ctx.t.get("ddp_backend")
    choices = cd.FIELD_CHOICES["ddp_backend"]
    if value is None or not isinstance(value, str):
        return      # types.catalog reports a value that is not a string
    names = [pair.split(":", 1)[1] if ":" in pair else pair for pair in value.split(",")] if ":" in value else [value]
    taken = [c for c in choices if c not in cd.TORCH_REFUSED_DDP_BACKENDS]
    if value != "".join(value.split()):
        odd = next((n for n in names if n != "".join(n.split())), value)
        ctx.error("train.ddp_backend", f"ddp_backend {value!r} has spaces: torch looks each name up as written "
                  f"(upper-cased, not stripped) and knows no {odd.upper()!r} ('Unknown c10d backend type "
                  f"{odd.upper()}' when the launched process starts)",
                  f"write it without spaces: {''.join(value.split())!r}")
        return
    for name in names:
        low = name.lower()
        if low in cd.TORCH_REFUSED_DDP_BACKENDS:
            ctx.error("train.ddp_backend", f"ddp_backend {value!r}: the image's torch refuses {name!r} when the "
                      f"launched process starts ('{cd.TORCH_REFUSED_DDP_BACKENDS[low]}')",
                      f"use {' or '.join(taken)} (or remove ddp_backend: accelerate picks nccl for CUDA GPUs)")
            return
        if low not in choices:
            near = [g for g in (ctx.guess(low, taken),) if g]
            ctx.error("train.ddp_backend", f"ddp_backend {value!r}: torch's init_process_group does not know "
                      f"{name!r} (transformers passes on: {', '.join(choices)}; the image's torch takes "
                      f"{', '.join(taken)})",
                      f"did you mean {near[0]!r}?" if near else "remove ddp_backend (accelerate picks nccl for CUDA GPUs)")
            return
