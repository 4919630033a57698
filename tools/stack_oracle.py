"""Differential oracle: kt-kernel 0.7.2's own KTConfig validation vs `ktdeploy check`.

What it runs (and what it does not):
- It brings the exact kt-kernel 0.7.2 wheel named in docker/requirements/full.lock (checked against the
  lock's sha256) into the git-ignored cache `.cache/stack-oracle/` (`pip download`, or a wheel already
  there / in $KTDEPLOY_ORACLE_WHEEL). Nothing from the wheel is committed.
- It imports ONLY two pure-Python files of the wheel, loaded directly from the zip with importlib:
  `kt_kernel/sft/backend.py` and `kt_kernel/sft/config.py` (KTConfig, KTActivationPolicy). No stub is
  needed: config.py imports torch only inside `_set_torch_num_threads`, which returns when torch is
  missing; the compiled extension (`kt_kernel/__init__.py` -> kt_kernel_ext) is never imported.
- The train section is mapped to KTConfig's keyword arguments the way LlamaFactory-KT 0.9.6.dev0 does
  (hparams/model_args.py `get_kt_config_dict` + `get_kt_activation_policy`), with LlamaFactory's
  defaults (lora_rank 8, lora_dropout 0.0, finetuning_type lora).
- One load-time check of kt-kernel lives in `kt_kernel/sft/wrapper.py` (which imports torch): the
  activation-policy check `activation_policy.cpu=retain requires CPU-only AMXBF16 Full/LoRA or frozen-base
  INT8/FP8/RAWINT4/MXFP4 LoRA` (wrapper.py, the `cpu_activation_retain` block, and its
  `kt_backend_map`). It is transcribed in `_wrapper_checks` below and marked as such in every verdict.

Usage:  python tools/stack_oracle.py [RECIPE.yaml ...]     (default: every shipped recipe)
Exit 0 when every disagreement is explained in docs/stack-rules.md's table, 1 otherwise.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locked_wheels import locked_wheel

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "stack-oracle"
WHEEL_NAME = "kt_kernel-0.7.2-cp311-cp311-manylinux_2_35_x86_64.whl"


def wheel_path() -> Path:
    """The locked wheel, verified by hash; downloaded into the cache when missing."""
    given = [Path(os.environ["KTDEPLOY_ORACLE_WHEEL"])] if os.environ.get("KTDEPLOY_ORACLE_WHEEL") else []
    return locked_wheel("kt-kernel", WHEEL_NAME, CACHE, given)


_KT = None


def kt_modules():
    """(config module, backend module) loaded from the wheel's two pure-Python files."""
    global _KT
    if _KT is not None:
        return _KT
    wheel = wheel_path()
    src_dir = CACHE / "src-0.7.2"
    if not (src_dir / "kt_kernel" / "sft" / "config.py").is_file():
        with zipfile.ZipFile(wheel) as z:
            for name in ("kt_kernel/sft/backend.py", "kt_kernel/sft/config.py"):
                (src_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (src_dir / name).write_bytes(z.read(name))
    mods = {}
    # A private package name so that an installed kt_kernel (the image) is never shadowed or imported.
    pkg = "_oracle_kt_sft"
    import types
    p = types.ModuleType(pkg)
    p.__path__ = [str(src_dir / "kt_kernel" / "sft")]
    sys.modules[pkg] = p
    for name in ("backend", "config"):
        spec = importlib.util.spec_from_file_location(f"{pkg}.{name}", src_dir / "kt_kernel" / "sft" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"{pkg}.{name}"] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    _KT = (mods["config"], mods["backend"])
    return _KT


# ---------------------------------------------------------------- LlamaFactory's mapping

def lf_kt_kwargs(train: dict[str, Any]) -> dict[str, Any]:
    """KTConfig(**kwargs) as LlamaFactory-KT builds it (model_args.py get_kt_config_dict)."""
    ft = train.get("finetuning_type", "lora")
    if ft not in ("lora", "full"):
        raise ValueError("KTransformers supports LoRA and full-parameter finetuning.")
    raw = train.get("kt_config") or {}
    if not isinstance(raw, dict):
        raise TypeError("LLaMA-Factory `kt_config` must be a flat mapping.")
    cfg = dict(raw)
    cap = cfg.pop("kt_model_max_length", None)
    if cap is not None:
        try:
            cap = int(cap)
        except (TypeError, ValueError) as exc:
            raise ValueError("`kt_model_max_length` must be a positive integer.") from exc
        if cap <= 0:
            raise ValueError("`kt_model_max_length` must be a positive integer.")
    # get_kt_activation_policy
    gpu = "retain" if train.get("disable_gradient_checkpointing") else "recompute"
    cpu = train.get("kt_cpu_activation") or gpu
    if cpu == "recompute" and gpu == "retain":
        raise ValueError("`kt_cpu_activation: recompute` requires GPU gradient checkpointing.")
    cfg.update({
        "kt_lora_rank": train.get("lora_rank", 8),
        "kt_lora_alpha": train.get("lora_alpha"),
        "kt_lora_dropout": train.get("lora_dropout", 0.0),
        "kt_weight_path": train.get("kt_weight_path"),
        "kt_non_expert_weight_path": train.get("kt_non_expert_weight_path"),
        "kt_expert_checkpoint_path": train.get("kt_expert_checkpoint_path"),
        "kt_model_max_length": cap,
        "kt_use_lora_experts": train.get("kt_use_lora_experts"),
        "kt_lora_expert_num": train.get("kt_lora_expert_num"),
        "kt_lora_expert_intermediate_size": train.get("kt_lora_expert_intermediate_size"),
        "kt_activation_policy": {"cpu": cpu, "gpu": gpu},
        "kt_train_mode": ft,
        "kt_full_weight_grad": ft == "full",
    })
    return {k: v for k, v in cfg.items() if v is not None}


# Transcribed from kt_kernel/sft/wrapper.py 0.7.2 (imports torch, so not loaded): kt_backend_map and
# the `cpu_activation_retain` check.
_WRAPPER_BACKEND_MAP = {
    "AMXBF16": "AMXBF16_SFT", "FP8": "AMXFP8_SFT", "AMXFP8": "AMXFP8_SFT", "INT8": "INT8_SFT",
    "AMXINT8": "INT8_SFT", "RAWINT4": "RAWINT4_SFT", "MXFP4": "MXFP4_SFT", "AMXINT4_KGroup": "RAWINT4_SFT",
    "AMXINT4": "AMXINT4_SFT", "AMXBF16_SkipLoRA": "AMXBF16_SFT_SkipLoRA",
    "AMXINT8_SkipLoRA": "AMXINT8_SFT_SkipLoRA", "AMXINT4_SkipLoRA": "AMXINT4_SFT_SkipLoRA",
}


def _wrapper_checks(c) -> None:
    backend = str(c.kt_backend)
    method = _WRAPPER_BACKEND_MAP.get(backend) or {k.lower(): v for k, v in _WRAPPER_BACKEND_MAP.items()}.get(backend.lower())
    if method is None:
        raise ValueError(f"[wrapper.py] Unknown kt_backend {backend!r}")
    lora_rank = int(c.kt_lora_rank or 0)
    full = bool(c.kt_full_weight_grad)
    if c.kt_train_mode == "full":
        lora_rank = 0
    reuse_ok = (full and lora_rank == 0) or (not full and lora_rank > 0)
    if c.kt_activation_policy.cpu == "retain" and (
        not reuse_ok or method not in {"AMXBF16_SFT", "AMXFP8_SFT", "INT8_SFT", "RAWINT4_SFT", "MXFP4_SFT"}
        or int(c.kt_num_gpu_experts or 0) != 0 or bool(c.kt_use_lora_experts)):
        raise ValueError("[wrapper.py] activation_policy.cpu=retain requires CPU-only AMXBF16 Full/LoRA "
                         "or frozen-base INT8/FP8/RAWINT4/MXFP4 LoRA")


def kt_verdict(train: dict[str, Any]) -> tuple[bool, str]:
    """(accepted, reason) of kt-kernel 0.7.2 for a train section with use_kt: true."""
    config, _ = kt_modules()
    saved = dict(os.environ)  # KTConfig reads ACCELERATE_KT_* and writes OMP_NUM_THREADS: leave no trace
    for k in [k for k in os.environ if k.startswith("ACCELERATE_KT_")]:
        del os.environ[k]
    os.environ["ACCELERATE_KT_OMP_NUM_THREADS"] = "1"  # no /sys topology walk
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = config.KTConfig.from_object(lf_kt_kwargs(train))
            _wrapper_checks(c)
        return True, ""
    except (ValueError, TypeError, NotImplementedError) as err:
        return False, f"{type(err).__name__}: {err}"
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------- ktdeploy's side

def ktdeploy_kt_errors(doc: dict[str, Any]) -> list[str]:
    """The errors of `ktdeploy check` about rules kt-kernel also decides (kt.*, format.*, lora.*)."""
    from ktdeploy.core.recipe.document import build
    from ktdeploy.core.recipe.loader import RawRecipe, Source
    from ktdeploy.core.recipe.rules import run_rules

    recipe = build(RawRecipe(doc=doc, source=Source(), path=None))
    return [f"{f.rule}: {f.path}: {f.message}" for f in run_rules(recipe)
            if f.severity == "error" and f.rule.split(".")[0] in ("kt", "format", "lora")]


@dataclass
class Outcome:
    name: str
    kt_ok: bool
    kt_reason: str
    kd_errors: list[str]

    @property
    def agree(self) -> bool:
        return self.kt_ok == (not self.kd_errors)

    @property
    def kind(self) -> str:
        return "agree" if self.agree else ("ktdeploy-stricter" if self.kt_ok else "ktdeploy-looser")


def compare(name: str, doc: dict[str, Any]) -> Outcome:
    train = doc.get("train") or {}
    kt_ok, why = kt_verdict(train) if train.get("use_kt") is True else (True, "use_kt off: KTConfig not built")
    return Outcome(name, kt_ok, why, ktdeploy_kt_errors(doc))


# Each key with values kt-kernel or LlamaFactory allow and values they forbid.
VALUES = {
    ("kt_config", "kt_backend"): ["auto", "AMXBF16", "AMXINT8", "AMXINT4", "INT8", "FP8", "BF16", "amxbf16", "nope"],
    ("kt_config", "kt_expert_weight_format"): ["bf16", "int8", "fp8", "BF16", "int4"],
    ("kt_config", "kt_weight_lifecycle"): ["persistent", "ephemeral", "forever"],
    ("kt_config", "kt_share_backward_bb"): [True, False],
    ("kt_config", "kt_num_gpu_experts"): [0, 2],
    ("kt_config", "kt_force_fused_expert_lora"): [True, False],
    (None, "kt_cpu_activation"): ["retain", "recompute"],
    (None, "disable_gradient_checkpointing"): [True, False],
    (None, "finetuning_type"): ["lora", "full"],
    (None, "lora_rank"): [8, 0],
    (None, "lora_dropout"): [0.0, 0.05, 1.5],
    (None, "kt_weight_path"): [None, "/data/models/conv-experts"],
    (None, "kt_non_expert_weight_path"): [None, "/data/models/conv-nonexpert"],
}


def set_key(doc: dict, where, key, value) -> dict:
    d = copy.deepcopy(doc)
    t = d["train"]
    target = t.setdefault("kt_config", {}) if where == "kt_config" else t
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value
    if t.get("finetuning_type") == "full":
        for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target"):
            t.pop(k, None)
    return d


def corpus(pairs: bool = True):
    """(name, doc): every shipped KT recipe with each key of VALUES flipped, then every pair of keys."""
    import itertools

    for name, doc in shipped():
        if doc["train"].get("use_kt") is not True:
            continue
        for (where, key), values in VALUES.items():
            for v in values:
                yield f"{name} {key}={v!r}", set_key(doc, where, key, v)
        if not pairs:
            continue
        for (k1, k2) in itertools.combinations(VALUES, 2):
            for v1 in VALUES[k1]:
                for v2 in VALUES[k2]:
                    yield (f"{name} {k1[1]}={v1!r} {k2[1]}={v2!r}",
                           set_key(set_key(doc, *k1, v1), *k2, v2))


def count(items) -> dict[str, int]:
    table = explained_stricter()
    out = {"agree": 0, "ktdeploy-stricter (explained)": 0, "ktdeploy-stricter (unexplained)": 0, "ktdeploy-looser": 0}
    examples: dict[str, str] = {}
    for name, doc in items:
        o = compare(name, doc)
        if o.agree:
            k = "agree"
        elif not o.kt_ok:
            k = "ktdeploy-looser"
        else:
            k = "ktdeploy-stricter (unexplained)" if unexplained(o, table) else "ktdeploy-stricter (explained)"
        out[k] += 1
        if k != "agree" and k not in examples:
            examples[k] = f"{name}: kt={o.kt_reason or 'ok'} kd={o.kd_errors}"
    return out, examples


# ---------------------------------------------------------------- explanations (docs/stack-rules.md)

def explained_stricter() -> list[tuple[str, str]]:
    """(rule id, message fragment) rows of the 'deliberately stricter' table in docs/stack-rules.md."""
    text = (ROOT / "docs" / "stack-rules.md").read_text()
    part = text.split("<!-- stricter-table -->", 2)[1]
    rows = []
    for line in part.splitlines():
        m = re.match(r"\|\s*`([\w.]+)`\s*\|\s*`([^`]+)`\s*\|\s*\S", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def _explained(err: str, table) -> bool:
    rule, _, rest = err.partition(":")
    return any(rule == r and frag in rest for r, frag in table)


def unexplained(o: Outcome, table) -> bool:
    """Explained only when ktdeploy is stricter and each error matches a (rule, message) row of the table."""
    if o.agree:
        return False
    if not o.kt_ok:
        return True  # ktdeploy passes what kt-kernel rejects: never acceptable
    return any(not _explained(e, table) for e in o.kd_errors)


_SHIPPED: list[tuple[str, dict]] | None = None


def shipped() -> list[tuple[str, dict]]:
    """(file name, parsed document) of every shipped recipe (read once; callers get copies)."""
    global _SHIPPED
    from ktdeploy.core.recipe.loader import read_recipe

    if _SHIPPED is None:
        _SHIPPED = [(p.name, read_recipe(p).doc) for p in sorted((ROOT / "ktdeploy" / "builtin_recipes").glob("*.yaml"))]
    return copy.deepcopy(_SHIPPED)


def main(argv: list[str]) -> int:
    from ktdeploy.core.recipe.loader import read_recipe

    sys.path.insert(0, str(ROOT))
    if argv[:1] == ["--corpus"]:
        counts, ex = count(corpus())
        print(counts)
        for k, v in ex.items():
            print(f"  e.g. {k}: {v}")
        return 1 if counts["ktdeploy-looser"] or counts["ktdeploy-stricter (unexplained)"] else 0
    items = [(a, read_recipe(a).doc) for a in argv] if argv else shipped()
    table = explained_stricter()
    bad = 0
    for name, doc in items:
        o = compare(name, doc)
        flag = "UNEXPLAINED" if unexplained(o, table) else o.kind
        bad += flag == "UNEXPLAINED"
        print(f"{name}: kt-kernel {'accepts' if o.kt_ok else 'rejects'}"
              f"{' (' + o.kt_reason + ')' if o.kt_reason and not o.kt_ok else ''}; "
              f"ktdeploy {'passes' if not o.kd_errors else 'rejects: ' + '; '.join(o.kd_errors)} -> {flag}")
    print(f"{bad} unexplained disagreement(s) in {len(items)} recipe(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
