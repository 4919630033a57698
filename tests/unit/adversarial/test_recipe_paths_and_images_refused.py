"""Recipe values that name the wrong thing (Probe 3's F2, F17): a volume at a system folder is refused naming the
key, and so is another spelling of an image (one spelling per image); the ordinary ones still pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktdeploy.core.recipe import load_recipe, validate
from ktdeploy.core.recipe.finding import errors

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


def tiny(*sets):
    return load_recipe(TINY, ["deploy.scheduler.cpus=4", *sets])


# -- F17: other spellings of deploy.image ------------------------------------------------------------------------
@pytest.mark.parametrize("image", ["AMX", " amx", "amx\u00a0", "Auto", "AVX512_BF16", "ktsft:AMX", "ktsft:amx",
                                   "reg.example.com/team/ktsft:avx512", "./ktsft-amx.tar", "/images/amx",
                                   "../amx", "-amx", "ktsft: amx"])
def test_f17_another_spelling_of_an_image_is_refused_at_check(image):

    errs = [f for f in errors(validate(tiny(f"deploy.image={json.dumps(image)}"))) if f.path == "deploy.image"]
    assert errs and errs[0].fix, image


@pytest.mark.parametrize("image", ["auto", "amx", "avx512", "reg/x:1", "ktdeploy/fake-trainer:0123abcd",
                                   "registry.example.com:5000/team/trainer:v2"])
def test_f17_the_exact_spellings_still_pass(image):
    assert not [f for f in errors(validate(tiny(f"deploy.image={image}"))) if f.path == "deploy.image"]


# -- F2: volumes at system folders --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["model", "data", "output"])
@pytest.mark.parametrize("path", ["/etc", "/usr/local", "/proc", "/sys/fs", "/dev", "/boot", "/var/run/docker.sock",
                                  "/run/docker.sock", "/home/alice", "/root", "/home", "//etc/", "/srv/../etc"])
def test_f2_a_volume_at_a_system_folder_is_refused_naming_the_key(key, path):
    sets = [f"deploy.volumes.{key}={path}"]
    errs = [f for f in errors(validate(tiny(*sets))) if f.path == f"deploy.volumes.{key}" and f.rule ==
            "deploy.system_volumes"]
    assert errs and errs[0].fix, (key, path)


@pytest.mark.parametrize("path", ["/srv/ktdeploy/models", "/home/alice/models", "/data/etc", "/mnt/usr"])
def test_f2_ordinary_folders_still_pass(path):
    assert not [f for f in validate(tiny(f"deploy.volumes.model={path}")) if f.rule == "deploy.system_volumes"]
