"""`ktdeploy status --all`: one table of run, target, stage, state, age and a one-line reason; run ids printed
whole (they are what --run takes), at 80 columns and wide; no run recorded yet is exit 0 with the command that
starts one (not exit 6)."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from ktdeploy.controller import runs

LONG = "glm-4.5-air-bf16-lora-long-recipe-name-here"


def cli(*args, home, columns=200):
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": str(columns), "KTDEPLOY_HOME": str(home)})


@pytest.mark.parametrize("columns", [80, 100, 240])
def test_status_all_prints_every_id_whole(tmp_path, monkeypatch, columns):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    ids = []
    for i in range(2):
        r = runs.RunRecord.create(LONG)
        r.set_status("detached", host="ssh://someuser@gpu-host-number-01.example.org:2222", recipe=LONG,
                     container="ktd-glm-4.5-air-bf16-lora-0123456789ab", created=float(i),
                     note="--detach: training runs on the host")
        ids.append(r.id)
    p = cli("status", "--all", home=tmp_path, columns=columns)
    assert p.returncode == 0, p.stderr
    assert all(len(line) <= columns for line in p.stdout.splitlines()), p.stdout
    tokens = set(re.split(r"[\s│┃]+", p.stdout))
    for rid in ids:
        assert rid in tokens, p.stdout           # whole, as one token: --run accepts what was printed
        assert runs.latest_run(run_id=rid).id == rid
    assert "ssh://someuser@gpu-host-number-01.example.org:2222" in tokens


def test_the_table_says_where_each_run_stands_and_why(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    now = time.time()
    crashed = runs.RunRecord.create("tiny-moe-lora")
    crashed.set_status("crashed", host="gpu01", created=now - 3 * 3600, failed_stage="FOLLOW",
                       error="FOLLOW: the trainer crashed: RuntimeError: CUDA out of memory (trainer.py:12); full "
                             "log: /x/artifacts/container.log\ncontainer ktd-x exited")
    training = runs.RunRecord.create("tiny-moe-lora")
    training.set_status("training", host="localhost", created=now - 120, stage="FOLLOW",
                        progress={"current_steps": 40, "total_steps": 100, "loss": 1.25})
    done = runs.RunRecord.create("tiny-moe-lora")
    done.set_status("finished", host="gpu02", created=now - 2 * 86400, stage="SERVE",
                    adapter_dir="/srv/ktdeploy/output/tiny-moe-lora-sglang")
    p = cli("status", "--all", home=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["run", "target", "stage", "state", "age", "reason"], lines[0]
    row = {ln.split()[0]: ln.split(None, 5) for ln in lines[1:]}
    assert row[crashed.id][1:5] == ["gpu01", "FOLLOW", "crashed", "3h"], row
    assert row[crashed.id][5].startswith("FOLLOW: the trainer crashed: RuntimeError: CUDA out of memory")
    assert "container ktd-x exited" not in p.stdout          # one line per run
    assert row[training.id][1:5] == ["localhost", "FOLLOW", "training", "2m"]
    assert row[training.id][5] == "step 40/100, loss 1.2500"
    assert row[done.id][1:5] == ["gpu02", "SERVE", "finished", "2d"]
    assert row[done.id][5] == "adapter /srv/ktdeploy/output/tiny-moe-lora-sglang"


def test_a_long_reason_is_cut_to_the_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    r = runs.RunRecord.create("tiny")
    r.set_status("failed", host="gpu01", created=time.time(), failed_stage="IMAGE", error="x " * 200)
    p = cli("status", "--all", home=tmp_path, columns=100)
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and all(len(ln) <= 100 for ln in lines) and lines[1].endswith("…"), p.stdout


@pytest.mark.parametrize("args", [["status", "--all"], ["status"]])
def test_no_run_yet_is_not_an_error(tmp_path, args):
    p = cli(*args, home=tmp_path)
    out = " ".join(p.stdout.split())
    assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
    assert out.startswith("no run recorded yet") and f"{tmp_path}/runs" in out and "`ktdeploy up`" in out, out


def test_no_run_yet_as_json_is_an_empty_list(tmp_path):
    p = cli("status", "--all", "--json", home=tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout) == []


def test_a_named_run_that_does_not_exist_is_still_exit_6(tmp_path):
    p = cli("status", "--run", "nosuchrun", home=tmp_path)
    assert p.returncode == 6 and "status --all" in p.stderr


def test_at_80_columns_the_shipped_recipes_runs_are_still_a_table(tmp_path, monkeypatch):
    """A run id of the tiny recipe is 36 characters: with target, stage, state and age that left no room for the
    reason at 80 columns, and the table became one five-line block per run. It stays a table — one row per run,
    its reason on the line below, cut to the width."""
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    made = []
    for i in range(2):
        r = runs.RunRecord.create("tiny-moe-lora")
        r.set_status("failed", host="localhost", created=time.time() - 60, failed_stage="PREFLIGHT",
                     error="doctor on localhost: 17 pass, 2 warn, 7 fail (1 left to the RUNTIME stage), 3 skip; "
                           "nothing was started " + "x" * i * 80)
        made.append(r.id)
    p = cli("status", "--all", home=tmp_path, columns=80)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and all(len(ln) <= 80 for ln in lines), p.stdout
    assert lines[0].split() == ["run", "target", "stage", "state", "age"], p.stdout
    for k, rid in enumerate(made):
        row, reason = lines[1 + 2 * k], lines[2 + 2 * k]
        assert row.split() == [rid, "localhost", "PREFLIGHT", "failed", "1m"], p.stdout
        assert reason.startswith("    doctor on localhost: 17 pass"), p.stdout
    assert lines[4].endswith("…") and len(lines) == 5, p.stdout
