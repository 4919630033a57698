"""core/run_summary.py: a run's stage, age and one-line reason from its status.json alone."""

import pytest

from ktdeploy.core import run_summary as rs


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"),
                                          (86399, "23h"), (86400, "1d"), (10 * 86400, "10d")])
def test_age(seconds, text):
    assert rs.age({"created": 1000.0}, 1000.0 + seconds) == text


def test_age_falls_back_to_updated_and_never_crashes():
    assert rs.age({"updated": 10.0}, 70.0) == "1m"
    assert rs.age({"created": "yesterday"}, 70.0) == "?"
    assert rs.age({"created": True}, 70.0) == "?"
    assert rs.age({"created": 100.0}, 50.0) == "0s"          # a clock that went back


def test_stage_prefers_where_it_failed():
    assert rs.stage({"failed_stage": "IMAGE", "stage": "RUNTIME"}) == "IMAGE"
    assert rs.stage({"stage": "FOLLOW"}) == "FOLLOW"
    assert rs.stage({"state": "planned"}) == "PREFLIGHT"
    assert rs.stage({"state": "finished"}) == ""


@pytest.mark.parametrize("st,want", [
    ({"state": "failed", "error": "IMAGE: no ktsft:amx\nline two"}, "IMAGE: no ktsft:amx"),
    ({"state": "crashed"}, "no error recorded"),
    ({"state": "training", "progress": {"current_steps": 3, "total_steps": 9}}, "step 3/9"),
    ({"state": "training", "stage": "FOLLOW"}, "in FOLLOW"),
    ({"state": "detached", "note": "--detach: training runs on the host",
      "progress": {"current_steps": 5, "total_steps": 9, "loss": 2.0}},
     "--detach: training runs on the host (last seen: step 5/9, loss 2.0000)"),
    ({"state": "stopped", "down": {"ktd-x": "removed"}}, "containers removed (ktdeploy down)"),
    ({"state": "finished", "adapter_dir": "/o/x-sglang"}, "adapter /o/x-sglang"),
    ({"state": "planned"}, "started; no stage finished yet (or the controller was killed)"),
])
def test_reason(st, want):
    assert rs.reason(st) == want


def test_a_long_reason_is_cut():
    text = rs.reason({"state": "failed", "error": "x" * 500})
    assert len(text) == rs.REASON_WIDTH and text.endswith("…")
