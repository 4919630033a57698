"""Doctor checks on the model a run will load (pure; the host's answers come from core/facts/data_listing.py).

An empty or half-copied model folder used to pass doctor (``path.model_exists`` only tests the volume) and fail
an hour later in the training container. These read what LlamaFactory/transformers will open:

- model.config: ``train.model_name_or_path``/config.json exists and is a JSON object (AutoConfig);
- model.tokenizer: tokenizer_config.json and a vocabulary (tokenizer.json, tokenizer.model, or vocab.json +
  merges.txt) — AutoTokenizer's files;
- model.weights: safetensors weights: with ``model.safetensors.index.json`` every shard its weight_map names is
  present and not empty, and together they hold at least the index's ``total_size``; without an index, one
  ``model.safetensors`` (or ``*.bin``, warned: KT reads experts from safetensors); and the bytes on disk are
  plausible for the parameter count config.json implies (core/sizing/model_config.py), so a checkpoint cut
  short by an interrupted copy is caught by its size.

Each fix says how to get the model there: for the tiny recipe's model, `ktdeploy tiny-model`; otherwise a download
on the host or ``ktdeploy up --sync-model LOCAL_DIR``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.errors import KtdeployError
from ktdeploy.core.facts.data_listing import DataFacts, file_sizes, index_shards
from ktdeploy.core.recipe.train_keys import TrainKeys

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TOKENIZER_VOCABS = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
TINY_PREFIX = "tiny-"          # `ktdeploy tiny-model` models (the shipped tiny recipe's tiny-qwen3-moe)
# bytes on disk per parameter for the routed experts by the checkpoint's native format; the rest is BF16
EXPERT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5}
TOO_SMALL = 0.6                # below this share of the expected bytes, shards are missing or cut short
TOO_LARGE = 2.5                # above this multiple, the checkpoint is not the format config.json says (fp32?)
GiB = 1024**3


def model_requests(train: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The reads the model checks need (config.json is read by data_requests already)."""
    model = TrainKeys(train).model_name_or_path
    if not isinstance(model, str) or not model.startswith("/"):
        return []
    return [("sizes", model), ("shards", posixpath.join(model, INDEX))]


def how_to_get(train: Mapping[str, Any], image: str | None = None) -> str:
    """The fix's second half: how to put this model on the host. ``image``: the image this host's run would use
    (doctor resolves `deploy.image: auto` from the CPU); without one, the AVX2 build, which runs on any host the
    others run on (tiny-model needs torch, which every build holds, not a kernel)."""
    keys = TrainKeys(train)
    model = str(keys.model_name_or_path or "")
    if posixpath.basename(model.rstrip("/")).startswith(TINY_PREFIX):
        data = str(keys.dataset_dir or "/srv/ktdeploy/data")
        parent = posixpath.dirname(model.rstrip("/")) or "/"
        image = image or V.image(V.AVX2)
        return (f"build the tiny model there with the image (it needs torch; the image must be on the host first: "
                f"`ktdeploy image build`, or `ktdeploy image load` of a `ktdeploy image save` tarball): docker run "
                f"--rm -v {parent}:{parent} -v {data}:{data} {image} tiny-model {model} --data-dir {data}")
    return (f"download the checkpoint into {model} on the host (e.g. `huggingface-cli download ORG/NAME --local-dir "
            f"{model}`), or upload a local copy: ktdeploy up --sync-model LOCAL_DIR ...")


def _config(model: str, facts: DataFacts) -> tuple[dict[str, Any] | None, str]:
    e = facts.get("read", posixpath.join(model, "config.json"))
    if e is None or not e.ok:
        return None, "missing"
    try:
        cfg: Any = json.loads(e.content)
    except (ValueError, RecursionError):
        return None, "not JSON" + (" (or larger than 64 KiB)" if e.size > len(e.content) else "")
    return (cfg, "") if isinstance(cfg, dict) else (None, "not a JSON object")


def _expected_bytes(cfg: dict[str, Any]) -> tuple[float, str] | None:
    """(bytes the checkpoint should hold, how that was reckoned) from config.json, or None when the planner does
    not know the architecture."""
    from ktdeploy.core.sizing.model_config import parse_model_config

    try:
        arch = parse_model_config(cfg)
    except (KtdeployError, ValueError, TypeError, KeyError):
        return None
    per = EXPERT_BYTES.get(arch.native_format, 2.0)
    total = arch.routed_expert_params * per + arch.non_expert_params * 2.0
    n = arch.total_params
    count = f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
    return total, f"{count} parameters, routed experts in {arch.native_format}"


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def model_checks(train: Mapping[str, Any], facts: DataFacts, image: str | None = None) -> list[CheckResult]:
    model = TrainKeys(train).model_name_or_path
    if not isinstance(model, str):
        return []
    if not model.startswith("/"):
        return [CheckResult(name=CheckName.MODEL_WEIGHTS, status="skip",
                            detail=f"train.model_name_or_path {model} is not a host path: loaded by name at run time")]
    files = file_sizes(facts.get("sizes", model))
    if files is None:
        if facts.get("sizes", model) is None:
            return []   # not gathered (a caller that only read config.json)
        return [CheckResult(name=CheckName.MODEL_CONFIG, status="fail", detail=f"the model folder {model} does not exist",
                            fix=f"Put the model there: {how_to_get(train, image)}.", data={"path": model})]
    out: list[CheckResult] = []
    cfg, why = _config(model, facts)
    if cfg is None:
        out.append(CheckResult(
            name=CheckName.MODEL_CONFIG, status="fail",
            detail=f"{model}/config.json is {why}" + (f" ({len(files)} file(s) in the folder)" if files else
                                                       " (the folder is empty)"),
            fix=f"Put the whole model there: {how_to_get(train, image)}.", data={"files": len(files)}))
    else:
        tc = cfg.get("text_config")
        mt = cfg.get("model_type") or (tc.get("model_type") if isinstance(tc, dict) else None)
        out.append(CheckResult(name=CheckName.MODEL_CONFIG, status="pass", detail=f"{model}/config.json (model_type {mt})"))
    out.append(_tokenizer_check(model, files, train, image))
    out.append(_weights_check(model, files, facts, cfg, train, image))
    return out


def _tokenizer_check(model: str, files: dict[str, int], train: Mapping[str, Any],
                     image: str | None) -> CheckResult:
    vocab = next((v for v in TOKENIZER_VOCABS if all(files.get(n, 0) > 0 for n in v)), None)
    missing = [] if "tokenizer_config.json" in files else ["tokenizer_config.json"]
    if vocab is None:
        missing.append("tokenizer.json (or tokenizer.model, or vocab.json + merges.txt)")
    if missing or vocab is None:
        return CheckResult(name=CheckName.MODEL_TOKENIZER, status="fail", detail=f"{model} has no {' and no '.join(missing)}",
                           fix=f"Copy the model's tokenizer files too: {how_to_get(train, image)}.")
    return CheckResult(name=CheckName.MODEL_TOKENIZER, status="pass",
                       detail=f"tokenizer_config.json + {' + '.join(vocab)}")


def _weights_check(model: str, files: dict[str, int], facts: DataFacts, cfg: dict[str, Any] | None,
                   train: Mapping[str, Any], image: str | None) -> CheckResult:
    name, fix = CheckName.MODEL_WEIGHTS, f"Copy the missing weights: {how_to_get(train, image)}."
    index = index_shards(facts.get("shards", posixpath.join(model, INDEX)))
    data: dict[str, Any] = {}
    if index is not None:
        total, shards = index
        if not shards:
            return CheckResult(name=name, status="fail", detail=f"{model}/{INDEX} names no *.safetensors file",
                               fix=f"The index is damaged: {how_to_get(train, image)}.")
        absent = [s for s in shards if s not in files]
        empty = [s for s in shards if files.get(s) == 0]
        if absent or empty:
            bits = ([f"{len(absent)} of {len(shards)} shard(s) missing ({', '.join(absent[:3])}"
                     + (", ..." if len(absent) > 3 else "") + ")"] if absent else []) + \
                   ([f"{len(empty)} empty ({', '.join(empty[:3])})"] if empty else [])
            return CheckResult(name=name, status="fail", detail=f"{model}: " + "; ".join(bits) + f", named by {INDEX}",
                               fix=fix, data={"missing": absent[:50], "empty": empty[:50], "shards": len(shards)})
        held = sum(files[s] for s in shards)
        data = {"shards": len(shards), "bytes": held, "index_total_size": total}
        if total and held < total:
            return CheckResult(name=name, status="fail", data=data,
                               detail=f"{model}: the {len(shards)} shards hold {_gib(held)}, less than the "
                                      f"{_gib(total)} of tensors {INDEX} lists: a shard is cut short",
                               fix=fix)
        what = f"{len(shards)} shard(s), {_gib(held)}, every one {INDEX} names"
    elif files.get(SINGLE, 0) > 0:
        held = files[SINGLE]
        data = {"shards": 1, "bytes": held}
        what = f"{SINGLE}, {_gib(held)}"
    else:
        stray = sorted(n for n in files if n.endswith(".safetensors"))
        bins = sorted(n for n in files if n.endswith(".bin") and n.startswith("pytorch_model"))
        if stray:
            return CheckResult(name=name, status="fail", fix=f"Copy {INDEX} too: {how_to_get(train, image)}.",
                               detail=f"{model} has {len(stray)} *.safetensors file(s) but no {INDEX} to say "
                                      "which tensors they hold")
        if bins:
            return CheckResult(name=name, status="warn", detail=f"{model} has only PyTorch *.bin weights",
                               fix="Use the safetensors release of the model (KT reads the routed experts from "
                                   "*.safetensors).")
        return CheckResult(name=name, status="fail", detail=f"{model} holds no model weights (*.safetensors)",
                           fix=fix)
    expected = _expected_bytes(cfg) if cfg is not None else None
    if expected is None:
        return CheckResult(name=name, status="pass", detail=what, data=data)
    want, basis = expected
    data.update(expected_bytes=int(want), basis=basis)
    if held < TOO_SMALL * want:
        return CheckResult(name=name, status="fail", data=data, fix=fix,
                           detail=f"{model}: {what}, but config.json implies ~{_gib(want)} ({basis}): "
                                  "weights are missing or cut short")
    if held > TOO_LARGE * want:
        return CheckResult(name=name, status="warn", data=data,
                           detail=f"{model}: {what}, {held / want:.1f}x the ~{_gib(want)} config.json implies "
                                  f"({basis}): not the format config.json names (float32?)",
                           fix="Use the checkpoint whose dtype config.json names (BF16 for native BF16 runs).")
    return CheckResult(name=name, status="pass", data=data,
                       detail=f"{what}; config.json implies ~{_gib(want)} ({basis})")
