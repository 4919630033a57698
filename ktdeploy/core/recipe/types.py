"""Value types from the key catalogue: the annotation of each key's owning dataclass in the locked wheels.

`tools/gen_key_catalog.py` copies each field's annotation text (LlamaFactory-KT hparams, transformers-KT
TrainingArguments into catalog_data.KEY_TYPES; accelerate-KT ClusterConfig into ACCELERATE_KEY_TYPES).
LlamaFactory builds its dataclasses with HfArgumentParser.parse_dict and accelerate its ClusterConfig with
``cls(**yaml)``: neither converts or checks types, so `overwrite_output_dir: 1` arrives as the integer 1 and
`packing: 'off'` as a truthy string (packing on). ktdeploy therefore checks each value against the annotation
and names the fix, except where the stack itself takes another form: LlamaFactory's ``split_arg`` fields take a
YAML list (catalog_data.LIST_ARGS), and accelerate's own ``accelerate config`` writes ``downcast_bf16: 'no'``
(read only by its TPU launcher). Pure: no wheel is imported.
"""

from __future__ import annotations

import ast
import math
import re
from functools import cache
from typing import Any

from ktdeploy.core.recipe.catalog_data import ACCELERATE_KEY_TYPES, KEY_TYPES, LIST_ARGS

MAX_INT = 2**63 - 1


@cache
def kinds(annotation: str) -> tuple[frozenset[str], tuple[Any, ...] | None]:
    """({'bool','int','float','str','dict','list','none','any'}, Literal values or None) of an annotation."""
    a = annotation.replace(" ", "")
    lits = re.findall(r"Literal\[([^\]]*)\]", a)
    literal = None
    if lits:
        literal = tuple(v for x in lits for v in ast.literal_eval(f"[{x}]"))
        a = re.sub(r"Literal\[[^\]]*\]", "LIT", a)
    a = re.sub(r"^Optional\[(.*)\]$", r"\1|None", a)
    a = re.sub(r"^Union\[(.*)\]$", lambda m: m.group(1).replace(",", "|"), a)
    out: set[str] = set()
    for part in re.split(r"\|(?![^\[]*\])", a):
        base = part.split("[", 1)[0]
        if base == "LIT":
            out.add("literal")
        elif base in ("bool", "int", "float", "str", "dict", "list"):
            out.add(base)
        elif base in ("None", "NoneType"):
            out.add("none")
        elif base in ("Path",):
            out.add("str")
        elif base in ("Any", "object", "Callable") or "." in base:
            out.add("any")
        elif base[:1].isupper():
            out.add("str")  # an Enum (SaveStrategy, DistributedType, ...): written by its value
        else:
            out.add("any")
    return frozenset(out), literal


# Forms the stack takes beyond the annotation (section, key) -> the annotation as the stack reads it.
READ_AS = {("accelerate", "downcast_bf16"): "bool | str",   # `accelerate config` writes downcast_bf16: 'no'
           ("train", "lora_alpha"): "int | float | None"}     # PEFT scales by lora_alpha / r; KTConfig: float


def type_error(key: str, value: Any, section: str = "train") -> tuple[str, str] | None:
    """(message, fix) when ``value`` cannot be the catalogue type of ``key`` in ``section``; None when it fits or is
    unknown."""
    ann = READ_AS.get((section, key)) or (ACCELERATE_KEY_TYPES if section == "accelerate" else KEY_TYPES).get(key)
    if ann is None or value is None:
        return None
    if section == "train" and key in LIST_ARGS and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None   # split_arg keeps a list as it is
    ks, literal = kinds(ann)
    if "any" in ks:
        return None
    if isinstance(value, bool):
        if "bool" in ks or ("literal" in ks and value in (literal or ())):
            return None
    elif isinstance(value, int):
        if abs(value) > MAX_INT and ks & {"int", "float"}:
            return f"{key} = {str(value)[:12]}… ({len(str(abs(value)))} digits) is out of range", "write a realistic number"
        if ks & {"int", "float"} or ("literal" in ks and value in (literal or ())):
            return None
    elif isinstance(value, float):
        if "float" in ks:
            return None if math.isfinite(value) else (f"{key} must be a finite number, got {value}", "write a number")
    elif isinstance(value, str):
        if "str" in ks or ("literal" in ks and value in (literal or ())):
            return None
    elif isinstance(value, dict):
        if ks & {"dict", "str"} and "dict" in ks:
            return None
    elif isinstance(value, list):  # noqa: SIM102 (one branch per type, like the ones above)
        if "list" in ks:
            return None
    want = sorted(ks - {"none", "literal"})
    if "literal" in ks:
        want.append("one of " + ", ".join(map(repr, literal or ())))
    shown = "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else repr(value)
    fix = {"bool": "write true or false (unquoted)", "int": "write a whole number", "float": "write a number (e.g. 1.0e-4)",
           "str": "write a single string"}
    hint = next((fix[k] for k in ("bool", "int", "float", "str") if k in ks), "see LlamaFactory's arguments")
    if isinstance(value, bool) and "str" in ks:
        hint = "quote the value (YAML 1.1, as LlamaFactory reads it, turns unquoted no/off/yes/on into booleans), e.g. 'no'"
    if "literal" in ks and not ks & {"bool", "int", "float", "str"}:
        hint = f"use one of {', '.join(map(repr, literal or ()))}"
    return f"{key} must be {' or '.join(want)} ({ann}), got {shown}", hint
