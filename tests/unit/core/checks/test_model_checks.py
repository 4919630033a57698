"""Doctor checks the model a run will load: config, tokenizer, every shard the index names, sizes against
config.json (core/checks/model.py). The host's answers come from the real DATA_SCRIPT run on folders here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ktdeploy.agent.tiny import SIZES
from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.controller.doctor import gather_data
from ktdeploy.core.checks.data import data_checks
from ktdeploy.core.checks.model import _expected_bytes

TINY = SIZES["small"].config_dict()
WANT = int(_expected_bytes(TINY)[0])


def checks(model: Path, **train) -> dict:
    t = {"model_name_or_path": str(model), "dataset_dir": str(model.parent / "data"), "dataset": "tiny_sft", **train}
    facts = gather_data(LocalConnector(), t)
    return {c.name: c for c in data_checks(t, "bf16", facts) if c.name.startswith("model.")}


def sparse(p: Path, size: int) -> None:
    with open(p, "wb") as f:
        f.truncate(size)   # the size the host reports (wc -c), without writing 60 MB


def make_model(d: Path, shards: dict[str, int], *, index: bool = True, tokenizer: bool = True, total: int | None = None):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY))
    if tokenizer:
        (d / "tokenizer_config.json").write_text("{}")
        (d / "tokenizer.json").write_text('{"model": {}}')
    for name, size in shards.items():
        sparse(d / name, size)
    if index:
        wm = {f"model.layers.{i}.w": name for i, name in enumerate(sorted(shards))}
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total if total is not None else sum(shards.values()) - 64}, "weight_map": wm}))


def test_an_empty_model_folder_fails_with_how_to_build_the_tiny_model(tmp_path):
    """The issue's case: deploy.volumes.model exists but holds nothing; doctor used to pass it."""
    model = tmp_path / "models" / "tiny-qwen3-moe"
    model.mkdir(parents=True)
    c = checks(model)
    assert {n: r.status for n, r in c.items()} == {"model.config": "fail", "model.tokenizer": "fail",
                                                    "model.weights": "fail"}
    assert "the folder is empty" in c["model.config"].detail
    assert f"tiny-model {model} --data-dir" in c["model.config"].fix and "docker run" in c["model.config"].fix


def test_a_missing_model_folder_fails_once(tmp_path):
    c = checks(tmp_path / "models" / "nothere")
    assert list(c) == ["model.config"] and "does not exist" in c["model.config"].detail
    assert "--sync-model" in c["model.config"].fix and "huggingface-cli download" in c["model.config"].fix


def test_a_whole_tiny_model_passes_with_its_size_against_the_config(tmp_path):
    model = tmp_path / "models" / "tiny-qwen3-moe"
    make_model(model, {"model-00001-of-00002.safetensors": WANT // 2, "model-00002-of-00002.safetensors": WANT // 2})
    c = checks(model)
    assert all(r.status == "pass" for r in c.values()), {n: r.detail for n, r in c.items()}
    assert "2 shard(s)" in c["model.weights"].detail and "32.5M parameters" in c["model.weights"].detail


def test_one_shard_missing_is_named(tmp_path):
    model = tmp_path / "m"
    make_model(model, {"model-00001-of-00003.safetensors": WANT // 3, "model-00002-of-00003.safetensors": WANT // 3,
                       "model-00003-of-00003.safetensors": WANT // 3})
    os.unlink(model / "model-00002-of-00003.safetensors")
    w = checks(model)["model.weights"]
    assert w.status == "fail" and "1 of 3 shard(s) missing (model-00002-of-00003.safetensors)" in w.detail, w.detail


def test_a_shard_cut_short_is_caught_by_the_index_total(tmp_path):
    model = tmp_path / "m"
    make_model(model, {"model-00001-of-00002.safetensors": WANT // 2, "model-00002-of-00002.safetensors": 4096},
               total=WANT)
    w = checks(model)["model.weights"]
    assert w.status == "fail" and "cut short" in w.detail, w.detail


def test_weights_far_smaller_than_the_config_says_fail(tmp_path):
    """No index total to compare with: the parameter count of config.json says the copy is incomplete."""
    model = tmp_path / "m"
    make_model(model, {"model.safetensors": WANT // 10}, index=False)
    w = checks(model)["model.weights"]
    assert w.status == "fail" and "config.json implies" in w.detail and "cut short" in w.detail, w.detail


def test_float32_weights_warn(tmp_path):
    model = tmp_path / "m"
    make_model(model, {"model.safetensors": WANT * 3}, index=False)
    assert checks(model)["model.weights"].status == "warn"


@pytest.mark.parametrize("files,ok", [({"tokenizer_config.json": "{}", "tokenizer.model": "x"}, True),
                                      ({"tokenizer_config.json": "{}", "vocab.json": "{}", "merges.txt": "a b"}, True),
                                      ({"tokenizer_config.json": "{}", "vocab.json": "{}"}, False),
                                      ({"tokenizer.json": "{}"}, False)])
def test_tokenizer_files(tmp_path, files, ok):
    model = tmp_path / "m"
    make_model(model, {"model.safetensors": WANT}, index=False, tokenizer=False)
    for n, text in files.items():
        (model / n).write_text(text)
    assert (checks(model)["model.tokenizer"].status == "pass") is ok


def test_safetensors_without_their_index_fail(tmp_path):
    model = tmp_path / "m"
    make_model(model, {"model-00001-of-00002.safetensors": WANT // 2, "model-00002-of-00002.safetensors": WANT // 2},
               index=False)
    w = checks(model)["model.weights"]
    assert w.status == "fail" and "model.safetensors.index.json" in w.detail


def test_a_hub_name_is_not_looked_for_on_the_host():
    t = {"model_name_or_path": "Qwen/Qwen3-30B-A3B"}
    c = {r.name: r for r in data_checks(t, "bf16", gather_data(LocalConnector(), t))}
    assert c["model.weights"].status == "skip"
