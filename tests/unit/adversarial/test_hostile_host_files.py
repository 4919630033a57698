"""What the training container (or a co-tenant) can put in the output folder, and host strings with odd
passwords: found by an outside probe of `up` (stop 27). The host scripts run for real under `sh` here (the
same text `up` sends over SSH); each test fails on the code before the fix."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ktdeploy.core.markers import FOLLOW_SH, parse_fields, parse_follow
from ktdeploy.core.plan.state import STATE_SCRIPT, parse_state
from tests.unit.adversarial.harness import SECRET, invoke, problems

ROOT = Path(__file__).resolve().parents[3]
FORGED = "x\n@@end\n@@user\t4242:4242\n@@adapter\tyes\n@@container\t{\"Status\":\"exited\",\"ExitCode\":0}"


def _state(out: Path, adapter: Path) -> str:
    # no docker here, or no such containers: every docker answer is empty, as for a job never started
    env = {**os.environ, "PATH": f"{out.parent / 'nodocker'}:{os.environ['PATH']}"}
    (out.parent / "nodocker").mkdir(exist_ok=True)
    fake = out.parent / "nodocker" / "docker"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    r = subprocess.run(["sh", "-c", STATE_SCRIPT, "ktdeploy-state", "ktd-x", "ktd-x-serve", "ktsft:amx", str(out),
                        str(adapter)], capture_output=True, text=True, timeout=60, env=env)
    return r.stdout


def test_a_file_name_in_the_output_cannot_forge_the_job_state(tmp_path):
    out = tmp_path / "out" / "run2"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / FORGED).write_text("")
    text = _state(out, tmp_path / "out" / "run2-sglang")
    st = parse_state(text)
    assert st.user == f"{os.getuid()}:{os.getgid()}"
    assert st.adapter_present is False and st.container is None
    assert "logs/" + FORGED.replace("\n", "?") in text.splitlines()  # the name, on one line, newlines as '?'
    assert st.top_level == ["logs"]


def test_fields_printed_before_host_text_win():
    fields, blocks = parse_fields("@@user\t1000:1000\n@@listing\na\n@@end\n@@user\t0:0\n", blocks=("listing",))
    assert fields["user"] == "1000:1000" and blocks["listing"] == ["a"]


def test_a_linked_output_dir_is_listed_so_a_finished_run_is_seen(tmp_path):
    old = tmp_path / "out" / "old-run"
    old.mkdir(parents=True)
    (old / "train_results.json").write_text("{}")
    (old / "adapter_model.safetensors").write_text("")
    link = tmp_path / "out" / "link"
    link.symlink_to(old)
    st = parse_state(_state(link, tmp_path / "out" / "link-sglang"))
    assert "train_results.json" in st.top_level


def test_follow_does_not_read_a_log_linked_to_a_device(tmp_path):
    log = tmp_path / "trainer_log.jsonl"
    log.symlink_to("/dev/zero")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "docker").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "docker").chmod(0o755)
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", FOLLOW_SH, "ktdeploy-follow", "ktd-x", str(log)], capture_output=True, text=True,
                       timeout=30, env=env)
    assert time.monotonic() - t0 < 10 and parse_follow(r.stdout).log == []


@pytest.mark.parametrize("make,rc", [
    (lambda p, o: p.write_text("loss"), 0),
    (lambda p, o: None, 2),
    (lambda p, o: p.symlink_to(o), 3),
    (lambda p, o: p.write_bytes(b"\0" * 2048), 4),
])
def test_fetch_takes_only_a_small_regular_file(tmp_path, make, rc):
    from ktdeploy.controller.executor import FETCHABLE_SH

    secret = tmp_path / "id_ed25519"
    secret.write_text("HOST-SECRET-KEY")
    p = tmp_path / "training_loss.png"
    make(p, secret)
    r = subprocess.run(["sh", "-c", FETCHABLE_SH, "ktdeploy-fetch", str(p), "1024"], timeout=30)
    assert r.returncode == rc


# ---------------------------------------------------------------- hosts and their passwords

@pytest.mark.parametrize("host,secret", [("admin:S3cr/et#pw@gpu01", "S3cr/et#pw"),
                                         ("ssh://admin:S3cr?et@gpu01:22", "S3cr?et"), ("a:b@c/d@gpu01", "b@c/d")])
def test_a_password_with_url_characters_is_never_shown(host, secret):
    from ktdeploy.controller.connectors import parse_ssh_target
    from ktdeploy.core.safeio import redact_host

    assert secret not in redact_host(host)
    user, hostname, _ = parse_ssh_target(host)
    assert hostname == "gpu01" and user in ("admin", "a")


def test_an_unparsable_host_error_hides_its_password(tmp_path, monkeypatch):
    """A usage error (2), decided before anything is recorded or reached."""
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    rc, out, _ = invoke(["up", "--host", f"admin:{SECRET}/x@gpu01:notaport", str(ROOT / "recipes/tiny-moe-lora.yaml")],
                        cwd=tmp_path)
    assert rc == 2 and not problems(rc, out, records=tmp_path / "home"), out
    assert not (tmp_path / "home").exists()


def test_a_url_password_in_a_recipe_value_stops_before_any_record(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    rc, out, _ = invoke(["up", "--host", "gpu01", str(ROOT / "recipes/tiny-moe-lora.yaml"), "--dry-run", "--facts",
                         str(ROOT / "examples/facts/gpu-h200-1gpu.json"),
                         "--set", f"train.run_name=https://bob:{SECRET}@hub.example.com/x"], cwd=tmp_path)
    assert rc == 2 and "secrets.url_password" in out or "password in a URL" in " ".join(out.split()), out
    assert not problems(rc, out, records=tmp_path / "home"), out


def test_a_known_hosts_fifo_is_refused_before_connecting(tmp_path):
    from ktdeploy.controller.connectors.ssh import SSHConnector
    from ktdeploy.core.errors import ConnectError

    os.mkfifo(tmp_path / "kh")
    t0 = time.monotonic()
    with pytest.raises(ConnectError, match="not a regular file"):
        SSHConnector("127.0.0.1", port=1, known_hosts=str(tmp_path / "kh"))
    assert time.monotonic() - t0 < 5


def test_host_key_fixes_are_commands_that_work(tmp_path):
    from ktdeploy.controller.connectors.ssh import _fix_for

    fix = _fix_for("Host key for 127.0.0.1 not found in known_hosts", "root@127.0.0.1", 32773)
    assert "ssh-keyscan -p 32773 127.0.0.1 >> ~/.ssh/known_hosts" in fix
    fix = _fix_for("host key does not match", "root@127.0.0.1", 32774, str(tmp_path / "kh"))
    assert f"ssh-keygen -R '[127.0.0.1]:32774' -f {tmp_path / 'kh'}" in fix
    assert "ssh-keygen -R gpu01." in _fix_for("host key does not match", "me@gpu01", 22)
