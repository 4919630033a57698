"""`ktdeploy up --dry-run --facts FILE`: a plan from recorded facts, before the host exists (real CLI, no host)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.controller import runs

REPO = Path(__file__).resolve().parents[3]


def cli(args, home, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "120"}, timeout=120)


def readme_dry_run_line() -> list[str]:
    lines = [ln for ln in (REPO / "README.md").read_text().splitlines() if " up " in ln and "--dry-run" in ln]
    assert lines, "the README's quick start has an `up ... --dry-run` line"
    argv = shlex.split(lines[0].split("#")[0])
    assert argv[0].endswith("ktdeploy") and "--facts" in argv
    return argv[1:]


def test_the_readme_dry_run_works_as_written(tmp_path):
    args = readme_dry_run_line()
    r = cli(args, tmp_path)
    # a fresh host has no image and the recipe names no registry: the plan stops at IMAGE, as the real run would (4)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "ktdeploy up plan — host gpu01" in r.stdout and "not connecting to gpu01" in r.stdout
    assert "docker create --name ktd-tiny-moe-lora-" in r.stdout and "This plan stops at IMAGE" in r.stdout
    (rec,) = runs.all_runs(tmp_path / "runs")
    st = rec.status()
    assert st["state"] == "dry-run" and st["dry_run"] is True and st["facts_file"].endswith(".json")
    assert st["stops_at"] == "IMAGE"
    assert json.loads((rec.path / "facts.json").read_text())["cpu"]["model_name"]


def test_a_recipe_the_recorded_host_cannot_run_prints_the_plan_and_the_failing_checks(tmp_path):
    args = readme_dry_run_line()
    args[args.index("recipes/tiny-moe-lora.yaml")] = "recipes/qwen35-397b-bf16-lora.yaml"
    r = cli(args, tmp_path)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1, out
    assert "ktdeploy up plan — host gpu01" in out and "plan.host_memory" in out and "gpu.count_vs_recipe" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("golden", ["avx512-kvm-container", "haswell-avx2-qemu"])
def test_a_bare_golden_facts_json_is_accepted(tmp_path, golden):
    r = cli(["up", "--host", "gpu01", "recipes/tiny-moe-lora.yaml", "--dry-run", "--facts",
             f"tests/golden/{golden}/facts.json", "--waive", "gpu.present", "--waive", "gpu.count_vs_recipe",
             "--waive", "docker.nvidia_runtime", "--waive", "docker.memlock"], tmp_path)
    # doctor's verdict on that machine (1), or the plan's stop (4: no image on a fresh host), never connect (3)
    assert r.returncode in (1, 4), r.stdout + r.stderr
    assert "ktdeploy up plan — host gpu01" in r.stdout


def test_bad_facts_files_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"layer": "submarine"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes it: a reader that opened it plainly would wait forever
    for args, words in [
        (["--dry-run", "--facts", str(tmp_path / "missing.json")], "no such file"),
        (["--dry-run", "--facts", str(bad)], "not valid JSON"),
        (["--dry-run", "--facts", str(deep)], "nested"),
        (["--dry-run", "--facts", str(fifo)], "not a regular file"),
        (["--dry-run", "--facts", "/dev/zero"], "not a regular file"),
        (["--dry-run", "--facts", str(wrong)], "not host facts: layer"),
        (["--facts", "examples/facts/gpu-h200-1gpu.json"], "needs --dry-run"),
    ]:
        r = cli(["up", "--host", "gpu01", "recipes/tiny-moe-lora.yaml", *args], tmp_path)
        err = " ".join(re.sub("[│╭╮╰╯─]", " ", r.stderr).split())  # the panel box and its wrapping gone
        assert r.returncode == 2 and words in err and "Traceback" not in err, (args, err)


def test_deploy_root_moves_the_tiny_recipes_mounts(tmp_path):
    """One setting moves the shipped tiny recipe: the dry run's docker argv mounts the folders under the new root."""
    args = [*readme_dry_run_line(), "--set", "deploy.root=/data/kt"]
    r = cli(args, tmp_path)
    out = " ".join(r.stdout.split())
    assert r.returncode == 4, r.stdout + r.stderr
    for mount in ("type=bind,source=/data/kt/models,target=/data/kt/models,readonly",
                  "type=bind,source=/data/kt/data,target=/data/kt/data",
                  "type=bind,source=/data/kt/output,target=/data/kt/output"):
        assert mount in out, (mount, out[:3000])
    assert "/srv/ktdeploy" not in out
