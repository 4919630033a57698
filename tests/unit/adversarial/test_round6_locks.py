"""Issue 45, class 5: one run, one lock, however the host is spelled.

The job lock was keyed on the --host text: `localhost`, `local` and an empty host, or `ssh://root@h:p`,
`root@h:p` and `ssh://h:p`, each took another lock, so two `up`s of one job ran at once (each removing the
other's containers). The key is now the place the spelling names (``HostTarget.lock_key``: kind, user — this
machine's when none is given, as ssh's —, host, port; one key for this machine), and `status` shows it.

The racing `up`s run against conftest.py's ``silent_host`` (accepts, never answers: `up` waits in its connect
phase, holding its lock, as long as the test wants)."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ktdeploy.core.host_target import parse_host
from tests.fakes.connector import FakeConnector
from tests.unit.adversarial.held_up import up_holding_its_lock

ROOT = Path(__file__).resolve().parents[3]
EXE = str(Path(sys.executable).parent / "ktdeploy")
RECIPE = str(ROOT / "recipes" / "tiny-moe-lora.yaml")
ME = getpass.getuser()


@pytest.mark.parametrize("spellings,key", [
    (["localhost", "local", "", " localhost ", None], "local"),
    ([f"ssh://{ME}@gpu01:22", f"{ME}@gpu01", "gpu01", "ssh://gpu01", "GPU01", "gpu01.", f"ssh://{ME}:pw@gpu01:22"],
     f"ssh://{ME}@gpu01:22"),
    (["ssh://root@h:2222", "root@h:2222", "root:secret@H:2222"], "ssh://root@h:2222"),
    (["ssh://root@[::1]:22", "root@[0:0::1]", "ssh://root@[0000::0001]"], "ssh://root@[::1]:22"),
    (["docker://train1"], "docker://train1"),
])
def test_every_spelling_of_a_place_has_one_key(spellings, key):
    assert {parse_host(s).lock_key(ME) for s in spellings} == {key}


@pytest.mark.parametrize("a,b", [("root@gpu01", "kt@gpu01"), ("gpu01", "gpu02"), ("gpu01:22", "gpu01:2222"),
                                 ("localhost", "ssh://root@localhost"), ("local", "docker://local")])
def test_other_places_have_other_keys(a, b):
    assert parse_host(a).lock_key("root") != parse_host(b).lock_key("root")


def test_a_second_local_up_spelled_otherwise_is_refused(tmp_path, monkeypatch):
    """In one process: while `up --host localhost` waits in its doctor phase, `up --host local` and `up --host ''`
    of the job are refused at once (they used to take locks of their own)."""
    from ktdeploy.controller.up_host import up
    from ktdeploy.core.command_requests import UpRequest
    from ktdeploy.core.errors import RunRecordError

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    with up_holding_its_lock("localhost", RECIPE):
        for other in ("local", "", "  localhost"):
            t0 = time.monotonic()
            with pytest.raises(RunRecordError, match="already working on the job") as err:
                up(UpRequest(host=other, recipe=RECIPE), connector=FakeConnector(name="localhost"))
            assert "on local" in err.value.message and time.monotonic() - t0 < 5


def _start(host: str, home: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([EXE, *extra, "--host", host, "--accept-new-host-key", "--known-hosts",
                             str(home / "known_hosts"), RECIPE] if extra[:1] == ("up",) else
                            [EXE, *extra, "--host", host], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "200"},
                            start_new_session=True)


def _connecting(home: Path) -> list[Path]:
    runs = home / "runs"
    return [st.parent for st in runs.glob("*/status.json") if (st.parent / "events.jsonl").exists()
            and "stage_start" in (st.parent / "events.jsonl").read_text()] if runs.exists() else []


def test_three_ups_racing_under_three_spellings_exactly_one_runs(silent_host, tmp_path):
    """`ssh://root@127.0.0.1:P`, `root@127.0.0.1:P` and `ssh://127.0.0.1:P` (this machine's user is root, as ssh
    would log in) started together: one connects, the others exit 6 before they record anything."""
    if ME != "root":
        pytest.skip("the user-less spelling names root only when this machine's user is root")
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text("")
    port = silent_host.rsplit(":", 1)[1]
    spellings = [f"ssh://root@127.0.0.1:{port}", f"root@127.0.0.1:{port}", f"ssh://127.0.0.1:{port}"]
    t0 = time.monotonic()
    procs = [_start(s, home, "up") for s in spellings]
    try:
        deadline = time.monotonic() + 60
        while sum(p.poll() is not None for p in procs) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        running = [p for p in procs if p.poll() is None]
        refused = [(p.returncode, p.communicate(timeout=30)[1]) for p in procs if p.poll() is not None]
        assert len(running) == 1, [(rc, err[-300:]) for rc, err in refused]
        for rc, err in refused:
            assert rc == 6 and "already working on the job" in " ".join(err.split()), (rc, err[-1500:])
        deadline = time.monotonic() + 30
        while not _connecting(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list((home / "runs").iterdir())) == 1 and _connecting(home)    # one record: the one that runs
        down = _start(f"root@127.0.0.1:{port}", home, "down")
        _out, derr = down.communicate(timeout=60)
        assert down.returncode == 6 and "already working" in " ".join(derr.split()), derr[-1500:]
        st = json.loads(next((home / "runs").glob("*/status.json")).read_text())
        assert st["lock"].startswith(f"ssh://root@127.0.0.1:{port} ktd-"), st
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert time.monotonic() - t0 < 120


def test_status_shows_the_lock_key(tmp_path, monkeypatch):
    env = {**os.environ, "KTDEPLOY_HOME": str(tmp_path), "COLUMNS": "200"}
    facts = str(ROOT / "examples" / "facts" / "gpu-h200-1gpu.json")
    r = subprocess.run([EXE, "up", "--host", "ROOT@GPU01.", "--dry-run", "--facts", facts, RECIPE], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode in (0, 1, 4), r.stderr[-1500:]
    from ktdeploy.controller.run_queries import status

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    st = status(run_id=next((tmp_path / "runs").iterdir()).name, live=False)   # a dry run's record
    assert st["lock"].startswith("ssh://ROOT@gpu01:22 ktd-tiny-moe-lora-"), st.get("lock")
    from ktdeploy.cli.output import console
    from ktdeploy.cli.up_cmds import _print_status

    with console.capture() as cap:
        _print_status({**st, "live": {"error": "not asked"}})
    assert f"lock {st['lock']}" in " ".join(cap.get().split())


def test_status_logs_and_down_find_a_run_under_any_spelling_of_its_host(tmp_path, monkeypatch):
    """`down --host root@h` must find (and lock) the run `up --host ssh://root@h:22` recorded, and `--name` of the
    same job under another spelling is the same job, not "another host's run"."""
    import time as _time

    from ktdeploy.controller.run_queries import status
    from ktdeploy.controller.runs import RunRecord, find_runs
    from ktdeploy.controller.up_inputs import check_run_name

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    rec = RunRecord.create("r", root=tmp_path / "runs")
    rec.set_status("finished", host=f"ssh://{ME}@gpu01:22", container="ktd-x-1", recipe="r", created=_time.time(),
                   name="v1")
    for spelling in (f"{ME}@gpu01", "gpu01", "GPU01.", f"ssh://{ME}@gpu01"):
        assert [r.id for r in find_runs(spelling)] == [rec.id], spelling
        assert status(spelling, live=False)["id"] == rec.id
    assert find_runs("gpu02") == [] and find_runs(f"{ME}@gpu01:2222") == []
    check_run_name("v1", "gpu01", "ktd-x-1")                       # the same job again keeps its name
    with pytest.raises(Exception, match="has that name"):
        check_run_name("v1", "gpu02", "ktd-x-1")
