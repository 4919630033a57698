"""controller/eval_stage.py: up's EVAL step end to end on this machine (LocalConnector, a real run record, a real
HTTP server on 127.0.0.1): the evaluation set fetched from the host, both sides asked, the files and the status
written; a failure or a poor score leaves the server alone and is exit 1 only with deploy.eval.fail_below."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.controller.eval_stage import run_eval_step
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import events as ev
from ktdeploy.core.errors import CheckFailed
from ktdeploy.core.plan.params import EvalParams
from ktdeploy.core.plan.steps import Stage, StageName, Step, StepAction
from ktdeploy.core.recipe import load_recipe
from tests.fakes.openai_server import OpenAIDouble


@dataclass
class Host:
    conn: LocalConnector
    record: RunRecord
    recipe: object
    emit_log: list = field(default_factory=list)

    def emit(self, e: ev.Event) -> None:
        self.emit_log.append(e)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))   # jieba's private dictionary cache goes there


@pytest.fixture
def srv():
    s = OpenAIDouble()
    yield s
    s.stop()


def _setup(tmp_path, *sets, rows=None):
    data = tmp_path / "data"
    data.mkdir()
    rows = rows if rows is not None else [{"instruction": f"w{i}", "output": f"w{i}" if i % 2 else "other"}
                                          for i in range(6)]
    (data / "held.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"held": {"file_name": "held.json"}}))
    recipe = load_recipe("recipes/tiny-moe-lora.yaml", [f"train.dataset_dir={data}", "deploy.eval.dataset=held",
                                                        "deploy.eval.concurrency=2", *sets])
    rec = RunRecord.create("tiny", root=tmp_path / "runs")
    rec.set_status("running")
    return Host(LocalConnector(), rec, recipe), data


def _step(data, url, unreachable=""):
    p = EvalParams(data_dir=str(data), datasets=("held",), source="deploy.eval.dataset", url=url, tuned="m:lora",
                   base="m", unreachable=unreachable)
    return Stage(StageName.EVAL, "eval"), Step("eval.run", "score", action=StepAction.EVAL, params=p)


def test_the_eval_step_records_both_sides_and_the_files(tmp_path, srv):
    host, data = _setup(tmp_path)
    run_eval_step(host, *_step(data, srv.url))
    st = host.record.status()["eval"]
    assert st["tuned"]["metrics"]["exact_match"] == 50.0 and st["base"]["metrics"]["exact_match"] == 50.0
    samples = [json.loads(x) for x in open(st["samples_file"])]
    assert len(samples) == 6 and samples[1]["tuned"]["text"] == "w1" and samples[0]["reference"] == "other"
    summary = json.load(open(st["summary_file"]))
    assert summary["tuned_model"] == "m:lora" and summary["delta"]["paired"] == 6
    kinds = [type(e).__name__ for e in host.emit_log]
    assert kinds[0] == "EvalStarted" and kinds[-1] == "EvalFinished" and "EvalProgressed" in kinds


def test_a_score_below_fail_below_is_exit_1_and_recorded(tmp_path, srv):
    host, data = _setup(tmp_path, "deploy.eval.fail_below=80", "deploy.eval.metric=exact_match")
    with pytest.raises(CheckFailed) as e:
        run_eval_step(host, *_step(data, srv.url))
    assert e.value.exit_code == 1 and "keeps running" in e.value.message
    assert host.record.status()["eval"]["below"].startswith("tuned exact_match 50.00 < ")


def test_an_unreachable_server_or_an_empty_set_is_said_and_up_goes_on(tmp_path, srv):
    host, data = _setup(tmp_path, rows=[])
    run_eval_step(host, *_step(data, srv.url))
    assert "no sample" in host.record.status()["eval"]["failed"]
    run_eval_step(host, *_step(data, None, unreachable="the server listens on 127.0.0.1 of the host"))
    assert isinstance(host.emit_log[-1], ev.EvalNotRun) and "127.0.0.1" in host.record.status()["eval"]["failed"]


def test_a_link_planted_as_the_dataset_is_never_read(tmp_path, srv):
    host, data = _setup(tmp_path)
    (data / "held.json").unlink()
    (data / "held.json").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("[]")
    run_eval_step(host, *_step(data, srv.url))
    assert "symbolic link" in host.record.status()["eval"]["failed"]
