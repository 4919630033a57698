"""ktdeploy.core.host_settings: one set of host settings gives doctor's and `ktdeploy up`'s arguments."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ktdeploy.core.host_settings import HostSettings, launch_record_name
from ktdeploy.core.recipe import load_recipe

HOSTVARS = {"ktdeploy_gpus": [0, 1, 2, 3], "ktdeploy_volumes": {"model": "/srv/models/m", "output": "/srv/out"},
            "ktsft_isa": "avx512", "ktdeploy_waive_checks": ["gpu.present"],
            "ktdeploy_recipe_set": ["train.kt_config.kt_num_threads=28"], "ansible_host": "10.0.0.1"}


def _pairs(argv, flag):
    return [a for a in argv if a.startswith(flag + "=")]


def test_doctor_and_up_get_the_same_overrides_and_waivers():
    s = HostSettings.from_vars(HOSTVARS)
    doctor = s.doctor_argv("/opt/ktdeploy/recipes/r.yaml")
    up = s.up_argv("/opt/ktdeploy/recipes/r.yaml", detach=True, extra=["--resume", "auto"])
    assert _pairs(doctor, "--set") == _pairs(up, "--set") == [
        "--set=train.kt_config.kt_num_threads=28", "--set=deploy.gpus=[0, 1, 2, 3]",
        "--set=deploy.volumes.model=/srv/models/m", "--set=deploy.volumes.output=/srv/out",
        "--set=deploy.image=avx512_bf16"]   # the old name ktsft_isa: avx512 is the avx512_bf16 build
    assert _pairs(doctor, "--waive") == _pairs(up, "--waive") == ["--waive=gpu.present"]
    assert doctor[:4] == ["doctor", "--json", "--recipe", "/opt/ktdeploy/recipes/r.yaml"]
    assert up[:5] == ["up", "--host", "localhost", "--no-progress", "--detach"] and up[-2:] == ["--resume", "auto"]


def test_overrides_apply_to_a_real_recipe(tmp_path):
    s = HostSettings(gpus=(0, 1), volumes={"output": str(tmp_path)}, isa="avx2")
    r = load_recipe("recipes/tiny-moe-lora.yaml", s.overrides())
    assert list(r.deploy.gpus) == [0, 1] and str(r.deploy.volumes.output) == str(tmp_path)
    assert "avx2" in str(r.deploy.image)


def test_without_recipe_doctor_checks_the_isa_override():
    assert HostSettings(isa="amx").doctor_argv(None) == ["doctor", "--json", "--variant", "amx"]
    assert HostSettings().doctor_argv("") == ["doctor", "--json"]


@pytest.mark.parametrize("bad", [{"ktdeploy_volumes": {"models": "/x"}}, {"ktdeploy_volumes": {"model": "rel"}},
                                 {"ktsft_isa": "sse"}, {"ktdeploy_recipe_set": ["nokey"]}, {"ktdeploy_gpus": ["a"]}])
def test_bad_host_vars_are_refused(bad):
    with pytest.raises(ValidationError):
        HostSettings.from_vars(bad)


def test_launch_record_is_keyed_on_recipe_content_and_settings(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text("a: 1\n")
    base = launch_record_name(r, HostSettings(gpus=(0,)))
    assert base.startswith("train-r-") and base.endswith(".json")
    assert launch_record_name(r, HostSettings(gpus=(0,))) == base
    assert launch_record_name(r, HostSettings(gpus=(0, 1))) != base        # other GPUs: a new launch
    r.write_text("a: 2\n")
    assert launch_record_name(r, HostSettings(gpus=(0,))) != base          # edited recipe: a new launch


def test_image_check_argv_carries_the_hosts_gpus_and_waivers():
    s = HostSettings(gpus=(0, 1), waive=("gpu.present", "stack.cuda"))
    assert s.image_check_argv("ktsft:amx") == ["doctor", "--json", "--image", "ktsft:amx", "--gpus", "0,1",
                                               "--waive=gpu.present", "--waive=stack.cuda"]
    assert HostSettings().image_check_argv("r/x@sha256:ab") == ["doctor", "--json", "--image", "r/x@sha256:ab"]


def test_preflight_in_image_mode_runs_doctor_with_the_training_containers_flags():
    """ansible's preflight (image mode) starts the image's doctor with the flags `up` gives the training
    container: the same GPUs, IPC, SYS_NICE and memlock (dropped only when docker.memlock is waived, as up does)."""
    from ktdeploy.core.plan import docker_argv as dk
    from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER

    for waive, memlock in (([], True), ([MEMLOCK_WAIVER], False)):
        s = HostSettings(gpus=[0, 2], waive=waive)
        argv = s.doctor_in_image_argv("ktsft:amx", ("/srv/r.yaml", "/recipe/r.yaml"))
        flags = dk.training_flags(gpus=[0, 2], memlock=memlock)
        assert argv[:2] == ["docker", "run"] and argv[argv.index("--network") + 2:][:len(flags)] == flags
        assert ("--ulimit" in argv) is memlock
        train = dk.create_train(name="j", image="ktsft:amx", run_id="r", volumes=_Vols(), output_dir="/o",
                                gpus=[0, 2], memlock=memlock)
        assert all(f in train for f in flags)                       # the launched container has each flag
        tail = argv[argv.index("--") + 1:]
        assert tail == ["ktsft:amx", *s.doctor_argv("/recipe/r.yaml"), "--stack"]
        assert "type=bind,source=/srv/r.yaml,target=/recipe/r.yaml,readonly" in argv


class _Vols:
    model, data, output = "/srv/models", "/srv/data", "/srv/output"
