"""up's IMAGE image.check step: the executor runs controller/image_check.image_doctor with the step's parameters
(the training container's GPUs, user, memlock) and the plan's waivers; a failed check stops up (CheckFailed,
exit 1). image_doctor itself is proven against real images in tests/integration/test_image_check.py."""

from __future__ import annotations

import dataclasses

import pytest

from ktdeploy.controller import executor as executor_mod
from ktdeploy.controller.doctor import DoctorReport
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.errors import CheckFailed
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.plan.params import ImageCheckParams
from ktdeploy.core.plan.steps import Plan, Stage, Step, StepAction


def _plan(waived=()) -> tuple[Plan, Step]:
    step = Step("image.check", "img ready", action=StepAction.IMAGE_CHECK, argv=("docker", "run"),
                params=ImageCheckParams(image="ktsft:amx", name="job1-imgcheck", gpus=(2, 3), memlock=False,
                                        user="1000:1000"))
    return Plan(host="fake-host", recipe="r", job="job1", image="ktsft:amx", variant="amx", output_dir="/out",
                adapter_dir="/out/adapter", job_dir="/job", stages=(Stage("IMAGE", "image", (step,)),),
                waived=tuple(waived)), step


def _run(monkeypatch, tmp_path, checks, waived=()):
    seen = {}

    def fake_image_doctor(conn, image, **kw):
        seen.update(kw, image=image)
        return DoctorReport(HostFacts(), [CheckResult(**c) for c in checks])

    monkeypatch.setattr(executor_mod, "image_doctor", fake_image_doctor)
    plan, step = _plan(waived)
    ex = Executor(object(), Emitter(RunRecord.create("r", root=tmp_path / "runs")), plan, poll_s=0, facts=HostFacts())
    ex.apply()
    return ex, seen


FAILING = [{"name": "stack.python_headers", "status": "fail", "layer": "container", "detail": "no Python.h",
            "fix": "install python3.11-dev"},
           {"name": "gpu.present", "status": "fail", "layer": "container", "detail": "no GPU"},
           {"name": "stack.torch", "status": "pass", "layer": "container"}]


def test_failed_check_stops_up_with_the_checks(monkeypatch, tmp_path):
    with pytest.raises(CheckFailed) as e:
        _run(monkeypatch, tmp_path, FAILING, waived=("gpu.present",))
    assert e.value.exit_code == 1 and [c.name for c in e.value.results] == ["stack.python_headers"]
    assert "not ready" in e.value.message and "ktsft:amx" in e.value.message


def test_waived_checks_pass_and_the_step_parameters_are_the_training_containers(monkeypatch, tmp_path):
    ex, seen = _run(monkeypatch, tmp_path, FAILING, waived=("gpu.present", "stack.python_headers"))
    assert seen["image"] == "ktsft:amx" and seen["gpus"] == [2, 3] and seen["user"] == "1000:1000"
    assert seen["memlock"] is False and seen["name"] == "job1-imgcheck" and seen["host_facts"] is not None
    ev = [e for e in ex.record.events() if e.get("event") == "image_check"]
    assert ev and ev[0]["failed"] == [] and set(ev[0]["waived"]) == {"gpu.present", "stack.python_headers"}


def test_plan_argv_is_what_image_doctor_runs():
    """The dry-run plan shows the docker run that image_doctor starts: both from docker_argv.image_check."""
    from ktdeploy.core.plan import UpOptions, build_plan
    from ktdeploy.core.plan import docker_argv as dk
    from tests.unit.core.plan.test_host_plan import facts, recipe, state

    p = build_plan(recipe(), facts(), state(), UpOptions())
    s = {st.id: st for _, st in p.steps()}["image.check"]
    pr = s.typed(ImageCheckParams)
    assert list(s.argv) == dk.image_check(pr.image, name=pr.name, gpus=list(pr.gpus) or None,
                                          memlock=pr.memlock, user=pr.user)
    assert dataclasses.asdict(s)["action"] == StepAction.IMAGE_CHECK


REFUSED = [{"name": "stack.judge", "status": "fail", "layer": "container",
            "detail": "the stack refuses the recipe: train.streaming: LlamaFactory-KT refuses it: ...",
            "data": {"status": "refused", "findings": [
                {"severity": "error", "path": "train.streaming", "rule": "stack.llamafactory", "file": "r.yaml",
                 "line": 12, "message": "LlamaFactory-KT refuses it: ValueError: Please specify `max_steps` in "
                                        "streaming mode.", "fix": "change train.streaming ..."}]}},
           {"name": "stack.torch", "status": "pass", "layer": "container"}]


def test_the_stack_refusing_the_recipe_stops_up_with_its_findings(monkeypatch, tmp_path):
    """stack.judge failing alone is the recipe's fault: RecipeError (exit 2) carrying the stack's findings, the same
    report as `ktdeploy check --stack`; the event records them."""
    from ktdeploy.core.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        _run(monkeypatch, tmp_path, REFUSED)
    assert e.value.exit_code == 2 and e.value.key == "stack.judge"
    assert [f.path for f in e.value.findings] == ["train.streaming"]
    assert "max_steps" in e.value.findings[0].message and e.value.findings[0].line == 12


def test_a_refusal_beside_another_failed_check_is_a_failed_check(monkeypatch, tmp_path):
    with pytest.raises(CheckFailed) as e:
        _run(monkeypatch, tmp_path, [*REFUSED, FAILING[0]])
    assert {c.name for c in e.value.results} == {"stack.judge", "stack.python_headers"}


def test_a_waived_judge_lets_up_go_on(monkeypatch, tmp_path):
    ex, _ = _run(monkeypatch, tmp_path, REFUSED, waived=("stack.judge",))
    ev = [e for e in ex.record.events() if e.get("event") == "image_check"]
    assert ev[0]["waived"] == ["stack.judge"] and ev[0]["failed"] == []


def test_one_failed_check_leads_with_its_own_fix_not_an_image_rebuild(monkeypatch, tmp_path):
    """Walk: docker could not raise memlock on the host (image.run); the fix led with "the image: `ktdeploy image
    build`" — 30 minutes for a host setting — before the check's own fix (--waive docker.memlock)."""
    memlock = [{"name": "image.run", "status": "fail", "layer": "container",
                "detail": "ktsft:amx did not start with the training flags: error setting rlimit type 8",
                "fix": "docker may not raise memlock here (rootless, or no CAP_SYS_RESOURCE): run docker with that "
                       "capability, or --waive docker.memlock (containers then start without --ulimit memlock=-1)."}]
    with pytest.raises(CheckFailed) as e:
        _run(monkeypatch, tmp_path, memlock)
    assert e.value.fix.startswith("docker may not raise memlock here"), e.value.fix
    assert "image build" not in e.value.fix and "run the same command again" in e.value.fix
    with pytest.raises(CheckFailed) as e:   # several: the overview, as before
        _run(monkeypatch, tmp_path, FAILING)
    assert "Fix the checks listed below" in e.value.fix
