"""Doctor checks on a recipe's data and weights (host facts from core/facts/data_listing.py). Pure.

- data.dataset_placeholder: a shipped recipe's `dataset: your_dataset` is a placeholder to fill in.
- data.dataset_info: each `dataset` name exists in dataset_dir/dataset_info.json (LlamaFactory
  data/parser.py get_dataset_list raises "Undefined dataset ... in dataset_info.json").
- data.dataset_files: each local dataset file exists and its first rows parse (json/jsonl; bounded read).
- model.template_family: the `template` fits the model family of config.json `model_type` (warn).
- model.config / model.tokenizer / model.weights: the model folder holds what the run loads
  (core/checks/model.py).
- weights.converted: INT8/AMXINT4 `kt_weight_path` holds converted weights (INT8: one manifest and `_layer_N`
  folders, what kt-kernel's sft/weight_manifest.py validate_persistent_int8_weights reads first); the fix is the
  `ktdeploy prepare-weights` command that makes them (an ephemeral INT8 root is staged by `train` itself).
- weights.non_expert_source: an INT8 `kt_non_expert_weight_path` needs an FP8 source model (kt-kernel sft/artifacts.py).
- data.start_files: the files the stack opens while it parses the training arguments are on the host: a KT
  `adapter_name_or_path` (+ `adapter_folder`) is a directory (LlamaFactory: "KTransformers training requires a local
  adapter directory."), `new_special_tokens_config` and a text `accelerator_config` are files (check's
  lf.start_files refuses them outside the volumes; whether they exist is this host's fact).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.model import model_checks, model_requests
from ktdeploy.core.facts.data_listing import READ_LIMIT, DataFacts, first_rows
from ktdeploy.core.kt_weights import needed_by
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.safeio import parse_json

PLACEHOLDERS = {"your_dataset", "your-dataset", "my_dataset"}

# config.json model_type -> LlamaFactory templates of that family (llamafactory/data/template.py names)
FAMILY_TEMPLATES = {
    "qwen3_5_moe": {"qwen3_5", "qwen3_5_nothink"},
    "qwen3_5_moe_text": {"qwen3_5", "qwen3_5_nothink"},
    "qwen3_moe": {"qwen3", "qwen3_nothink"},
    "deepseek_v3": {"deepseek3", "deepseekr1"},
    "glm4_moe": {"glm4_moe", "glm4_7"},
}


def data_requests(train: Mapping[str, Any]) -> list[tuple[str, str]]:
    """First round of (kind, path) reads: dataset_info.json, config.json, kt_weight_path listing."""
    keys = TrainKeys(train)
    out = []
    ddir = keys.dataset_dir
    if isinstance(ddir, str) and ddir.startswith("/"):
        out.append(("read", posixpath.join(ddir, "dataset_info.json")))
    model = keys.model_name_or_path
    if isinstance(model, str) and model.startswith("/"):
        out.append(("read", posixpath.join(model, "config.json")))
    out += model_requests(train)
    wp = keys.kt_weight_path
    if isinstance(wp, str) and wp.startswith("/"):
        out.append(("ls", wp))
        out.append(("read", posixpath.join(wp, "config.json")))  # an original checkpoint has one
    out += [(kind, path) for _key, kind, path in start_files(train)]
    return out


def start_files(train: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, "ls" for a directory | "read" for a file, absolute path) the stack opens while parsing the arguments."""
    keys = TrainKeys(train)
    out = []
    adapter = keys.adapter_name_or_path
    if keys.use_kt is True and isinstance(adapter, str) and adapter.startswith("/") and "," not in adapter:
        folder = keys.adapter_folder
        out.append(("adapter_name_or_path", "ls",
                    posixpath.join(adapter, folder) if isinstance(folder, str) else adapter))
    for key, value in (("new_special_tokens_config", keys.new_special_tokens_config),
                       ("accelerator_config", keys.accelerator_config)):
        if isinstance(value, str) and value.startswith("/"):
            out.append((key, "read", value))
    return out


def _start_files_check(train: Mapping[str, Any], facts: DataFacts) -> list[CheckResult]:
    wanted = start_files(train)
    missing = [f"{key} {path} ({'no such directory' if kind == 'ls' else 'no such file'})"
               for key, kind, path in wanted if (e := facts.get(kind, path)) is not None and not e.ok]
    if missing:
        return [CheckResult(name=CheckName.DATA_START_FILES, status="fail", detail="; ".join(missing) + ": the stack refuses "
                            "the run while it parses the arguments (KT: 'KTransformers training requires a local adapter "
                            "directory.')", fix="put the file or directory there, or remove the key from the recipe")]
    if wanted:
        return [CheckResult(name=CheckName.DATA_START_FILES, status="pass",
                            detail=f"{', '.join(k for k, _, _ in wanted)} found on the host")]
    return []


def dataset_info(train: Mapping[str, Any], facts: DataFacts) -> dict[str, Any] | None:
    ddir = TrainKeys(train).dataset_dir
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


def file_requests(train: Mapping[str, Any], facts: DataFacts) -> list[tuple[str, str]]:
    """Second round: the local files of the named datasets."""
    keys = TrainKeys(train)
    info, ddir = dataset_info(train, facts), keys.dataset_dir
    if info is None or not isinstance(ddir, str):   # dataset_info read a dataset_dir that is a string
        return []
    out = []
    for name in keys.dataset_names:
        entry = info.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("file_name"), str):
            out.append(("read", posixpath.join(ddir, entry["file_name"])))
    return out


def data_checks(train: Mapping[str, Any], setup: str, facts: DataFacts, image: str | None = None) -> list[CheckResult]:
    keys = TrainKeys(train)
    out: list[CheckResult] = []
    names = keys.dataset_names
    ph = [n for n in names if n in PLACEHOLDERS]
    if ph:
        out.append(CheckResult(name=CheckName.DATA_DATASET_PLACEHOLDER, status="fail",
                               detail=f"train.dataset is the placeholder {', '.join(ph)!s}",
                               fix="name your dataset(s) from dataset_info.json in train.dataset"))
    ddir = keys.dataset_dir
    if isinstance(ddir, str) and ddir.startswith("/"):
        ipath = posixpath.join(ddir, "dataset_info.json")
        e = facts.get("read", ipath)
        info = dataset_info(train, facts)
        if e is None or not e.ok:
            out.append(CheckResult(name=CheckName.DATA_DATASET_INFO, status="fail", detail=f"{ipath} does not exist",
                                   fix=f"put dataset_info.json (LlamaFactory's dataset registry) in {ddir}"))
        elif info is None:
            out.append(CheckResult(name=CheckName.DATA_DATASET_INFO, status="fail",
                                   detail=f"{ipath} is not a JSON object" + (" (or larger than 64 KiB)" if e.size > READ_LIMIT else ""),
                                   fix="fix dataset_info.json: a mapping of dataset name -> {file_name, formatting, ...}"))
        else:
            missing = [n for n in names if n not in info and n not in PLACEHOLDERS]
            if missing:
                out.append(CheckResult(name=CheckName.DATA_DATASET_INFO, status="fail",
                                       detail=f"dataset(s) {', '.join(missing)} not in {ipath} (has: {', '.join(sorted(info)[:10])})",
                                       fix="add them to dataset_info.json or fix train.dataset"))
            else:
                out.append(CheckResult(name=CheckName.DATA_DATASET_INFO, status="pass",
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
                out.append(CheckResult(name=CheckName.DATA_DATASET_FILES, status="fail", detail="; ".join(problems),
                                       fix="fix the dataset file(s): a JSON array or JSON lines of sample objects"))
            elif checked:
                out.append(CheckResult(name=CheckName.DATA_DATASET_FILES, status="pass",
                                       detail=f"{checked} dataset file(s) exist and their first rows parse"))
    out += model_checks(train, facts, image)
    out += _start_files_check(train, facts)
    out += _template_check(keys, facts)
    out += _weights_check(keys, setup, facts)
    out += _fp8_model_check(keys, setup, facts)
    return out


def _fp8_model_check(keys: TrainKeys, setup: str, facts: DataFacts) -> list[CheckResult]:
    """weights.format: an FP8 setup (kt_backend FP8, or kt_expert_weight_format fp8) reads the routed experts as
    FP8; the model's own config.json on the host says how it stores them (issue 35: a BF16 model passed check and
    doctor, and training failed at load)."""
    from ktdeploy.core.sizing.model_config import native_format

    model = keys.model_name_or_path
    if setup != "fp8" or not isinstance(model, str) or keys.kt_weight_path:
        return []
    e = facts.get("read", posixpath.join(model, "config.json"))
    if e is None or not e.ok:
        return []
    try:
        cfg = parse_json(e.content)
        fmt = native_format(cfg) if isinstance(cfg, dict) else None
    except (ValueError, TypeError, AttributeError, IndexError):
        fmt = None
    if fmt is None:
        return []
    if fmt == "fp8":
        return [CheckResult(name=CheckName.WEIGHTS_FORMAT, status="pass", detail=f"{model} stores its experts as FP8")]
    return [CheckResult(name=CheckName.WEIGHTS_FORMAT, status="fail",
                        detail=f"the FP8 setup reads the routed experts as FP8, but {model}/config.json stores them as "
                               f"{fmt.upper()} (no FP8 quantization_config): loading fails when training starts",
                        fix="for a BF16 model use kt_backend: AMXBF16 (or auto); FP8 training needs the native FP8 "
                            "checkpoint")]


def _template_check(keys: TrainKeys, facts: DataFacts) -> list[CheckResult]:
    model, tpl = keys.model_name_or_path, keys.template
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
        return [CheckResult(name=CheckName.MODEL_TEMPLATE_FAMILY, status="skip", detail=f"model_type {mt!r} has no known template family")]
    if tpl in want:
        return [CheckResult(name=CheckName.MODEL_TEMPLATE_FAMILY, status="pass", detail=f"template {tpl} fits model_type {mt}")]
    return [CheckResult(name=CheckName.MODEL_TEMPLATE_FAMILY, status="warn",
                        detail=f"template {tpl} does not match model_type {mt} (expected {' or '.join(sorted(want))})",
                        fix=f"set train.template: {sorted(want)[0]}")]


INT8_MANIFESTS = ("kt-weight-manifest.json", "kt-ephemeral-manifest.json")   # kt-kernel sft/weight_manifest.py
def convert_command(setup: str, model: object, wp: str, pools: int) -> str:
    """The command that makes ``wp`` (ktdeploy prepare-weights, in the image: kt-kernel's own quantizer)."""
    fmt = "int8" if setup == "int8" else "amxint4"
    pool = f" --threadpools {pools}" if pools > 1 else ""
    return (f"ktdeploy prepare-weights {model if isinstance(model, str) else 'MODEL'} --format {fmt}{pool} -o {wp} "
            "(inside the image: docker run ... ktsft:<build> prepare-weights ...; `ktdeploy up` runs it as its "
            "WEIGHTS stage; docs/weight-formats.md)")


def _source_quant(facts: DataFacts, folder: str) -> str | None:
    """quantization_config.quant_method (or fmt) of folder/config.json, '' when it has none, None when unread."""
    ce = facts.get("read", posixpath.join(folder, "config.json"))
    if ce is None or not ce.ok:
        return None
    try:
        q = (json.loads(ce.content).get("quantization_config") or {})
        return str(q.get("quant_method") or q.get("fmt") or "").lower() if isinstance(q, dict) else ""
    except (ValueError, AttributeError, RecursionError):
        return ""


def _weights_check(keys: TrainKeys, setup: str, facts: DataFacts) -> list[CheckResult]:
    if setup not in ("int8", "int4"):
        return []
    wp, model = keys.kt_weight_path, keys.model_name_or_path
    if not isinstance(wp, str):
        return []
    need = needed_by(setup, keys.kt_config, model, wp)
    if need is not None and need.ephemeral_run_id is not None:
        return [CheckResult(name=CheckName.WEIGHTS_CONVERTED, status="pass",
                            detail=f"{wp}: ephemeral INT8, staged from {model} by `ktdeploy train` in the container "
                                   "just before the start (kt-kernel deletes each layer once loaded)")]
    fix_make = convert_command(setup, model, wp, need.pools if need else 1)
    e = facts.get("ls", wp)
    names = [n for n in (e.content.split("\n") if e and e.ok else []) if n.strip()]
    if e is None:
        return []
    out = _non_expert_check(keys, setup, facts)
    if setup == "int8":
        manifests = [n for n in names if n in INT8_MANIFESTS]
        layers = [n for n in names if n.startswith("_layer_")]
        ok = len(manifests) == 1 and bool(layers)
        what = (f"no INT8 manifest ({' or '.join(INT8_MANIFESTS)}) with _layer_N folders" if not manifests or not layers
                else f"{len(manifests)} manifests (kt-kernel requires exactly one)")
    else:
        # kt-kernel's AMXINT4 loader reads _layer_N/_numa_M/*.kt (sft/amx.py _load_base_weights_from_file), the tree
        # prepare-weights writes; a flat folder of .kt/.safetensors is the older converter's merged layout
        layers = [n for n in names if n.startswith("_layer_")]
        ok = (bool(layers) or any(n.endswith((".kt", ".safetensors")) for n in names)) and "config.json" not in names
        what = "no converted AMXINT4 expert files (_layer_N/_numa_M/*.kt)"
    if ok:
        detail = f"{wp} holds converted {setup.upper()} weights"
        if setup == "int8":
            detail += f" ({manifests[0]}, {len(layers)} layer folders; kt-kernel validates sizes and hashes at start)"
        return out + [CheckResult(name=CheckName.WEIGHTS_CONVERTED, status="pass", detail=detail)]
    if not e.ok:   # not there yet: `up` converts it in its WEIGHTS stage; `train` and doctor are told how
        return out + [CheckResult(name=CheckName.WEIGHTS_MISSING, status="fail",
                                  detail=f"{wp} does not exist yet: the {setup.upper()} experts of {model} are not "
                                         "converted", fix=f"convert them: {fix_make}")]
    detail = f"{wp} has {what}"
    quant = _source_quant(facts, wp)
    if quant and "fp8" in quant:
        # A native FP8 checkpoint by its config.json, whatever the directory is called (cookbook A.3.1).
        return out + [CheckResult(name=CheckName.WEIGHTS_CONVERTED, status="fail",
                                  detail=f"{wp} is a native FP8 checkpoint (config.json quantization_config "
                                         f"quant_method {quant}), not converted {setup.upper()} weights (cookbook A.3.1)",
                                  fix="use the native FP8 setup (kt_expert_weight_format: fp8, no kt_weight_path), "
                                      "or convert it: " + fix_make.replace(str(model), wp, 1))]
    if quant is not None:
        detail = f"{wp} is an original checkpoint (it has config.json), not converted {setup.upper()} weights"
    return out + [CheckResult(name=CheckName.WEIGHTS_CONVERTED, status="fail", detail=detail,
                              fix=f"convert the experts of {model} into {wp}: " + fix_make)]


def _non_expert_check(keys: TrainKeys, setup: str, facts: DataFacts) -> list[CheckResult]:
    """weights.non_expert_source: kt-kernel's artifacts.py accepts an INT8 non-expert cache only from an FP8 source."""
    nwp, model = keys.kt_non_expert_weight_path, keys.model_name_or_path
    if setup != "int8" or not isinstance(nwp, str) or not isinstance(model, str):
        return []
    quant = _source_quant(facts, model)
    if quant is None:
        return []
    if "fp8" in quant:
        return [CheckResult(name=CheckName.WEIGHTS_NON_EXPERT_SOURCE, status="pass",
                            detail=f"{model} is an FP8 checkpoint: kt-kernel validates the non-expert cache {nwp} "
                                   "against it at start")]
    return [CheckResult(name=CheckName.WEIGHTS_NON_EXPERT_SOURCE, status="fail",
                        detail=f"kt_non_expert_weight_path is set but {model} is not an FP8 checkpoint (config.json "
                               f"quantization_config: {quant or 'none'}); kt-kernel 0.7.2 (sft/artifacts.py) refuses a "
                               "non-expert cache whose source is not FP8",
                        fix="remove kt_non_expert_weight_path: the non-expert weights then load from "
                            "model_name_or_path (as in recipes/qwen3-235b-int8-lora.yaml)")]
