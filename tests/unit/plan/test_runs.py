import pytest

from ktdeploy.controller import runs
from ktdeploy.core.errors import RunRecordError


def test_record_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    r = runs.RunRecord.create("tiny moe/lora")
    assert r.path.parent == tmp_path / "runs" and "tiny-moe-lora" in r.id
    r.set_status("planned", host="h1", container="c1", created=1.0)
    r.event("step_start", step="x")
    with open(r.path / "events.jsonl", "a") as f:
        f.write('{"torn')  # a controller killed mid-write
    assert [e["event"] for e in r.events()] == ["step_start"]
    r.set_status("finished")
    st = runs.latest_run("h1").status()
    assert st["state"] == "finished" and st["container"] == "c1"
    assert runs.latest_run(run_id=r.id[:20]).id == r.id
    with pytest.raises(RunRecordError):
        runs.latest_run("other-host")
    with pytest.raises(ValueError):
        r.set_status("bogus")


def test_dry_runs_are_not_latest(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    a = runs.RunRecord.create("r")
    a.set_status("finished", host="h", created=1.0)
    b = runs.RunRecord.create("r")
    b.set_status("dry-run", host="h", created=2.0)
    assert runs.latest_run("h").id == a.id
