"""Issue 45, class 6: the lesser findings, each through the command a user types.

- `merge` of a rank-0 adapter exited 70 (alpha / r, r = 0): exit 2 naming the rank.
- `train --tuned` of a malformed tune record (a list where the choice or a number belongs) exited 70; a key with
  junk around it (`"kt_num_threads "`) was applied as another key: exit 2 naming the key, nothing applied.
- `COLUMNS=0` (or 1) made `check` and `render` print nothing at all: at least MIN_WIDTH columns.
- The facts script fell back to `/tmp/ktd-gather-$$` when `mktemp` failed: a real second user plants that path
  first (a file of theirs, a link to one of root's) and root gathers with a failing mktemp: nothing of theirs is
  written, read or removed (stderr goes to /dev/null then).
- `recipe from-lf` wrote a URL password into the new recipe before `check` refused it: refused, nothing written.
- `from-lf` (and `check`) accepted volumes at a home's credential folders (`~/.aws`, `~/.ssh/x`, `~/.config`
  around gcloud's): refused as the home itself was.

(`ansible-playbook --check` on a fresh host: tests/integration/test_ansible_check_fresh.py; `--sync-model` through
a link at the host's folder: test_round6_sync.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import kt_layout as kl
from tests.unit.agent.merge.test_merge import MINI

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "tiny-moe-lora.yaml"


def _cli(*args: str, cwd: Path, columns: str = "200") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": columns})


def _flat(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- merge: rank 0

def test_merge_of_a_rank_0_adapter_is_a_usage_error(tmp_path):
    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2)
    kl.write_lora_adapter(str(tmp_path / "out"), base=str(tmp_path / "base"), m=MINI, seed=3, rank=0)
    r = _cli("merge", str(tmp_path / "out"), "--base", str(tmp_path / "base"), "-o", str(tmp_path / "m"), cwd=tmp_path)
    assert r.returncode == 2 and "rank 0" in _flat(r.stderr) and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- train --tuned

TUNED = {
    "a list as the choice": ({"chosen": [4, 1]}, "'chosen' is a list"),
    "a list as a count": ({"chosen": {"kt_num_threads": [4], "kt_threadpool_count": 1}}, "chosen.kt_num_threads"),
    "a list as the rate": ({"chosen": {"kt_num_threads": 4, "kt_threadpool_count": 1}, "chosen_tokens_per_s": [1]},
                           "chosen_tokens_per_s"),
    "a blank after a key": ({"chosen": {"kt_num_threads ": 5, "kt_threadpool_count": 1}}, '"kt_num_threads "'),
    "a key with a dot": ({"chosen": {"kt_num_threads": 4, "kt_threadpool_count": 1, "kt_max_cache_depth.x": 9}},
                         '"kt_max_cache_depth.x"'),
    "a key with '=' in it": ({"chosen": {"kt_num_threads=99": 5, "kt_threadpool_count": 1}}, '"kt_num_threads=99"'),
    "a bool as a count": ({"chosen": {"kt_num_threads": True, "kt_threadpool_count": 1}}, "chosen.kt_num_threads"),
    "an unknown activation": ({"chosen": {"kt_num_threads": 4, "kt_threadpool_count": 1, "kt_cpu_activation": "x"}},
                              "chosen.kt_cpu_activation"),
}


@pytest.mark.parametrize("case", sorted(TUNED))
def test_a_malformed_tune_record_is_refused_naming_the_key(tmp_path, case):
    record, phrase = TUNED[case]
    (tmp_path / "tune.json").write_text(json.dumps(record))
    r = _cli("train", str(RECIPE), "--skip-doctor", "--dry-run", "--json", "--tuned", str(tmp_path / "tune.json"),
             "--run-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and phrase in _flat(r.stderr) and "--tuned" in r.stderr, (r.returncode, r.stderr[-1500:])
    assert "Traceback" not in r.stderr and not r.stdout.strip()


def test_what_tune_writes_is_still_applied(tmp_path):
    record = {"chosen": {"kt_num_threads": 6, "kt_threadpool_count": 2, "kt_max_cache_depth": 3,
                         "kt_cpu_activation": "retain"}, "chosen_tokens_per_s": 812.5, "speedup_vs_all_cores": 1.4}
    (tmp_path / "tune.json").write_text(json.dumps(record))
    r = _cli("train", str(RECIPE), "--skip-doctor", "--dry-run", "--json", "--tuned", str(tmp_path / "tune.json"),
             "--run-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    lines = [ln.strip() for ln in json.loads(r.stdout)["train_yaml"].splitlines()]
    assert {"kt_num_threads: 6", "kt_threadpool_count: 2", "kt_max_cache_depth: 3", "kt_cpu_activation: retain"} \
        <= set(lines)


# ---------------------------------------------------------------- COLUMNS=0

@pytest.mark.parametrize("columns", ["0", "1", "7"])
def test_a_zero_width_terminal_still_gets_the_answer(tmp_path, columns):
    r = _cli("check", str(RECIPE), cwd=tmp_path, columns=columns)
    assert r.returncode == 0 and "is valid" in _flat(r.stdout), (columns, r.stdout, r.stderr[-800:])
    r = _cli("render", str(RECIPE), "-o", str(tmp_path / f"out{columns}"), cwd=tmp_path, columns=columns)
    assert r.returncode == 0 and "wrote" in r.stdout and "train.yaml" in _flat(r.stdout), (columns, r.stdout)
    bad = tmp_path / "bad.yaml"
    bad.write_text(RECIPE.read_text().replace("finetuning_type: lora", "finetuning_type: lorra"))
    r = _cli("check", str(bad), cwd=tmp_path, columns=columns)
    assert r.returncode == 2 and "finetuning_type" in r.stdout + r.stderr, (columns, r.stdout, r.stderr)


# ---------------------------------------------------------------- the facts script's temp file

_EXEC_AS_THIS_PID = """
import os, subprocess, sys
script, uid, gid, victim, how = sys.argv[1:6]
planted = f"/tmp/ktd-gather-{os.getpid()}"   # what $$ is once this process execs sh
plant = {"file": 'umask 0; printf theirs > "$1"', "link": 'ln -s "$2" "$1"'}[how]
subprocess.run(["sh", "-c", plant, "-", planted, victim], check=True, user=int(uid), group=int(gid), extra_groups=[])
print(planted, flush=True)
os.execvp("sh", ["sh", "-c", script])
"""


@pytest.mark.parametrize("how", ["file", "link"])
def test_the_facts_script_never_falls_back_to_a_predictable_temp_file(tmp_path, intruder, how):
    from ktdeploy.controller.facts_gather import gather_script
    from ktdeploy.core.markers import parse_sections

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mktemp").write_text("#!/bin/sh\nexit 1\n")    # no temp file can be made
    (bindir / "mktemp").chmod(0o755)
    victim = tmp_path / "roots-file"
    victim.write_text("root's\n")
    p = subprocess.run([sys.executable, "-c", _EXEC_AS_THIS_PID, gather_script(), str(intruder[0]), str(intruder[1]),
                        str(victim), how], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    planted = Path(p.stdout.splitlines()[0])
    try:
        assert parse_sections(p.stdout), p.stderr[-800:]                 # the facts still came
        assert victim.read_text() == "root's\n", "root's file was written through the planted link"
        assert planted.is_symlink() or planted.exists(), "the planted path was removed (root acted on it)"
        if how == "file":
            assert planted.read_text() == "theirs", "root's command output went into the other user's file"
    finally:
        planted.unlink(missing_ok=True)


# ---------------------------------------------------------------- recipe from-lf

LF = ("model_name_or_path: {model}\nstage: sft\ndo_train: true\nfinetuning_type: lora\ndataset: tiny\n"
      "dataset_dir: {data}\noutput_dir: /srv/ktdeploy/output/run\ntemplate: qwen3\n")


@pytest.mark.parametrize("secret", ["report_to: mlflow\nmlflow_tracking_uri: https://me:S3cretPW@mlflow.example.com\n",
                                    "hub_token: hf_S3cretPWxxxxxxxxxxxxxxxxxxxx\n"])
def test_from_lf_never_writes_a_secret(tmp_path, secret):
    (tmp_path / "lf.yaml").write_text(LF.format(model="/srv/ktdeploy/models/m", data="/srv/ktdeploy/data") + secret)
    r = _cli("recipe", "from-lf", "lf.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "nothing was written" in _flat(r.stderr), (r.returncode, r.stdout, r.stderr[-1500:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lf.yaml"]
    assert "S3cretPW" not in r.stdout + r.stderr


@pytest.mark.parametrize("model,data,bad", [
    ("/root/.aws/models/m", "/srv/ktdeploy/data", "deploy.volumes.model"),
    ("/srv/ktdeploy/models/m", "/home/kt/.ssh/x", "deploy.volumes.data"),
    ("/home/kt/.config/m", "/srv/ktdeploy/data", "deploy.volumes.model"),
    ("/Users/kt/.kube/m", "/srv/ktdeploy/data", "deploy.volumes.model"),
    ("/home/kt/.cache/m", "/srv/ktdeploy/data", "deploy.volumes.model"),
])
def test_from_lf_refuses_volumes_at_a_homes_credentials(tmp_path, model, data, bad):
    (tmp_path / "lf.yaml").write_text(LF.format(model=model, data=data))
    r = _cli("recipe", "from-lf", "lf.yaml", cwd=tmp_path)
    assert r.returncode == 2 and f"error {bad}" in r.stdout and "holds credentials" in _flat(r.stdout), \
        (r.returncode, r.stdout[-2000:])
    c = _cli("check", "lf-recipe.yaml", cwd=tmp_path)
    assert c.returncode == 2 and "holds credentials" in _flat(c.stdout + c.stderr)


def test_a_model_under_a_homes_own_folder_is_still_fine(tmp_path):
    (tmp_path / "lf.yaml").write_text(LF.format(model="/home/kt/models/m", data="/home/kt/.cache/huggingface/hub"))
    r = _cli("recipe", "from-lf", "lf.yaml", cwd=tmp_path)
    assert "holds credentials" not in _flat(r.stdout) and "system_volumes" not in r.stdout, r.stdout[-2000:]
