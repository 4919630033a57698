"""Doctor's data/weights checks on a real SSH test host with a real dataset_info.json (core/checks/data.py)."""

from __future__ import annotations

import json

import pytest

from ktdeploy.controller.doctor import doctor
from ktdeploy.core.recipe.document import load_recipe

pytestmark = pytest.mark.docker

INFO = {"alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}, "broken": {"file_name": "broken.jsonl"}}
ROWS = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(2000)]  # > 64 KiB: bounded read


@pytest.fixture(scope="module")
def datahost(host_pool):
    h = host_pool.start("oracle-data", docker_socket=False)
    model = "/data/models/Qwen3-235B-A22B-Instruct-2507"
    script = f"""
set -e
mkdir -p /data/datasets {model} {model}-INT8 /data/models/nonexpert /data/output
cat > /data/datasets/dataset_info.json <<'X'
{json.dumps(INFO)}
X
cat > /data/datasets/alpaca_en_demo.json <<'X'
{json.dumps(ROWS)}
X
printf '{{"a": 1}}\\nnot json\\n' > /data/datasets/broken.jsonl
echo '{{"model_type": "qwen3_moe"}}' > {model}/config.json
"""
    h.exec("sh", "-c", script)
    yield h
    h.stop()


def _report(h, dataset: str, template: str = "qwen3_nothink"):
    recipe = load_recipe("recipes/qwen3-235b-int8-lora.yaml",
                         [f"train.dataset={dataset}", f"train.template={template}"])
    rep = doctor(h.connect(), recipe)
    return {c.name: c for c in rep.checks}


def test_real_dataset_passes_and_unconverted_weights_say_where_they_come_from(datahost):
    c = _report(datahost, "alpaca_en_demo")
    assert c["data.dataset_info"].status == "pass"
    assert c["data.dataset_files"].status == "pass"          # first rows of a 100+ KiB JSON array parse
    assert c["model.template_family"].status == "pass"
    w = c["weights.converted"]
    assert w.status == "fail" and "convert the experts of /data/models/Qwen3-235B-A22B-Instruct-2507" in w.fix
    assert "ktdeploy prepare-weights" in w.fix and "--format int8" in w.fix


def test_placeholder_missing_broken_and_template(datahost):
    c = _report(datahost, "your_dataset,broken,nosuch", template="qwen3_5")
    assert c["data.dataset_placeholder"].status == "fail"
    assert c["data.dataset_info"].status == "fail" and "nosuch" in c["data.dataset_info"].detail
    assert c["data.dataset_files"].status == "fail" and "broken.jsonl" in c["data.dataset_files"].detail
    assert c["model.template_family"].status == "warn"
    wp = "/data/models/Qwen3-235B-A22B-Instruct-2507-INT8"
    datahost.exec("sh", "-c", f"touch {wp}/layer0.kt")     # a flat .kt file: not a tree kt-kernel loads
    assert _report(datahost, "alpaca_en_demo")["weights.converted"].status == "fail"
    datahost.exec("sh", "-c", f"mkdir -p {wp}/_layer_0/_numa_0 && touch {wp}/kt-weight-manifest.json && rm {wp}/layer0.kt")
    assert _report(datahost, "alpaca_en_demo")["weights.converted"].status == "pass"


def test_the_model_a_run_loads_is_checked_over_ssh(datahost):
    """model.* on a real host: a folder with only config.json fails the tokenizer and the weights; an index naming
    two shards with one of them absent names it (the host's own grep/sort/wc answer, through SSH)."""
    m = "/data/models/Qwen3-235B-A22B-Instruct-2507"
    c = _report(datahost, "alpaca_en_demo")
    assert c["model.config"].status == "pass"
    assert c["model.tokenizer"].status == "fail" and "tokenizer_config.json" in c["model.tokenizer"].detail
    assert c["model.weights"].status == "fail" and "holds no model weights" in c["model.weights"].detail
    index = json.dumps({"metadata": {"total_size": 1000}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    datahost.exec("sh", "-c", f"cd {m} && printf '%s' '{index}' > model.safetensors.index.json && "
                              "truncate -s 4096 model-00001-of-00002.safetensors && echo '{}' > tokenizer_config.json "
                              "&& echo '{}' > tokenizer.json")
    c = _report(datahost, "alpaca_en_demo")
    assert c["model.tokenizer"].status == "pass"
    w = c["model.weights"]
    assert w.status == "fail" and "1 of 2 shard(s) missing (model-00002-of-00002.safetensors)" in w.detail, w.detail
    datahost.exec("sh", "-c", f"truncate -s 4096 {m}/model-00002-of-00002.safetensors")
    assert _report(datahost, "alpaca_en_demo")["model.weights"].status == "pass"
