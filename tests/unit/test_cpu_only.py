"""One named profile for a host without a GPU (`--cpu-only`): it waives exactly the GPU checks, on the controller
and in the training container's own doctor, and it is offered only where the host has no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.agent.train import run_doctor
from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.controller.runs import all_runs
from ktdeploy.controller.up_inputs import load_facts_file
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import CPU_ONLY_WAIVERS, profile_hint, with_profile
from ktdeploy.core.errors import CheckFailed
from ktdeploy.core.recipe import load_recipe
from tests.fakes.image import image_archive

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes/tiny-moe-lora.yaml"
NO_GPU = REPO / "tests/golden/avx512-kvm-container/facts.json"
H200 = REPO / "examples/facts/gpu-h200-1gpu.json"


def cli(*args, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                          timeout=180, cwd=REPO)


def test_the_profile_is_exactly_the_gpu_checks():
    """Every check that asks for a GPU, and nothing else: on a GPU-less recorded host the profile turns every
    failing GPU check into a waiver and leaves the rest of the report as it was."""
    facts = load_facts_file(NO_GPU)
    report = DoctorReport(facts, run_checks(facts, load_recipe(TINY)))
    gpu_fails = {c.name for c in report.failed if c.name.startswith("gpu.") or "nvidia" in c.name}
    assert gpu_fails and gpu_fails <= set(CPU_ONLY_WAIVERS)
    other = {c.name for c in report.failed} - gpu_fails
    report.waived = with_profile((), cpu_only=True)
    assert {c.name for c in report.failed} == other
    assert all(n.startswith(("gpu.", "stack.cuda", "stack.triton", "layer.gpus", "plan.gpu_memory", "docker.nvidia"))
               for n in CPU_ONLY_WAIVERS)


def _fail(name: str) -> CheckResult:
    return CheckResult(name=name, status="fail", detail="x")


@pytest.mark.parametrize("failed,gpus,offered", [
    (["gpu.present", "gpu.count_vs_recipe"], 0, True),
    (["gpu.present", "path.model_exists"], 0, True),
    (["path.model_exists"], 0, False),          # nothing the profile would waive: no invitation
    (["gpu.memory", "plan.host_memory"], 1, False),   # a GPU host short of memory is never invited to waive
    (["plan.gpu_memory"], 4, False),
])
def test_the_hint_is_offered_only_on_a_host_without_a_gpu(failed, gpus, offered):
    hint = profile_hint([_fail(n) for n in failed], gpus)
    assert ("--cpu-only" in hint) is offered
    assert "--waive" not in hint


def test_up_on_a_gpu_host_that_fails_never_suggests_waiving(tmp_path):
    r = cli("up", "--host", "gpu01", str(REPO / "recipes/qwen35-397b-bf16-lora.yaml"), "--dry-run", "--facts",
            str(H200), home=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 1 and "plan.host_memory" in err, err
    assert "--cpu-only" not in err and "--waive" not in err, err


def test_up_without_a_gpu_offers_the_profile_and_the_profile_reaches_the_container(tmp_path):
    r = cli("up", "--host", "gpu01", str(TINY), "--dry-run", "--facts", str(NO_GPU), home=tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 1 and "add --cpu-only" in err and "gpu.present" in err, err
    r = cli("up", "--host", "gpu01", str(TINY), "--dry-run", "--facts", str(NO_GPU), "--cpu-only",
            "--image-tar", str(image_archive(tmp_path / "ktsft.tar")), home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    create = next(ln for ln in r.stdout.splitlines() if "$ docker create" in ln and "role=train" in ln)
    assert "--gpus" not in create
    for name in CPU_ONLY_WAIVERS:    # the training container's own doctor gets the same waivers
        assert f"--waive {name}" in create, create
    rec = [x for x in all_runs(tmp_path / "runs") if x.status().get("profile")][-1]
    assert rec.status()["profile"] == "cpu-only" and set(CPU_ONLY_WAIVERS) <= set(rec.status()["waived"])


def test_the_profile_is_refused_on_a_host_with_gpus(tmp_path):
    r = cli("up", "--host", "gpu01", str(TINY), "--dry-run", "--facts", str(H200), "--cpu-only", home=tmp_path)
    assert r.returncode == 2 and "--cpu-only is for a host without a GPU" in " ".join(r.stderr.split()), r.stderr


def _no_gpu_report(recipe):
    facts = load_facts_file(NO_GPU)
    return DoctorReport(facts, run_checks(facts, recipe))


def test_the_training_containers_doctor_takes_the_same_waivers():
    """`ktdeploy train --waive …` (what `up` passes) lets the agent's gate pass the GPU checks; without them it
    refuses, and its fix offers the profile."""
    recipe = load_recipe(TINY, ["deploy.volumes.model=/", "deploy.volumes.data=/", "train.dataset_dir=/",
                                "train.model_name_or_path=/"])

    def diagnose(r):
        rep = _no_gpu_report(r)
        rep.checks = [c for c in rep.checks if not c.name.startswith(("path.", "data.", "model.", "disk."))]
        return rep

    with pytest.raises(CheckFailed) as ei:
        run_doctor(recipe, False, diagnose=diagnose)
    assert {c.name for c in ei.value.results} & set(CPU_ONLY_WAIVERS) and "--cpu-only" in ei.value.fix
    derived, report, _ = run_doctor(recipe, False, diagnose=diagnose, waive=with_profile((), True))
    assert report["ok"] is True and set(report["waived"]) == set(CPU_ONLY_WAIVERS)


def test_doctor_json_records_the_profile_waivers(tmp_path):
    out = cli("doctor", "--json", "--cpu-only", home=tmp_path)
    data = json.loads(out.stdout)
    assert set(data["waived"]) == set(CPU_ONLY_WAIVERS)
    assert not {c for c in data["failed"] if c in CPU_ONLY_WAIVERS}
