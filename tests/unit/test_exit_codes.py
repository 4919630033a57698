"""Conventional exit codes (README "Exit codes"): a --host that is no host is a usage error (2), a closed output
pipe ends quietly (141, as `yes | head`), a dry run whose plan stops exits as the real run would (4), and the dry
run's docker argv is the real run's, --user included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.controller.up_host import planned_user
from ktdeploy.controller.up_inputs import load_facts_file
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.recipe import load_recipe
from tests.fakes.image import image_archive

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes/tiny-moe-lora.yaml")
FACTS = str(REPO / "examples/facts/gpu-h200-1gpu.json")


def cli(*args, home: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO, **kw)


@pytest.mark.parametrize("host", ["https://gpu01", "http://kt@gpu01", "gpu01:notaport", "ssh://gpu01/x", "-oX=y"])
def test_a_host_that_is_no_host_is_a_usage_error_before_anything_is_recorded(tmp_path, host):
    r = cli("up", "--host", host, TINY, home=tmp_path)
    assert r.returncode == 2, r.stderr
    err = " ".join(r.stderr.split())
    assert "UsageError: --host:" in err and "is not a host" in err and "ssh://user@host:port" in err, err
    assert not (tmp_path / "runs").exists()
    for cmd in ("status", "logs", "down"):
        assert cli(cmd, "--host", host, home=tmp_path).returncode == 2


@pytest.mark.parametrize("text,kind,address,user,port", [
    ("localhost", "local", "localhost", None, None), ("", "local", "localhost", None, None),
    ("gpu01", "ssh", "gpu01", None, 22), ("kt@gpu01:2200", "ssh", "gpu01", "kt", 2200),
    ("ssh://root:pw@10.0.0.5:22", "ssh", "10.0.0.5", "root", 22), ("docker://train1", "docker", "train1", None, None)])
def test_host_target_forms(text, kind, address, user, port):
    t = parse_host(text)
    assert (t.kind, t.address, t.user, t.port) == (kind, address, user, port)
    assert "pw" not in t.redacted


def _closed_pipe_run(args: list[str], home: Path) -> tuple[int, str]:
    """The reader is gone before the first byte is written (`ktdeploy ... | head -0`): deterministic EPIPE."""
    r, w = os.pipe()
    os.close(r)
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "80"}
    p = subprocess.run([sys.executable, "-m", "ktdeploy", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=120, cwd=REPO)
    os.close(w)
    return p.returncode, p.stderr


@pytest.mark.parametrize("args", [["up", "--help"], ["--help"], ["check", TINY], ["status", "--all"]])
def test_a_closed_pipe_ends_quietly_with_141(tmp_path, args):
    for _ in range(3):   # deterministic (the pipe is closed first), run a few times anyway
        rc, err = _closed_pipe_run(args, tmp_path)
        assert rc == 141 and err == "", (rc, err)


def test_output_to_dev_null_is_not_a_closed_pipe(tmp_path):
    env = {**os.environ, "KTDEPLOY_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "check", TINY], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, env=env, timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stderr == ""


def test_a_dry_run_whose_plan_stops_exits_4_and_one_that_goes_through_0(tmp_path):
    r = cli("up", "--host", "gpu01", TINY, "--dry-run", "--facts", FACTS, home=tmp_path)
    assert r.returncode == 4 and "This plan stops at IMAGE" in r.stdout, r.stdout + r.stderr
    r = cli("up", "--host", "gpu01", TINY, "--dry-run", "--facts", FACTS, "--image-tar", str(image_archive(tmp_path / "ktsft.tar")), home=tmp_path)
    assert r.returncode == 0 and "This plan stops" not in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("host,user", [("root@gpu01", "0:0"), ("ssh://root@gpu01:22", "0:0"),
                                       ("kt@gpu01", "<uid>:<gid>"), ("gpu01", "<uid>:<gid>")])
def test_the_dry_run_argv_is_the_real_runs(host, user):
    """With recorded facts the SSH user's ids are not known yet: root's are 0:0, anyone else's a placeholder in
    the same place; the argv is otherwise the one a live state gives."""
    recipe, facts = load_recipe(TINY), load_facts_file(FACTS)
    assert planned_user(host) == user
    opts = UpOptions(host=host, run_id="r1", image_tar="/x/ktsft.tar")
    planned = build_plan(recipe, facts, JobState(home="/home/kt", user=user), opts)
    live = build_plan(recipe, facts, JobState(home="/home/kt", user="1001:1002"), opts)

    def create(plan):
        return next(s.argv for _, s in plan.steps() if s.id == "train.create")

    a, b = list(create(planned)), list(create(live))
    assert a[a.index("--user") + 1] == user
    b[b.index("--user") + 1] = user
    if user == "0:0":   # root needs no writable HOME
        i = b.index("HOME=/tmp")
        del b[i - 1:i + 1]
    assert a == b
