"""One run, one lock (Probe 3's F5, F6): `up-slurm` takes the job lock as `up` does, and every spelling of one
output folder (``//``, ``/./``, a link) is one job."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.recipe import load_recipe
from tests.unit.adversarial.harness import invoke, problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


def tiny(*sets):
    return load_recipe(TINY, ["deploy.scheduler.cpus=4", *sets])


# -- F5/F6: one run, one lock — up-slurm too, and every spelling of one output folder -------------------------------
def test_f5_up_slurm_takes_the_job_lock(tmp_path, monkeypatch):
    from ktdeploy.controller.runs import job_lock
    from ktdeploy.core.plan.host_plan import job_name

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    with job_lock("login01", job_name(tiny())):
        rc, out, secs = invoke(["up-slurm", "login01", "--set", "deploy.scheduler.cpus=4", str(TINY)], cwd=tmp_path)
    assert rc == 6 and "already working on the job" in " ".join(out.split()) and secs < 5, out
    assert not problems(rc, out)
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


@pytest.mark.parametrize("spelling", ["//srv/ktdeploy/output/tiny-moe-lora", "/srv/ktdeploy/output/./tiny-moe-lora",
                                      "/srv/ktdeploy//output/tiny-moe-lora/", "/srv/ktdeploy/output/x/../tiny-moe-lora"])
def test_f6_spellings_of_one_output_folder_are_one_job(spelling):
    from ktdeploy.core.plan.host_plan import job_name

    assert job_name(tiny(f"train.output_dir={spelling}")) == job_name(tiny("train.output_dir=/srv/ktdeploy/output/tiny-moe-lora"))


def test_f6_a_link_to_the_output_folder_takes_the_same_lock(tmp_path, monkeypatch):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.runs import output_lock
    from ktdeploy.core.errors import RunRecordError

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    real = tmp_path / "out" / "run"
    real.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "out")
    with output_lock(LocalConnector(), "localhost", str(real)):
        with pytest.raises(RunRecordError) as e, output_lock(LocalConnector(), "localhost",
                                                            str(tmp_path / "alias" / "run")):
            pass
        assert "already working" in e.value.message and e.value.fix
        with output_lock(LocalConnector(), "localhost", str(tmp_path / "out" / "other")):
            pass    # another folder: its own lock
