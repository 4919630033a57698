"""Doctor checks on a recipe's data and weights (host facts from core/facts/data.py). Pure.

- data.dataset_placeholder: a shipped recipe's `dataset: your_dataset` is a placeholder to fill in.
- data.dataset_info: each `dataset` name exists in dataset_dir/dataset_info.json (LlamaFactory
  data/parser.py get_dataset_list raises "Undefined dataset ... in dataset_info.json").
- data.dataset_files: each local dataset file exists and its first rows parse (json/jsonl; bounded read).
- model.template_family: the `template` fits the model family of config.json `model_type` (warn).
- model.config / model.tokenizer / model.weights: the model folder holds what the run loads
  (core/checks/model.py).
- weights.converted: INT8/AMXINT4 `kt_weight_path` holds converted weights (INT8: `.kt` files, kt-kernel
  config.py "INT8 SFT requires kt_weight_path pointing to pre-quantized .kt weights"); otherwise names the
  conversion command of kt-kernel 0.7.2 (`kt quant`, kt_kernel/cli/commands/quant.py).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.model import model_checks, model_requests
from ktdeploy.core.facts.data import READ_LIMIT, DataFacts, first_rows

PLACEHOLDERS = {"your_dataset", "your-dataset", "my_dataset"}

# config.json model_type -> LlamaFactory templates of that family (llamafactory/data/template.py names)
FAMILY_TEMPLATES = {
    "qwen3_5_moe": {"qwen3_5", "qwen3_5_nothink"},
    "qwen3_5_moe_text": {"qwen3_5", "qwen3_5_nothink"},
    "qwen3_moe": {"qwen3", "qwen3_nothink"},
    "deepseek_v3": {"deepseek3", "deepseekr1"},
    "glm4_moe": {"glm4_moe", "glm4_7"},
}


def dataset_names(train: dict) -> list[str]:
    d = train.get("dataset")
    if isinstance(d, list):
        return [str(x).strip() for x in d if str(x).strip()]
    if isinstance(d, str):
        return [x.strip() for x in d.split(",") if x.strip()]
    return []


def data_requests(train: dict) -> list[tuple[str, str]]:
    """First round of (kind, path) reads: dataset_info.json, config.json, kt_weight_path listing."""
    out = []
    ddir = train.get("dataset_dir")
    if isinstance(ddir, str) and ddir.startswith("/"):
        out.append(("read", posixpath.join(ddir, "dataset_info.json")))
    model = train.get("model_name_or_path")
    if isinstance(model, str) and model.startswith("/"):
        out.append(("read", posixpath.join(model, "config.json")))
    out += model_requests(train)
    wp = train.get("kt_weight_path")
    if isinstance(wp, str) and wp.startswith("/"):
        out.append(("ls", wp))
        out.append(("read", posixpath.join(wp, "config.json")))  # an original checkpoint has one
    return out


def dataset_info(train: dict, facts: DataFacts) -> dict | None:
    ddir = train.get("dataset_dir")
    if not isinstance(ddir, str):
        return None
    e = facts.get("read", posixpath.join(ddir, "dataset_info.json"))
    if e is None or not e.ok or e.size > READ_LIMIT:
        return None
    try:
        info = json.loads(e.content)
    except (ValueError, RecursionError):
        return None
    return info if isinstance(info, dict) else None


def file_requests(train: dict, facts: DataFacts) -> list[tuple[str, str]]:
    """Second round: the local files of the named datasets."""
    info = dataset_info(train, facts) or {}
    out = []
    for name in dataset_names(train):
        entry = info.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("file_name"), str):
            out.append(("read", posixpath.join(train["dataset_dir"], entry["file_name"])))
    return out


def data_checks(train: dict, setup: str, facts: DataFacts) -> list[CheckResult]:
    out: list[CheckResult] = []
    names = dataset_names(train)
    ph = [n for n in names if n in PLACEHOLDERS]
    if ph:
        out.append(CheckResult(name="data.dataset_placeholder", status="fail",
                               detail=f"train.dataset is the placeholder {', '.join(ph)!s}",
                               fix="name your dataset(s) from dataset_info.json in train.dataset"))
    ddir = train.get("dataset_dir")
    if isinstance(ddir, str) and ddir.startswith("/"):
        ipath = posixpath.join(ddir, "dataset_info.json")
        e = facts.get("read", ipath)
        info = dataset_info(train, facts)
        if e is None or not e.ok:
            out.append(CheckResult(name="data.dataset_info", status="fail", detail=f"{ipath} does not exist",
                                   fix=f"put dataset_info.json (LlamaFactory's dataset registry) in {ddir}"))
        elif info is None:
            out.append(CheckResult(name="data.dataset_info", status="fail",
                                   detail=f"{ipath} is not a JSON object" + (" (or larger than 64 KiB)" if e.size > READ_LIMIT else ""),
                                   fix="fix dataset_info.json: a mapping of dataset name -> {file_name, formatting, ...}"))
        else:
            missing = [n for n in names if n not in info and n not in PLACEHOLDERS]
            if missing:
                out.append(CheckResult(name="data.dataset_info", status="fail",
                                       detail=f"dataset(s) {', '.join(missing)} not in {ipath} (has: {', '.join(sorted(info)[:10])})",
                                       fix="add them to dataset_info.json or fix train.dataset"))
            else:
                out.append(CheckResult(name="data.dataset_info", status="pass",
                                       detail=f"{len([n for n in names if n not in PLACEHOLDERS])} dataset(s) found in {ipath}"))
            problems, checked = [], 0
            for n in names:
                entry = info.get(n)
                if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
                    continue
                fpath = posixpath.join(ddir, entry["file_name"])
                fe = facts.get("read", fpath)
                if fe is None:
                    continue
                checked += 1
                if not fe.ok:
                    problems.append(f"{n}: {fpath} does not exist")
                    continue
                rows, why = first_rows(fe.content, fe.size <= READ_LIMIT, fpath)
                if rows is None:
                    problems.append(f"{n}: {fpath}: {why}")
                elif rows and not all(isinstance(r, dict) for r in rows):
                    problems.append(f"{n}: {fpath}: samples are not JSON objects")
            if problems:
                out.append(CheckResult(name="data.dataset_files", status="fail", detail="; ".join(problems),
                                       fix="fix the dataset file(s): a JSON array or JSON lines of sample objects"))
            elif checked:
                out.append(CheckResult(name="data.dataset_files", status="pass",
                                       detail=f"{checked} dataset file(s) exist and their first rows parse"))
    out += model_checks(train, facts)
    out += _template_check(train, facts)
    out += _weights_check(train, setup, facts)
    return out


def _template_check(train: dict, facts: DataFacts) -> list[CheckResult]:
    model, tpl = train.get("model_name_or_path"), train.get("template")
    if not isinstance(model, str) or not isinstance(tpl, str):
        return []
    e = facts.get("read", posixpath.join(model, "config.json"))
    if e is None or not e.ok:
        return []
    try:
        cfg: Any = json.loads(e.content)
        mt = cfg.get("model_type") or (cfg.get("text_config") or {}).get("model_type")
    except (ValueError, AttributeError, RecursionError):
        return []
    want = FAMILY_TEMPLATES.get(str(mt))
    if want is None:
        return [CheckResult(name="model.template_family", status="skip", detail=f"model_type {mt!r} has no known template family")]
    if tpl in want:
        return [CheckResult(name="model.template_family", status="pass", detail=f"template {tpl} fits model_type {mt}")]
    return [CheckResult(name="model.template_family", status="warn",
                        detail=f"template {tpl} does not match model_type {mt} (expected {' or '.join(sorted(want))})",
                        fix=f"set train.template: {sorted(want)[0]}")]


def _weights_check(train: dict, setup: str, facts: DataFacts) -> list[CheckResult]:
    if setup not in ("int8", "int4"):
        return []
    wp, model = train.get("kt_weight_path"), train.get("model_name_or_path")
    if not isinstance(wp, str):
        return []
    method = "int8" if setup == "int8" else "int4"
    cmd = f"kt quant {model} --method {method} --output {wp}"
    e = facts.get("ls", wp)
    names = [n for n in (e.content.split("\n") if e and e.ok else []) if n.strip()]
    if e is None:
        return []
    if setup == "int8":
        ok = any(n.endswith(".kt") for n in names)
        what = "no pre-quantized .kt files"
    else:
        ok = any(n.endswith((".kt", ".safetensors")) for n in names) and "config.json" not in names
        what = "no converted AMXINT4 expert files"
    if ok:
        return [CheckResult(name="weights.converted", status="pass", detail=f"{wp} holds converted {setup.upper()} weights")]
    detail = f"{wp} does not exist" if not e.ok else f"{wp} has {what}"
    ce = facts.get("read", posixpath.join(wp, "config.json"))
    if ce is not None and ce.ok:
        try:
            q = (json.loads(ce.content).get("quantization_config") or {})
            quant = str(q.get("quant_method") or q.get("fmt") or "").lower() if isinstance(q, dict) else ""
        except (ValueError, AttributeError, RecursionError):
            quant = ""
        if "fp8" in quant:
            # A native FP8 checkpoint by its config.json, whatever the directory is called (cookbook A.3.1).
            return [CheckResult(name="weights.converted", status="fail",
                                detail=f"{wp} is a native FP8 checkpoint (config.json quantization_config "
                                       f"quant_method {quant}), not converted {setup.upper()} weights (cookbook A.3.1)",
                                fix="use the native FP8 setup (kt_expert_weight_format: fp8, no kt_weight_path), "
                                    f"or convert: {cmd} --input-type fp8")]
        detail = f"{wp} is an original checkpoint (it has config.json), not converted {setup.upper()} weights"
    return [CheckResult(name="weights.converted", status="fail", detail=detail,
                        fix=f"convert the experts first (kt-kernel 0.7.2 CLI): {cmd}")]
