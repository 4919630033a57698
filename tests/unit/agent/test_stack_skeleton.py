"""The model skeleton's pure parts (issue #49): where the config comes from, what is said when there is none, which
key an adapter refusal is about. The skeleton itself runs on the real stack in tests/integration/test_stack_skeleton.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from ktdeploy.agent import stack_skeleton as sks
from ktdeploy.agent.stack_judge import skeleton_stage


def test_the_models_own_directory_wins_over_a_sent_config(tmp_path):
    own = tmp_path / "Model"
    own.mkdir()
    (own / "config.json").write_text("{}")
    got = sks.locate(str(own), '{"model_type": "sent"}', "recipes/models/x.json", tmp_path / "scratch")
    assert isinstance(got, sks.ModelSource) and got.own and got.directory == own


def test_a_sent_config_is_written_where_the_judge_builds_from_it(tmp_path):
    got = sks.locate("/srv/nowhere/Model", '{"model_type": "qwen3_moe"}', "recipes/models/x.json", tmp_path)
    assert isinstance(got, sks.ModelSource) and not got.own and got.label == "recipes/models/x.json"
    assert (got.directory / "config.json").read_text() == '{"model_type": "qwen3_moe"}'


def test_without_a_config_the_skipped_checks_and_the_way_to_run_them_are_said(tmp_path):
    why = sks.locate("/srv/nowhere/Model", None, "", tmp_path)
    assert isinstance(why, str)
    for words in ("/srv/nowhere/Model/config.json", "LoRA targets", "kt-kernel's model checks", "`up` and `train`",
                  "--model-config"):
        assert words in why
    too_big = sks.locate(None, "x" * (sks.MAX_CONFIG_BYTES + 1), "big.json", tmp_path)
    assert isinstance(too_big, str) and "larger than" in too_big


def test_the_judge_reports_the_skip_as_a_stage_and_under_bypassed(tmp_path):
    summary, refusals, bypassed = skeleton_stage(SimpleNamespace(model_name_or_path="/srv/nowhere/Model"),
                                                 SimpleNamespace(), True, None, tmp_path, False)
    assert summary["status"] == "skipped" and refusals == [] and bypassed == [summary["detail"]]


def _ft(**kw):
    return SimpleNamespace(**{"finetuning_type": "lora", "lora_target": ["q_proj"], "additional_target": None,
                              "freeze_extra_modules": None, **kw})


def test_an_adapter_refusal_is_about_the_key_that_named_the_modules():
    none = TypeError("object of type 'NoneType' has no len()")
    assert sks.adapter_key(none, _ft(lora_target=None)) == "train.lora_target"
    missing = ValueError("Target modules {'q_projj'} not found in the base model.")
    assert sks.adapter_key(missing, _ft(lora_target=["q_projj"])) == "train.lora_target"
    extra = ValueError("Target modules {'embed_tokenz'} not found in the base model.")
    assert sks.adapter_key(extra, _ft(additional_target=["embed_tokenz"])) == "train.additional_target"
    freeze = ValueError("Module mlp2 is not found, please choose from mlp, self_attn")
    assert sks.adapter_key(freeze, _ft(finetuning_type="freeze")) == "train.freeze_trainable_modules"
    assert sks.adapter_key(freeze, _ft(finetuning_type="freeze", freeze_extra_modules=["mlp2"])) == \
        "train.freeze_extra_modules"
