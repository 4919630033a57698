"""The stop request's contract (agent/stop_request.py) and the pure part of lf_entry's SaveOnStopRequest: which
flags it sets at a step boundary, what it writes once the checkpoint is on disk, the exception that ends training
before LlamaFactory's final save. The callback itself runs against transformers' real Trainer in the full image
(tests/integration/test_stop_request_trainer.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ktdeploy.agent.lf_entry import save_on_stop_request
from ktdeploy.agent.stop_request import EXIT_SAVED, StoppedAfterSave, StopRequest
from ktdeploy.core import run_record as rr
from ktdeploy.core.job_layout import JobLayout


def test_paths_live_beside_the_run_records_never_in_the_output_dir(tmp_path):
    req = StopRequest.for_output(str(tmp_path / "out"))
    layout = JobLayout(str(tmp_path / "out"))
    assert req.request == layout.stop_request and req.stopped == layout.stopped_marker
    assert not req.request.startswith(str(tmp_path / "out") + "/")       # LlamaFactory refuses a non-empty output dir
    assert StopRequest.from_env(req.env()) == req and StopRequest.from_env({}) is None
    assert EXIT_SAVED == 75 and rr.final_state(EXIT_SAVED) == "stopped" and rr.final_state(1) == "failed"


def test_clear_leaves_a_supervised_run_s_request_alone(tmp_path):
    req = StopRequest.for_output(str(tmp_path / "out"))
    (tmp_path / ".ktdeploy-runs" / "out").mkdir(parents=True)
    for p in (req.request, req.stopped):
        open(p, "w").write("x\n")
    req.clear({"KTDEPLOY_SUPERVISED": "1"})       # the supervising shell cleared before the start: this one is new
    assert req.requested()
    req.clear({})
    assert not req.requested()
    req.clear({})                                  # nothing there: no error


class Base:     # TrainerCallback's shape: the callback subclasses whatever base it is given
    pass


def test_the_callback_saves_at_the_step_after_the_request_and_ends_training(tmp_path):
    req = StopRequest.for_output(str(tmp_path / "out"))
    seen: list[bool] = []

    def agree(flag: bool) -> bool:    # one process: the flag itself; recorded to show every step asks
        seen.append(flag)
        return flag

    cb = save_on_stop_request(Base, req, agree)
    args, control = SimpleNamespace(output_dir=str(tmp_path / "out")), SimpleNamespace(should_save=False,
                                                                                     should_training_stop=False)
    cb.on_step_end(args, SimpleNamespace(global_step=3), control)
    assert not control.should_save and cb.on_save(args, SimpleNamespace(global_step=3), control) is control
    (tmp_path / ".ktdeploy-runs" / "out").mkdir(parents=True)
    open(req.request, "w").write("USR1\n")
    cb.on_step_end(args, SimpleNamespace(global_step=4), control)
    assert control.should_save and control.should_training_stop and seen == [False, True]
    with pytest.raises(StoppedAfterSave) as e:
        cb.on_save(args, SimpleNamespace(global_step=4), control)
    assert e.value.step == 4 and e.value.checkpoint == f"{tmp_path}/out/checkpoint-4"
    assert json.loads(open(req.stopped).read()) == {"step": 4, "checkpoint": f"{tmp_path}/out/checkpoint-4",
                                                    "reason": "USR1"}
