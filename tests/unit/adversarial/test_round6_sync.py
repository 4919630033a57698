"""Issue 45, classes 3 and 4 (and 6's link at the host's model folder): `up --sync-*`.

- Class 3: the key path reaches ssh as one argument and no shell. The controller connects (pyinfra, paramiko) to
  an SSH server on 127.0.0.1 (tests/unit/adversarial/ssh_server.py) with a key whose path holds ``$(…)``, ``;``,
  backquotes, quotes and blanks — from the connector's key (what ``--ssh-key`` hands it) and from
  ``KTDEPLOY_SSH_KEY``; the ssh that rsync starts is a recorder first on PATH. Before: the commands in the path ran
  here and ssh got the path in pieces. tests/integration/test_sync_hostile.py uploads for real with such a key.
- Class 4: SIGTERM, Ctrl-C or SIGKILL of `up --host localhost --sync-model` while rsync copies: rsync is gone
  within seconds, nothing is left among the folder's files, and the next `up` resumes the copy (never "other
  content"); no traceback. rsync is slowed by a `--bwlimit` wrapper first on PATH (the real rsync, exec'd).
- A link at the host's model folder (or at its .ktdeploy-partial) is refused: the copy would land where it points."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.controller.sync import PARTIAL, RSYNC_FLAGS, sync_folder
from ktdeploy.core.errors import StepError, UsageError
from tests.unit.adversarial.ssh_server import ssh_server
from tests.unit.adversarial.sync_kill import processes_with, slow_rsync_path, stop_mid_copy

ROOT = Path(__file__).resolve().parents[3]
EXE = str(Path(sys.executable).parent / "ktdeploy")
RECIPE = str(ROOT / "recipes" / "tiny-moe-lora.yaml")
HOSTILE_DIRS = ["k$(touch PWNED1)", "k;touch PWNED2;", "k`touch PWNED3`", "k 'a' \"b\" c", "k''x"]


def _recorder(bindir: Path, name: str, log: Path, rc: int) -> None:
    (bindir / name).write_text(f"#!{sys.executable}\nimport json, sys\n"
                               f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nsys.exit({rc})\n")
    (bindir / name).chmod(0o755)


# ---------------------------------------------------------------- class 3: the key path

@pytest.mark.parametrize("source", ["connector key (--ssh-key)", "KTDEPLOY_SSH_KEY"])
def test_a_hostile_key_path_reaches_ssh_whole_and_no_shell(tmp_path, monkeypatch, source):
    from ktdeploy.controller.connectors.ssh import SSHConnector

    monkeypatch.chdir(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "ssh-argv.jsonl"
    _recorder(bindir, "ssh", log, 255)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    with ssh_server(tmp_path) as srv:
        for d in HOSTILE_DIRS:
            key = tmp_path / d / "id_ed25519"
            key.parent.mkdir()
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            if source == "KTDEPLOY_SSH_KEY":
                monkeypatch.setenv("KTDEPLOY_SSH_KEY", str(key))
                conn = SSHConnector("127.0.0.1", user="t", port=srv.port, known_hosts=str(srv.known_hosts))
            else:
                conn = SSHConnector("127.0.0.1", user="t", port=srv.port, key=str(key),
                                    known_hosts=str(srv.known_hosts))
            try:
                with pytest.raises(StepError):    # the recording ssh fails the copy
                    conn.rsync(str(src), "/srv/m", list(RSYNC_FLAGS))
            finally:
                conn.close()
            pwned = sorted(p.name for p in tmp_path.rglob("PWNED*"))
            assert not pwned, f"the key path {d!r} ran a command here: {pwned}"
            runs = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
            assert runs and runs[-1][runs[-1].index("-i") + 1] == str(key), (d, runs[-1:])


def test_the_rsh_string_splits_back_into_its_fields_the_way_rsync_splits_it():
    """A port of rsync's main.c do_cmd splitter reads every field back exactly (the integration test runs rsync)."""
    from ktdeploy.controller.connectors.rsync import ssh_command

    def rsync_split(cmd: str) -> list[str]:
        args, cur, quote, i, started = [], "", "", 0, False
        while i < len(cmd):
            c = cmd[i]
            if c == " " and not quote:
                if started:
                    args.append(cur)
                cur, started = "", False
            elif c in "'\"" and not quote:
                quote, started = c, True
            elif c == quote and cmd[i + 1:i + 2] == quote:
                cur, i = cur + c, i + 1
            elif c == quote:
                quote = ""
            else:
                cur, started = cur + c, True
            i += 1
        assert not quote
        return args + ([cur] if started else [])

    for d in HOSTILE_DIRS + ["plain", "a''''b", "'", "\"", " lead"]:
        cmd = ssh_command(port=2222, key=f"/k/{d}/id", known_hosts=f"/h/{d}", strict="yes")
        fields = rsync_split(cmd)
        assert fields[fields.index("-i") + 1] == f"/k/{d}/id" and f"UserKnownHostsFile=/h/{d}" in fields, fields


# ---------------------------------------------------------------- a link at the host's folder

@pytest.mark.parametrize("where", ["the model folder", "its partial folder"])
def test_a_link_at_the_hosts_model_folder_is_refused(tmp_path, where):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    victim = tmp_path / "someone-elses"
    victim.mkdir()
    target = tmp_path / "host" / "m"
    target.parent.mkdir()
    if where == "the model folder":
        target.symlink_to(victim)
    else:
        target.mkdir()
        (target / PARTIAL).symlink_to(victim)
    with pytest.raises(UsageError) as err:
        sync_folder(LocalConnector(), str(src), str(target), role="model")
    assert "symbolic link" in err.value.message and err.value.key == "--sync-model"
    assert list(victim.iterdir()) == []


# ---------------------------------------------------------------- class 4: an interrupted upload

def test_what_an_interrupted_upload_left_is_resumed_never_other_content(tmp_path):
    """An older ktdeploy's rsync stopped by SIGKILL left its temp file beside the files (`.NAME.XXXXXX`)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(os.urandom(300_000))
    (src / "config.json").write_text("{}")
    target = tmp_path / "host"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / ".model.safetensors.Xy12Ab").write_bytes(os.urandom(1000))
    res = sync_folder(LocalConnector(), str(src), str(target), role="model")
    assert any("interrupted upload" in n for n in res.notes), res.notes
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def _visible(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")
            if p.is_file() and PARTIAL not in p.relative_to(folder).parts}


def _up(tmp_path: Path, src: Path, env: dict) -> subprocess.Popen:
    h = tmp_path / "host"
    sets = [f"deploy.volumes.model={h}/models", f"deploy.volumes.data={h}/data", f"deploy.volumes.output={h}/out",
            f"train.model_name_or_path={h}/models/m", f"train.dataset_dir={h}/data", f"train.output_dir={h}/out/o"]
    return subprocess.Popen([EXE, "up", "--host", "localhost", "--sync-model", str(src),
                             *[a for s in sets for a in ("--set", s)], RECIPE], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_rsync_dies_with_up_and_the_next_up_resumes(tmp_path, sig):
    src = tmp_path / f"src-{os.getpid()}-{sig.name}"
    src.mkdir()
    (src / "model.safetensors").write_bytes(os.urandom(40 << 20))      # ~7 s at the wrapper's 6000 KiB/s
    (src / "config.json").write_text("{}")
    env = {**os.environ, "PATH": slow_rsync_path(tmp_path / "bin"), "KTDEPLOY_HOME": str(tmp_path / "home"),
           "COLUMNS": "200"}
    target = tmp_path / "host" / "models" / "m"
    stop_mid_copy(_up(tmp_path, src, env), target, sig)
    deadline = time.monotonic() + 15
    while processes_with(src.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_with(src.name)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "rsync went on copying after up was stopped"
    full = (src / "model.safetensors").stat().st_size
    assert _visible(target).get("model.safetensors") != full     # it was stopped mid-copy
    assert set(_visible(target)) <= {"config.json"}, _visible(target)   # nothing half-written among the files
    again = _up(tmp_path, src, {**env, "PATH": os.environ["PATH"]})
    _out, err2 = again.communicate(timeout=300)
    assert "other content" not in err2 and "Traceback" not in err2, err2[-2000:]
    assert hashlib.sha256((target / "model.safetensors").read_bytes()).digest() == \
        hashlib.sha256((src / "model.safetensors").read_bytes()).digest()
    events = [json.loads(ln) for rec in (tmp_path / "home" / "runs").iterdir()
              for ln in (rec / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "sync" for e in events), [e.get("event") for e in events][-20:]
    assert not re.search(r"\.model\.safetensors\.\w{6}", " ".join(str(p) for p in target.rglob("*")))
