"""`ktdeploy up-slurm LOGIN RECIPE` is the scheduler's own command, building one SlurmUpRequest; `up --slurm LOGIN`,
its former spelling, still runs it (with a note naming the new one) and refuses, by name, any option of `up` that
`up-slurm` does not take — no list of exclusions to keep in step."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.command_requests import SlurmUpRequest, SshOptions
from tests.unit.adversarial.harness import invoke

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny-moe-lora.yaml"


@pytest.fixture
def submitted(monkeypatch, tmp_path):
    from ktdeploy.controller import up_slurm

    seen: list[SlurmUpRequest] = []
    from ktdeploy.controller.runs import RunRecord
    from ktdeploy.controller.up_record import UpResult

    def fake(request, **kw):   # what up_slurm returns: an UpResult (the CLI reads .interrupted)
        seen.append(request)
        return UpResult(record=RunRecord.create("tiny-moe-lora", root=tmp_path / "runs"))

    monkeypatch.setattr(up_slurm, "up_slurm", fake)
    return seen


def test_up_slurm_builds_one_request(tmp_path, submitted):
    rc, out, _ = invoke(["up-slurm", "ops@login01", str(TINY), "--dry-run", "--set", "deploy.scheduler.cpus=4",
                         "--waive", "gpu.present", "--ssh-key", "/k"], cwd=tmp_path)
    assert rc == 0, out
    assert submitted == [SlurmUpRequest(login="ops@login01", recipe=TINY, overrides=("deploy.scheduler.cpus=4",),
                                        dry_run=True, waive=("gpu.present",), ssh=SshOptions(key="/k"))]


def test_the_former_spelling_runs_the_same_request_and_names_the_new_one(tmp_path, submitted):
    rc, out, _ = invoke(["up", "--slurm", "ops@login01", str(TINY), "--dry-run", "--set", "deploy.scheduler.cpus=4",
                         "--waive", "gpu.present", "--ssh-key", "/k"], cwd=tmp_path)
    assert rc == 0, out
    assert submitted == [SlurmUpRequest(login="ops@login01", recipe=TINY, overrides=("deploy.scheduler.cpus=4",),
                                        dry_run=True, waive=("gpu.present",), ssh=SshOptions(key="/k"))]
    assert "ktdeploy up-slurm LOGIN RECIPE" in " ".join(out.split())


@pytest.mark.parametrize("extra", [["--host", "gpu01"], ["--tune"], ["--cpu-only"], ["--name", "x"],
                                   ["--sync-data", "/d"], ["--facts", "/f.json"], ["--tune-budget-minutes", "5"]])
def test_the_former_spelling_refuses_what_up_slurm_does_not_take(tmp_path, submitted, extra):
    rc, out, _ = invoke(["up", "--slurm", "login01", *extra, str(TINY)], cwd=tmp_path)
    assert rc == 2 and not submitted, out
    assert extra[0] in out and "up-slurm" in out
