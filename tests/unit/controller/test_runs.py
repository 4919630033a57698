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


def test_a_dry_run_is_never_latest_however_it_ended(tmp_path, monkeypatch):
    """up records a dry run with dry_run=True from the start; one that stopped early (doctor failed,
    host unreachable, controller killed) keeps state failed/planned, and is still not the latest run."""
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    a = runs.RunRecord.create("r")
    a.set_status("detached", host="h", created=1.0, dry_run=False)
    for n, state in enumerate(("failed", "planned", "dry-run"), start=2):
        runs.RunRecord.create("r").set_status(state, host="h", created=float(n), dry_run=True)
    assert runs.latest_run("h").id == a.id
    assert runs.latest_run().id == a.id
    assert [r.id for r in runs.find_runs("h")] == [a.id]
    assert len(runs.find_runs("h", include_dry=True)) == 4


def test_cli_dry_run_to_an_unreachable_host_leaves_status_logs_down_alone(tmp_path):
    """The real CLI: a dry run that could not reach its host exits 3 and records itself as a dry run;
    status, logs and down then find no run instead of acting on a container that never existed."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KTDEPLOY_HOME": str(tmp_path), "COLUMNS": "200"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                              timeout=120)

    r = cli("up", "--host", "ssh://nobody@127.0.0.1:1", "--dry-run")
    assert r.returncode == 3, r.stderr
    recs = runs.all_runs(tmp_path / "runs")
    assert len(recs) == 1 and recs[0].status()["dry_run"] is True
    for cmd in (("logs",), ("down",)):
        r = cli(*cmd)
        said = " ".join(r.stderr.split())
        assert r.returncode == 6 and "no ktdeploy run recorded" in said, (cmd, r.stderr)
        # the fix is a command to paste, as `status` says it (no HOST/RECIPE placeholders)
        assert "`ktdeploy up`" in said and "HOST RECIPE" not in said, (cmd, r.stderr)
    r = cli("status")   # nothing has run yet: said, not an error
    assert r.returncode == 0 and r.stdout.startswith("no run recorded yet"), (r.stdout, r.stderr)
