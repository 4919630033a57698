"""One registry of stage names (core/plan/steps.StageName, a StrEnum): ``Stage.name`` and every event's ``stage``
are StageName, so mypy refuses a stage written as a string (the source scan that did the type checker's job went in
issue 48); a Stage whose name is not registered cannot be built. Records and plans keep the plain strings."""

import json

import pytest

from ktdeploy.core.plan.steps import Stage, StageName


def test_a_stage_name_is_its_member_written_as_the_plain_string_and_an_unknown_one_is_refused():
    s = Stage(StageName.TRAIN, "training container")
    assert s.name is StageName.TRAIN and json.dumps(s.to_json()) == json.dumps({"name": "TRAIN",
                                                                                "title": "training container",
                                                                                "steps": []})
    assert Stage("TRAIN", "from a plan's JSON").name is StageName.TRAIN
    with pytest.raises(ValueError):
        Stage("TRIAN", "typo")
