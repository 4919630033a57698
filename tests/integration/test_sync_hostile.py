"""Issue 45, classes 3 and 4, over SSH to a real sshd test host (tests/integration/hosts.py).

- Class 3: `up --sync-model` with a key whose path holds `$(touch …)`, `;`, backquotes, quotes and blanks, given
  as --ssh-key and as KTDEPLOY_SSH_KEY: the upload arrives whole and checked, and no command in the path ran. On
  main before issue 45 pyinfra's rsync put the key path into a local shell unquoted: the commands ran and every
  upload failed ("no such identity").
- Class 4: SIGTERM, Ctrl-C or SIGKILL of `up` while rsync uploads: rsync is gone here and on the host within
  seconds, the host's folder shows nothing half-written, the next `up` resumes (never "other content"), and no
  traceback reaches the terminal. rsync is slowed by a `--bwlimit` wrapper first on PATH (the real rsync, exec'd).

`up` runs on to doctor after the upload, which fails on a host without a GPU (exit 1): only the upload matters."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.hosts import host_pool  # noqa: F401
from tests.unit.adversarial.sync_kill import processes_with, slow_rsync_path, stop_mid_copy

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "tiny-moe-lora.yaml")
HOSTILE = "k $(touch PWNED1); touch PWNED2 `touch PWNED3` 'q' \"d\""


@pytest.fixture(scope="module")
def host(host_pool, tmp_path_factory):  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="ktd-sec-sync-", dir="/tmp"))
    h = host_pool.start("secsync", shared=[str(root)])
    keydir = tmp_path_factory.mktemp("keys") / HOSTILE
    keydir.mkdir()
    shutil.copy(host_pool.key, keydir / "id_ed25519")
    os.chmod(keydir / "id_ed25519", 0o600)
    yield {"root": root, "host": h, "hostile_key": str(keydir / "id_ed25519"), "key": str(host_pool.key),
           "known_hosts": str(host_pool.known_hosts)}
    h.exec("rm", "-rf", "--", str(root), check=False)
    shutil.rmtree(root, ignore_errors=True)


def _up(w, src: Path, target: str, cwd: Path, *, key: str, key_from_env: bool = False, path: str | None = None,
        home: Path) -> subprocess.Popen:
    r = w["root"]
    sets = [f"deploy.volumes.model={r}/models", f"deploy.volumes.data={r}/data", f"deploy.volumes.output={r}/out",
            f"train.model_name_or_path={target}", f"train.dataset_dir={r}/data", f"train.output_dir={r}/out/o"]
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "200", "PATH": path or os.environ["PATH"]}
    flag = ["--ssh-key", key]
    if key_from_env:
        env["KTDEPLOY_SSH_KEY"], flag = key, []
    return subprocess.Popen([sys.executable, "-m", "ktdeploy", "up", "--host", w["host"].target, *flag,
                             "--known-hosts", w["known_hosts"], "--sync-model", str(src),
                             *[a for s in sets for a in ("--set", s)], RECIPE],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _model(folder: Path, size: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(size))
    (folder / "config.json").write_text("{}")
    return folder


def _same(src: Path, target: Path) -> bool:
    return all(Path(target, p.name).is_file() and hashlib.sha256(Path(target, p.name).read_bytes()).digest() ==
               hashlib.sha256(p.read_bytes()).digest() for p in src.iterdir())


@pytest.mark.parametrize("key_from_env", [False, True], ids=["--ssh-key", "KTDEPLOY_SSH_KEY"])
def test_a_hostile_key_path_uploads_and_runs_nothing(host, tmp_path, key_from_env):
    src = _model(tmp_path / "src", 1 << 20)
    target = f"{host['root']}/models/key-{int(key_from_env)}"
    p = _up(host, src, target, tmp_path, key=host["hostile_key"], key_from_env=key_from_env, home=tmp_path / "home")
    _out, err = p.communicate(timeout=300)
    assert "Traceback" not in err, err[-2000:]
    pwned = [str(x) for where in (tmp_path, REPO, Path.cwd(), host["root"]) for x in where.glob("PWNED*")]
    assert not pwned, pwned
    assert _same(src, Path(target)), err[-2000:]


def _rsyncs_on_host(h, target: str) -> int:
    script = ('n=0; for c in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$c" 2>/dev/null | grep -q "^rsync" && '
              'n=$((n+1)); done; echo $n')
    return int(h.exec("sh", "-c", script).stdout.strip() or 0)


def _visible(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
            and ".ktdeploy-partial" not in p.relative_to(folder).parts}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_up_stops_its_rsync_and_the_next_up_resumes(host, tmp_path, sig):
    src = _model(tmp_path / f"src-{os.getpid()}-{sig.name}", 40 << 20)     # ~7 s at 6000 KiB/s
    target = Path(host["root"], "models", f"kill-{sig.name}-{time.monotonic_ns()}")
    home = tmp_path / "home"
    p = _up(host, src, str(target), tmp_path, key=host["key"], path=slow_rsync_path(tmp_path / "bin"), home=home)
    stop_mid_copy(p, target, sig)
    deadline = time.monotonic() + 15
    while (processes_with(src.name) or _rsyncs_on_host(host["host"], str(target))) and time.monotonic() < deadline:
        time.sleep(0.2)
    here, there = processes_with(src.name), _rsyncs_on_host(host["host"], str(target))
    for pid in here:
        os.kill(pid, signal.SIGKILL)
    assert not here and not there, f"rsync went on after up was stopped: {len(here)} here, {there} on the host"
    assert _visible(target) <= {"config.json"}, _visible(target)      # nothing half-written among the files
    again = _up(host, src, str(target), tmp_path, key=host["key"], home=home)
    _out, err2 = again.communicate(timeout=300)
    assert "other content" not in err2 and "Traceback" not in err2, err2[-2000:]
    assert _same(src, target), err2[-2000:]
