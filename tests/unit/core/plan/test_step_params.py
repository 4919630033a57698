"""core/plan/params.py: a step's parameters are typed for the executor and written into the plan's JSON as the
mapping they were before they were typed (key order, lists, an unset optional field left out, a None that is a
value kept), so plan.json and `up --dry-run --json` read as before."""

from __future__ import annotations

import json

import pytest

from ktdeploy.core.errors import StepError
from ktdeploy.core.plan import params as P
from ktdeploy.core.plan.steps import Step, StepAction

SHAPES = [
    (P.ImageCheckParams(image="ktsft:amx", name="j-imgcheck", gpus=(0, 1), memlock=True, user=None),
     '{"image": "ktsft:amx", "name": "j-imgcheck", "gpus": [0, 1], "memlock": true, "user": null}'),
    (P.RunParams(cleanup=("rm", "-f", "--", "/k")), '{"cleanup": ["rm", "-f", "--", "/k"]}'),
    (P.CrashParams(), '{"crash": true}'),
    (P.ContainerLogParams(), '{"docker_logs": true}'),
    (P.SecretParams(env="KEY"), '{"env": "KEY"}'),
    (P.FollowParams(container="j", log="/o/l"), '{"container": "j", "log": "/o/l"}'),
    (P.WaitRunningParams(container="j", seconds=5), '{"container": "j", "seconds": 5}'),
    (P.WaitHttpParams(container="j"), '{"container": "j"}'),
    (P.SubmitParams(role="train"), '{"role": "train"}'),
    (P.SubmitParams(role="train", job_id="11"), '{"role": "train", "job_id": "11"}'),
    (P.SubmitAfterParams(role="convert", after=None), '{"role": "convert", "after": null}'),
    (P.SubmitAfterParams(role="convert", after="train"), '{"role": "convert", "after": "train"}'),
    (P.FollowJobParams(role="train", log="/l", job_dir="/d", job_id=None),
     '{"role": "train", "log": "/l", "job_dir": "/d", "job_id": null}'),
    (P.WaitJobParams(role="convert", job_dir="/d", job_id="12"), '{"role": "convert", "job_dir": "/d", "job_id": "12"}'),
]


@pytest.mark.parametrize(("params", "text"), SHAPES, ids=lambda x: type(x).__name__ if not isinstance(x, str) else "")
def test_params_are_written_as_the_mapping_they_were(params, text):
    step = Step("s", "s", action=StepAction.RUN, argv=("true",), params=params)
    assert json.dumps(step.to_json()["params"]) == text


def test_a_step_without_params_writes_none():
    assert "params" not in Step("s", "s", argv=("true",)).to_json()


def test_the_executor_gets_the_kind_it_asks_for_or_a_plan_bug():
    step = Step("serve.key", "key", action=StepAction.PUT_SECRET, params=P.SecretParams(env="KEY"))
    assert step.typed(P.SecretParams).env == "KEY"
    with pytest.raises(StepError, match="has no FollowParams") as e:
        step.typed(P.FollowParams)
    assert e.value.step == "serve.key"
    with pytest.raises(StepError):
        Step("x", "x").typed(P.RunParams)
