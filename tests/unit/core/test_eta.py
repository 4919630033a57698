"""The run's ETA: the plan's step time until steps are measured, then the measured one; status's line."""

from __future__ import annotations

import pytest

from ktdeploy.core.eta import Eta, hms, status_eta


def test_plan_until_measured_then_measured_without_the_first_step():
    e = Eta(2.0, 100.0)
    assert e.line(0, 10) == "0:00:20 left for 10 steps, from the plan (2.00 s per step)"
    e.update(1, 100.0)               # the first step seen: its warm-up is not a step time
    assert e.measured_step_s is None and e.remaining_s(1, 10) == 18.0
    e.update(3, 106.0)
    assert e.measured_step_s == 3.0 and e.remaining_s(3, 10) == 21.0
    assert e.ratio() == 1.5 and "measured/plan 1.50" in (e.line(3, 10) or "")
    assert e.record() == {"planned_step_s": 2.0, "planned_tokens_per_s": 100.0, "measured_step_s": 3.0,
                          "measured_over_planned": 1.5, "time_model": None}


def test_no_plan_waits_for_measurement():
    e = Eta(None)
    assert e.line(1, 10) is None
    e.update(1, 0.0)
    e.update(2, 5.0)
    assert e.line(2, 10) == "0:00:40 left for 8 steps, measured 5.00 s per step"


def test_said_once_per_tenth():
    e = Eta(1.0)
    said = [s for s in range(1, 101) if e.due(s, 100)]
    assert said == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


@pytest.mark.parametrize("eta,progress", [(None, {"current_steps": 1, "total_steps": 2}), ({"planned_step_s": 1}, None),
                                          ({"planned_step_s": "x"}, {"current_steps": 1, "total_steps": 2}),
                                          ({"planned_step_s": 1.0}, {"current_steps": 3, "total_steps": 2}),
                                          ({"planned_step_s": -1.0}, {"current_steps": 1, "total_steps": 2})])
def test_status_line_absent_for_missing_or_forged_records(eta, progress):
    assert status_eta(eta, progress) is None


def test_status_line():
    assert status_eta({"planned_step_s": 2.0}, {"current_steps": 1, "total_steps": 11}) == \
        "ETA 0:00:20 (10 steps x 2.00 s, planned)"
    line = status_eta({"planned_step_s": 2.0, "measured_step_s": 4.0, "measured_over_planned": 2.0},
                      {"current_steps": 1, "total_steps": 11})
    assert line == "ETA 0:00:40 (10 steps x 4.00 s, measured); plan said 2.00 s per step (measured/plan 2.00)"
    assert hms(3725) == "1:02:05"
