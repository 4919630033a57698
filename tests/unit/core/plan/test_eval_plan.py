"""The EVAL stage in the plan: present only with deploy.eval, after SERVE; what it asks and where it reads."""

from __future__ import annotations

from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.params import EvalParams
from tests.unit.core.plan.test_host_plan import facts, recipe, state


def test_no_deploy_eval_no_stage_and_the_stage_is_last_with_it():
    assert "EVAL" not in [s.name for s in build_plan(recipe(), facts(), state(), UpOptions(host="gpu01")).stages]
    p = build_plan(recipe("deploy.eval.holdout=0.1", "deploy.serve.host=0.0.0.0"), facts(), state(),
                   UpOptions(host="ssh://root@gpu01:22", run_id="r"))
    assert [s.name for s in p.stages][-2:] == ["SERVE", "EVAL"]
    step = p.stage("EVAL").steps[0]
    assert step.action == "eval" and step.id == "eval.run"
    ev = step.typed(EvalParams)
    assert ev.url == "http://gpu01:30000/v1" and ev.source == "holdout" and ev.data_dir.endswith("-holdout")
    assert ev.tuned.endswith(":" + recipe().deploy.serve.lora_name) and ev.base == ev.tuned.split(":")[0]


def test_a_remote_loopback_server_is_planned_unreachable_with_the_tunnel_to_open():
    p = build_plan(recipe("deploy.eval.dataset=tiny_sft"), facts(), state(), UpOptions(host="ssh://root@gpu01:22"))
    ev = p.stage("EVAL").steps[0].typed(EvalParams)
    assert ev.url is None and "ssh -N -L 30000:127.0.0.1:30000" in ev.unreachable


def test_detach_skips_eval_and_compare_base_false_asks_the_tuned_model_only():
    p = build_plan(recipe("deploy.eval.holdout=4"), facts(), state(), UpOptions(host="localhost", detach=True))
    assert p.stage("EVAL").skipped == "--detach"
    p = build_plan(recipe("deploy.eval.holdout=4", "deploy.eval.compare_base=false"), facts(), state(),
                   UpOptions(host="localhost", local=True))
    ev = p.stage("EVAL").steps[0].typed(EvalParams)
    assert ev.base is None and ev.url == "http://127.0.0.1:30000/v1"
