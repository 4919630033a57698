"""Doctor data/weights checks: pure parsers of DATA_SCRIPT output and pure checks (core/checks/data.py)."""

from __future__ import annotations

import pytest

from ktdeploy.core.checks.data import data_checks, data_requests, file_requests
from ktdeploy.core.facts.data_listing import first_rows, parse_data_output

TRAIN = {"dataset": "demo,bad", "dataset_dir": "/d", "model_name_or_path": "/m/M", "template": "qwen3_5",
         "kt_weight_path": "/m/W"}


def _out(*blocks: tuple[str, str, int, str, str]) -> str:
    """DATA_SCRIPT's answer: each entry's header, then its body lines framed with '|'."""
    return "".join(f"@@KTD-DATA\t{k}\t{s}\t{n}\t{p}\n" + "".join(f"|{ln}\n" for ln in f"{c}\n".split("\n")[:-1])
                   for k, s, n, p, c in blocks)


INFO = '{"demo": {"file_name": "demo.jsonl"}, "bad": {"file_name": "bad.json"}}'


def _checks(extra=(), train=TRAIN, setup="int8"):
    text = _out(("read", "ok", len(INFO), "/d/dataset_info.json", INFO),
                ("read", "ok", 30, "/m/M/config.json", '{"model_type": "qwen3_5_moe"}'),
                ("ls", "ok", 0, "/m/W", "config.json\nmodel.safetensors"), *extra)
    facts = parse_data_output(text)
    return {c.name: c for c in data_checks(train, setup, facts)}, facts


def test_requests_are_bounded_reads_of_the_recipe_paths():
    assert data_requests(TRAIN) == [("read", "/d/dataset_info.json"), ("read", "/m/M/config.json"), ("sizes", "/m/M"),
                                    ("shards", "/m/M/model.safetensors.index.json"), ("ls", "/m/W"),
                                    ("read", "/m/W/config.json")]
    _, facts = _checks()
    assert file_requests(TRAIN, facts) == [("read", "/d/demo.jsonl"), ("read", "/d/bad.json")]


def test_names_files_template_and_weights():
    c, _ = _checks([("read", "ok", 20, "/d/demo.jsonl", '{"q": 1}\n{"q": 2}'),
                    ("read", "ok", 10, "/d/bad.json", '[{"q": 1}, oops]')])
    assert c["data.dataset_info"].status == "pass"
    assert c["data.dataset_files"].status == "fail" and "bad.json" in c["data.dataset_files"].detail
    assert c["model.template_family"].status == "pass"
    assert c["weights.converted"].status == "fail"
    fix = c["weights.converted"].fix
    # `kt quant` exists in the image but its script (site-packages/scripts/convert_cpu_weights.py) does not: the fix is
    # ktdeploy's own command (kt-kernel's quantizer), never a script the user must fetch
    assert "ktdeploy prepare-weights /m/M --format int8 -o /m/W" in fix and "convert_cpu_weights" not in fix


def test_missing_name_placeholder_and_wrong_template():
    train = dict(TRAIN, dataset="your_dataset,other", template="qwen3")
    c, _ = _checks(train=train)
    assert c["data.dataset_placeholder"].status == "fail"
    assert c["data.dataset_info"].status == "fail" and "other" in c["data.dataset_info"].detail
    assert c["model.template_family"].status == "warn" and "qwen3_5" in c["model.template_family"].fix


def test_converted_int8_weights_pass():
    """What kt-kernel's validate_persistent_int8_weights reads first: one manifest and the _layer_N folders."""
    text = _out(("ls", "ok", 0, "/m/W", "kt-weight-manifest.json\n_layer_0\n_layer_1"))
    c = {x.name: x for x in data_checks({"kt_weight_path": "/m/W", "model_name_or_path": "/m/M"}, "int8",
                                        parse_data_output(text))}
    assert c["weights.converted"].status == "pass"


@pytest.mark.parametrize("listing", ["layer0.kt\nlayer1.kt", "_layer_0\n_layer_1",
                                     "kt-weight-manifest.json\nkt-ephemeral-manifest.json\n_layer_0"])
def test_int8_trees_kt_kernel_refuses_fail(listing):
    text = _out(("ls", "ok", 0, "/m/W", listing))
    c = {x.name: x for x in data_checks({"kt_weight_path": "/m/W", "model_name_or_path": "/m/M"}, "int8",
                                        parse_data_output(text))}
    assert c["weights.converted"].status == "fail"


@pytest.mark.parametrize("config,status", [('{"model_type": "qwen3_moe"}', "fail"),
                                           ('{"quantization_config": {"quant_method": "fp8"}}', "pass")])
def test_int8_non_expert_cache_needs_an_fp8_source(config, status):
    text = _out(("ls", "ok", 0, "/m/W", "kt-weight-manifest.json\n_layer_0"), ("read", "ok", 0, "/m/M/config.json", config))
    train = {"kt_weight_path": "/m/W", "model_name_or_path": "/m/M", "kt_non_expert_weight_path": "/m/NE"}
    c = {x.name: x for x in data_checks(train, "int8", parse_data_output(text))}
    assert c["weights.non_expert_source"].status == status
    if status == "fail":
        assert "remove kt_non_expert_weight_path" in c["weights.non_expert_source"].fix


def test_first_rows_of_a_truncated_json_array():
    rows, why = first_rows('[{"a": 1}, {"a": 2}, {"a": 3', False, "x.json")
    assert rows == [{"a": 1}, {"a": 2}] and not why
    rows, why = first_rows('{"a": 1}\n{"a": 2}\n{"a"', False, "x.jsonl")
    assert rows == [{"a": 1}, {"a": 2}]
    assert first_rows("{}", True, "x.json")[0] is None


def test_first_rows_reports_an_over_long_integer_instead_of_crashing():
    # json raises a plain ValueError (no .msg) for an int over Python's digit limit; reading .msg crashed doctor
    big = "1" * 5000
    for content, complete, name in (("[" + big + "]", True, "x.json"), ('{"a": ' + big + "}", True, "x.jsonl"),
                                    ("[" + big, False, "x.json")):
        rows, why = first_rows(content, complete, name)
        assert rows is None and "digits" in why, (name, why)


def test_native_fp8_checkpoint_as_kt_weight_path_is_named_whatever_its_path():
    cfg = '{"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8"}}'
    text = _out(("ls", "ok", 0, "/m/DeepSeek-V3", "config.json\nmodel-00001.safetensors"),
                ("read", "ok", len(cfg), "/m/DeepSeek-V3/config.json", cfg))
    c = {x.name: x for x in data_checks({"kt_weight_path": "/m/DeepSeek-V3", "model_name_or_path": "/m/M"}, "int8",
                                        parse_data_output(text))}
    w = c["weights.converted"]
    assert w.status == "fail" and "native FP8 checkpoint" in w.detail and "kt_expert_weight_format: fp8" in w.fix


def test_start_files_the_stack_opens_are_on_the_host():
    train = {**TRAIN, "use_kt": True, "adapter_name_or_path": "/o/run1", "adapter_folder": "adapter",
             "new_special_tokens_config": "/d/tokens.yaml"}
    wanted = [("ls", "/o/run1/adapter"), ("read", "/d/tokens.yaml")]
    assert data_requests(train)[-2:] == wanted
    c, _ = _checks([("ls", "missing", 0, "/o/run1/adapter", ""), ("read", "ok", 8, "/d/tokens.yaml", "<a>: x")],
                   train=train)
    assert c["data.start_files"].status == "fail"
    assert "adapter_name_or_path /o/run1/adapter (no such directory)" in c["data.start_files"].detail
    assert "tokens.yaml" not in c["data.start_files"].detail
    c, _ = _checks([("ls", "ok", 0, "/o/run1/adapter", "adapter_config.json"),
                    ("read", "ok", 8, "/d/tokens.yaml", "<a>: x")], train=train)
    assert c["data.start_files"].status == "pass"
    # without KT LlamaFactory hands the adapter to PEFT (a hub id works): not a start file; a relative path is check's
    assert data_requests({**train, "use_kt": False, "new_special_tokens_config": "t.yaml"}) == data_requests(TRAIN)
    assert "data.start_files" not in _checks()[0]


@pytest.mark.parametrize("listing, ok", [
    ("_layer_0\n_layer_1\nktdeploy-weights.json", True),     # what prepare-weights writes (kt-kernel's loader layout)
    ("model.kt\n", True),                                    # the older converter's flat layout
    ("config.json\nmodel.safetensors", False),               # the original checkpoint
    ("", False),
])
def test_amxint4_tree_is_recognised(listing, ok):
    """Found on the GPU machine: an AMXINT4 tree from `prepare-weights` (_layer_N/_numa_M/*.kt) was called 'no
    converted files' because only top-level .kt names counted (bench/results/formats/gpu_formats_results.json)."""
    text = _out(("read", "ok", len(INFO), "/d/dataset_info.json", INFO),
                ("read", "ok", 30, "/m/M/config.json", '{"model_type": "qwen3_5_moe"}'),
                ("ls", "ok", 0, "/m/W", listing))
    c = {c.name: c for c in data_checks(TRAIN, "int4", parse_data_output(text))}
    assert (c["weights.converted"].status == "pass") is ok, c["weights.converted"].detail
