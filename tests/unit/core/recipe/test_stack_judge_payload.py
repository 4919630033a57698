"""The stack judge's controller half, without the stack: what is sent (the rendered files), how the answer is read
(every malformed answer is "broken", never a crash), how refusals land on recipe keys, and the runner's errors.

The judge itself (ktdeploy/agent/stack_judge.py) runs against the real stack in tests/integration/test_stack_judge.py
(full image) and says "absent" in the reduced image (tests/integration/test_image.py). Here it runs for real too:
this Python has ktdeploy but no torch/LlamaFactory, so the judge must answer "absent" (exit 7) and name them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ktdeploy.controller import stack_judge_runner as runner
from ktdeploy.core.checks.stack import judge_check
from ktdeploy.core.errors import ConnectError, StackUnavailable
from ktdeploy.core.recipe import load_recipe, render
from ktdeploy.core.recipe.stack_judge_payload import (
    BOOTSTRAP,
    MARKER,
    Refusal,
    findings,
    key_of,
    merge,
    parse_output,
    payload,
)
from tests.fakes.connector import FakeConnector, fail, ok

ROOT = Path(__file__).resolve().parents[4]
TINY = ROOT / "recipes" / "tiny-moe-lora.yaml"


def answer(**data) -> str:
    return "noise from torch\n" + MARKER + json.dumps({"schema": 1, **data}) + "\n"


def test_payload_is_the_rendered_files_and_the_launch():
    r = load_recipe(TINY)
    data = json.loads(payload(render(r)))
    assert data["train_yaml"] == render(r).train_yaml and data["accelerate_yaml"] == render(r).accelerate_yaml
    assert data["launch_argv"][:2] == ["accelerate", "launch"] and data["env"] == {"CUDA_VISIBLE_DEVICES": "0"}


def test_in_a_container_the_gpus_are_renumbered():
    r = load_recipe(ROOT / "recipes" / "qwen35-397b-bf16-lora.yaml", ["deploy.gpus=[2,3]"])
    assert json.loads(runner.judge_payload(r))["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert json.loads(runner.judge_payload(r, in_container=True))["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("stdout,rc,status", [
    ("", 1, "broken"),
    ("Traceback ...\n", 1, "broken"),
    (MARKER + "{not json\n", 0, "broken"),
    (MARKER + "[1, 2]\n", 0, "broken"),
    (MARKER + json.dumps({"status": "maybe"}) + "\n", 0, "broken"),
    (MARKER + json.dumps({"status": "refused", "refusals": []}) + "\n", 2, "broken"),
    (MARKER + json.dumps({"status": "refused", "refusals": [{"stage": "elsewhere", "message": "x"}]}) + "\n", 2,
     "broken"),
    (answer(status="accepted", stages={"accelerate": "accepted"}), 0, "accepted"),
    (answer(status="absent", missing=["torch"]), 7, "absent"),
    # an "accepted" answer that lists refusals is a refusal
    (answer(status="accepted", refusals=[{"stage": "kt-kernel", "error_type": "ValueError", "message": "m"}]), 0,
     "refused"),
])
def test_every_answer_is_read_and_a_malformed_one_is_broken(stdout, rc, status):
    assert parse_output(stdout, rc, "stderr tail").status == status


def test_text_from_the_image_is_one_printable_line():
    r = parse_output(answer(status="refused", refusals=[{"stage": "llamafactory", "error_type": "ValueError",
                                                         "message": "\x1b[31mred\x1b[0m is not\na valid\x07 x"}]), 2)
    msg = r.refusals[0].message
    assert "\x1b" not in msg and "\x07" not in msg and "\n" not in msg and msg.isprintable()
    assert "\\u001b[31mred" in msg and "is not a valid" in msg


def test_answer_fields_are_bounded():
    big = "x" * 100_000
    r = parse_output(answer(status="refused", refusals=[{"stage": "llamafactory", "error_type": big,
                                                         "message": big, "where": big}],
                            bypassed=[big] * 200, versions={big: big}), 2)
    assert len(r.refusals[0].message) <= 1500 and len(r.refusals[0].error_type) <= 80
    assert len(r.bypassed) <= 50 and all(len(b) <= 300 for b in r.bypassed)


TRAIN = {"streaming": True, "lora_rank": 8, "kt_config": {"kt_backend": " auto"}, "use_kt": True}
ACC = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1}}


@pytest.mark.parametrize("stage,message,path", [
    # two keys named: the one the recipe sets wins
    ("llamafactory", "Please specify `max_steps` in streaming mode.", "train.streaming"),
    ("llamafactory", "Some keys are not used by the HfArgumentParser: ['foo_bar']", "train.foo_bar"),
    ("kt-kernel", "unknown kt_backend ' auto'; expected one of [...]", "train.kt_config.kt_backend"),
    ("kt-kernel", "FP8 SFT requires kt_lora_rank > 0", "train.lora_rank"),
    ("kt-kernel", "kt_weight_lifecycle='ephemeral' is supported only for INT8 .kt weights",
     "train.kt_config.kt_weight_lifecycle"),
    ("accelerate", "KT plugin supports FSDP2, but not FSDP1.", "accelerate.fsdp_config.fsdp_version"),
    ("accelerate", "'fsdp' is not a valid DistributedType", "accelerate.distributed_type"),
    ("accelerate", "The config file at /tmp/x/accelerate.yaml had unknown keys (['foo']), please", "accelerate.foo"),
    ("llamafactory", "something nobody names", "train"),
    ("llamafactory", "Cosine is not a valid SchedulerType, please select one of ['linear']", "train.lr_scheduler_type"),
    ("llamafactory", "never is not a valid SaveStrategy", "train.save_strategy"),
])
def test_a_refusal_lands_on_the_key_it_names(stage, message, path):
    assert key_of(Refusal(stage, "ValueError", message), TRAIN, ACC) == path


def test_findings_quote_the_stack_and_sit_beside_ktdeploys_own():
    r = load_recipe(TINY)
    result = parse_output(answer(status="refused", refusals=[
        {"stage": "llamafactory", "error_type": "ValueError", "message": "Please make sure eval_dataset be provided "
         "or val_size >1e-6", "where": "llamafactory.hparams.get_train_args"}]), 2)
    found = findings(result, {**r.train, "do_eval": True}, r.accelerate, r.raw.source.where)
    assert [f.rule for f in found] == ["stack.llamafactory"] and found[0].path == "train.eval_dataset"
    assert "LlamaFactory-KT refuses it: ValueError: Please make sure eval_dataset" in found[0].message
    assert found[0].fix and found[0].file and found[0].line
    from ktdeploy.core.recipe import validate

    merged = merge(validate(r), found)
    assert merged[0].severity == "error" and found[0] in merged


def test_judge_check_states_the_verdict():
    ok_ = judge_check(parse_output(answer(status="accepted", seconds=12.5, versions={"llamafactory-kt": "0.9.6.dev0",
                                                                                     "kt-kernel": "0.7.2"}), 0), [])
    assert ok_.status == "pass" and "accepts" in ok_.detail and "0.9.6.dev0" in ok_.detail and "0.7.2" in ok_.detail
    absent = judge_check(parse_output(answer(status="absent", missing=["torch", "llamafactory"]), 7), [])
    assert absent.status == "fail" and "torch, llamafactory" in absent.detail and "--waive stack.judge" in absent.fix


def test_the_judge_in_a_python_without_the_stack_says_absent():
    """For real: this interpreter has ktdeploy but not torch/LlamaFactory (the controller installs light)."""
    r = load_recipe(TINY)
    result = runner.judge_with(runner.LocalConnector(), runner.judge_payload(r), python=sys.executable)
    assert result.status == "absent" and "torch" in result.missing and "llamafactory" in result.missing
    with pytest.raises(StackUnavailable) as e:
        runner.require_judged(result, "this Python")
    assert e.value.exit_code == 7 and "no LlamaFactory/kt-kernel stack" in e.value.message


def test_a_python_without_ktdeploy_says_absent_too(tmp_path):
    """The bootstrap is stdlib-only: an image without ktdeploy's judge (a test double) answers, not a traceback."""
    conn = runner.LocalConnector()
    r = conn.run([sys.executable, "-I", "-S", "-c", BOOTSTRAP, "-"], input="{}", timeout=60)
    result = parse_output(r.stdout, r.rc, r.stderr)
    assert r.rc == 7 and result.status == "absent" and result.missing == ["ktdeploy"]


def test_a_missing_image_is_exit_7_and_no_docker_is_exit_3():
    conn = FakeConnector().on(("docker", "image", "inspect"), fail(1, "No such image"))
    with pytest.raises(StackUnavailable) as e:
        runner.judge_in_image("ktsft:amx", "{}", connector=conn)
    assert e.value.exit_code == 7 and "not on" in e.value.message
    assert not conn.ran("docker", "run")
    conn = FakeConnector().on(("docker",), fail(127, "docker: command not found"))
    with pytest.raises(ConnectError):
        runner.judge_in_image("ktsft:amx", "{}", connector=conn)


def test_the_judge_container_is_bounded_and_removed():
    conn = (FakeConnector().on(("docker", "image", "inspect"), ok("sha256:1"))
            .on(("docker", "run"), ok(answer(status="accepted")))
            .on(("docker", "rm"), ok()))
    result = runner.judge_in_image("ktsft:avx512", "{}", connector=conn)
    assert result.status == "accepted"
    argv = conn.ran("docker", "run")[0]
    for flag in ("--network", "none", "--memory", "--pids-limit", "--cap-drop", "ALL", "--pull", "never"):
        assert flag in argv
    name = argv[argv.index("--name") + 1]
    assert conn.ran("docker", "rm", "--force", "--", name)


def test_auto_judges_with_the_first_variant_present():
    r = load_recipe(TINY)
    conn = (FakeConnector().on(("docker", "image", "inspect", "--format", "{{.Id}}", "--", "ktsft:amx"), fail(1))
            .on(("docker", "image", "inspect"), ok("sha256:1")))
    assert runner.image_for(r, conn) == "ktsft:avx512_bf16"   # the ladder's next build after amx
    assert runner.image_for(load_recipe(TINY, ["deploy.image=avx2"]), conn) == "ktsft:avx2"
    assert runner.image_for(load_recipe(TINY, ["deploy.image=avx512"]), conn) == "ktsft:avx512_bf16"   # old name
    assert runner.image_for(load_recipe(TINY, ["deploy.image=my/img:1"]), conn) == "my/img:1"


# ---------------------------------------------------------------- the model skeleton (issue #49)

MODELS = ROOT / "recipes" / "models"


def test_the_payload_carries_the_models_config_and_where_it_came_from():
    r = load_recipe(TINY)
    data = json.loads(runner.judge_payload(r))
    assert data["model_config"]["source"].endswith("models/tiny-qwen3-moe.json")   # the shipped fallback
    assert json.loads(data["model_config"]["text"])["model_type"] == "qwen3_moe"
    own = runner.model_config_for(r, MODELS / "tiny-qwen3-moe-fp8.json")
    assert own is not None and json.loads(runner.judge_payload(r, model_config=own))["model_config"]["source"] == \
        str(MODELS / "tiny-qwen3-moe-fp8.json")


def test_the_models_own_directory_comes_before_the_shipped_config(tmp_path):
    model = tmp_path / "tiny-qwen3-moe"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "mine"}')
    r = load_recipe(TINY, [f"train.model_name_or_path={model}"])
    mc = runner.model_config_for(r)
    assert mc is not None and mc.source == str(model / "config.json") and "mine" in mc.text
    assert runner.model_config_for(load_recipe(TINY, ["train.model_name_or_path=/srv/nowhere/unknown-model"])) is None
    assert "model_config" not in json.loads(payload(render(r), None))


def test_an_unreadable_model_config_is_a_usage_error(tmp_path):
    from ktdeploy.core.errors import UsageError

    with pytest.raises(UsageError):
        runner.model_config_for(load_recipe(TINY), tmp_path / "missing.json")


def test_a_skeleton_refusal_lands_on_the_key_the_judge_names_and_its_fix_says_what_to_do():
    r = load_recipe(TINY)
    result = parse_output(answer(status="refused", refusals=[
        {"stage": "llamafactory", "error_type": "ValueError", "key": "train.lora_target", "choices": ["q_proj", "v_proj"],
         "message": "Target modules {'q_projj'} not found in the base model. Please check the target modules and try "
                    "again.", "where": "llamafactory.model.adapter.init_adapter (PEFT get_peft_model) on the model "
                                       "skeleton"},
        {"stage": "model", "error_type": "ValueError", "key": "train.model_name_or_path", "message": "unknown type"},
        {"stage": "kt-kernel", "error_type": "KTAMXConfigError", "key": "not a key; rm -rf /",
         "message": "FP8 SFT requires each TP intermediate slice divisible by 128; intermediate_size=256, "
                    "threadpool_count=4"}]), 2)
    found = findings(result, r.train, r.accelerate, r.raw.source.where)
    assert [f.path for f in found] == ["train.lora_target", "train.model_name_or_path",
                                       "train.kt_config.kt_threadpool_count"]
    assert [f.rule for f in found] == ["stack.llamafactory", "stack.model", "stack.kt-kernel"]
    assert "module names this model has" in found[0].fix and "linear modules: q_proj, v_proj" in found[0].fix
    assert found[0].line
    assert found[1].message.startswith("transformers refuses it")


def test_the_skeletons_summary_is_read_back_bounded():
    big = "x" * 10_000
    r = parse_output(answer(status="accepted", skeleton={
        "status": "accepted", "source": big, "steps": {f"s{i}": big for i in range(40)}, "seconds": 12.2,
        "modules": 7491, "lora_targets": ["q_proj"] * 100, "extra": big}), 0)
    sk = r.skeleton
    assert sk["status"] == "accepted" and sk["seconds"] == 12.2 and sk["modules"] == 7491
    assert len(sk["source"]) <= 300 and len(sk["steps"]) == 10 and len(sk["lora_targets"]) == 50 and "extra" not in sk
    assert parse_output(answer(status="accepted", skeleton="nonsense"), 0).skeleton == {}
