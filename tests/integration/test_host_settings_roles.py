"""The fleet roles build doctor's argv (preflight) and `ktdeploy up`'s (train, serve) from one set of host
settings: rendered by ansible itself from the roles' own defaults/vars files and an inventory's host vars."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker  # integration tier (needs ansible-core, no docker)
REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent


def render(tmp: Path, hostvars: dict, ansible_bin: Path = BIN) -> dict:
    roles = ANSIBLE / "roles"
    files = [str(roles / r / d / "main.yml") for r in ("preflight", "train", "serve") for d in ("defaults", "vars")]
    inv = tmp / "inv.json"
    inv.write_text(json.dumps({"all": {"children": {"ktdeploy_fleet": {"hosts": {"gpu01": hostvars}}}}}))
    play = tmp / "render.yml"
    play.write_text(json.dumps([{"hosts": "gpu01", "gather_facts": False, "connection": "local",
                                 "vars": {"playbook_dir": str(ANSIBLE), "ktdeploy_recipe": str(REPO / "recipes" / "tiny-moe-lora.yaml")},
                                 "vars_files": files, "tasks": [{"ansible.builtin.copy": {
                                     "dest": str(tmp / "out.json"), "mode": "0644",
                                     "content": "{{ {'doctor': preflight_doctor_args, 'train': train_up_argv, "
                                                "'serve': serve_up_argv, 'record': train_record} | to_json }}"},
                                     "delegate_to": "localhost"}]}]))
    env = dict(os.environ, ANSIBLE_FILTER_PLUGINS=str(ANSIBLE / "filter_plugins"), ANSIBLE_NOCOLOR="1",
               PATH=f"{ansible_bin}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run([str(ansible_bin / "ansible-playbook"), "-i", str(inv), str(play),
                        "-e", f"ansible_python_interpreter={sys.executable}"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return json.loads((tmp / "out.json").read_text())


def flags(argv, flag):
    return [a for a in argv if a.startswith(flag + "=")]


def test_doctor_train_and_serve_argv_come_from_the_same_host_settings(tmp_path):
    hv = {"ktdeploy_gpus": [0, 1, 2, 3], "ktdeploy_volumes": {"model": "/srv/models/q", "data": "/srv/data"},
          "ktsft_isa": "avx512", "ktdeploy_waive_checks": ["gpu.present"],
          "ktdeploy_recipe_set": ["train.kt_config.kt_num_threads=28"]}
    out = render(tmp_path, hv)
    doctor, train, serve = out["doctor"], out["train"], out["serve"]
    sets = flags(doctor, "--set")
    assert "--set=deploy.gpus=[0, 1, 2, 3]" in sets and "--set=deploy.volumes.model=/srv/models/q" in sets
    assert "--set=deploy.image=avx512_bf16" in sets and "--set=train.kt_config.kt_num_threads=28" in sets
    assert flags(train, "--set") == flags(serve, "--set") == sets
    assert flags(doctor, "--waive") == flags(train, "--waive") == flags(serve, "--waive") == ["--waive=gpu.present"]
    assert train[1:3] == ["up", "--host"] and "--detach" in train and "--detach" not in serve
    # the launch record names the recipe and a key of its content + these settings
    rec = Path(out["record"]).name
    assert rec.startswith("train-tiny-moe-lora-") and rec.endswith(".json")
    other = render(tmp_path, {**hv, "ktdeploy_gpus": [0]})
    assert Path(other["record"]).name != rec and "--set=deploy.gpus=[0]" in flags(other["train"], "--set")


def test_a_bad_host_setting_fails_with_its_name(tmp_path):
    with pytest.raises(AssertionError) as e:
        render(tmp_path, {"ktdeploy_volumes": {"models": "/srv/m"}})
    assert "unknown volume" in str(e.value) and "ktdeploy_volumes" in str(e.value)
