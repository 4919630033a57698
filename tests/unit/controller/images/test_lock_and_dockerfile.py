"""The committed locks, stack.toml and Dockerfile agree with each other and with the cookbook's pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ktdeploy.controller.images.lockfile import parse_lock, read_lock
from ktdeploy.controller.images.tags import ISA_VARIANTS

ROOT = Path(__file__).resolve().parents[4]
STACK = tomllib.loads((ROOT / "docker" / "stack.toml").read_text())


@pytest.fixture(scope="module")
def full():
    return read_lock(ROOT / "docker" / "requirements" / "full.lock")


@pytest.fixture(scope="module")
def reduced():
    return read_lock(ROOT / "docker" / "requirements" / "reduced.lock")


def test_full_lock_pins_the_matched_kt_set(full):
    want = {
        "torch": "2.9.1", "ktransformers": "0.7.2", "kt-kernel": "0.7.2", "sglang-kt": "0.7.2",
        "transformers-kt": "5.6.0.post6", "accelerate-kt": "1.14.0.post4", "peft-kt": "0.18.1",
        "trl-kt": "0.24.0", "llamafactory-kt": "0.9.6.dev0",
    }
    assert {k: full.version(k) for k in want} == want


def test_full_lock_respects_caps(full):
    tok = tuple(int(x) for x in full.version("tokenizers").split("."))
    assert tok[:2] >= (0, 22) and tok <= (0, 23, 0)
    ct = tuple(int(x) for x in full.version("compressed-tensors").split(".")[:2])
    assert ct < (0, 16)


def test_upstream_forks_are_never_locked(full):
    names = {p.name for p in full.pins}
    for upstream in ("transformers", "accelerate", "peft", "trl"):
        assert upstream not in names
    assert set(STACK["full"]["excluded"]) == {"transformers", "accelerate", "peft", "trl"}


def test_every_entry_is_hash_locked_to_one_linux_cp311_wheel(full, reduced):
    for lock in (full, reduced):
        assert len(lock.pins) > 10
        for pin in lock.pins:
            assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256)
            assert pin.filename.endswith(".whl")
            tags = pin.filename[:-4].split("-")[-3:]
            assert tags[1] in ("none", "abi3", "cp311"), pin.filename
            assert tags[1] != "cp311" or tags[0] == "cp311", pin.filename
            assert tags[2] == "any" or "x86_64" in tags[2], pin.filename


def test_reduced_lock_uses_the_full_locks_versions(full, reduced):
    full_v = {p.name: p.version for p in full.pins}
    assert "torch" not in {p.name for p in reduced.pins}
    for pin in reduced.pins:
        if pin.name in full_v:
            assert pin.version == full_v[pin.name], pin.name


def test_both_locks_carry_ktdeploys_runtime_dependencies(full, reduced):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"]:
        name = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")
        assert full.version(name) and reduced.version(name), name


def test_parse_lock_rejects_an_entry_without_hash():
    with pytest.raises(ValueError):
        parse_lock("torch==2.9.1\n")


def dockerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = None
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            current = m.group(1)
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    return stages


def test_dockerfile_has_the_stage_chain_and_one_final_stage_per_isa():
    stages = dockerfile_stages()
    assert list(stages)[:5] == ["base", "deps-cuda", "deps", "light", "agent"]
    assert set(list(stages)[5:]) == set(ISA_VARIANTS)
    assert stages["deps"][0].split()[1] == "deps-cuda" and stages["light"][0].split()[1] == "base"


def test_no_version_and_no_ktdeploy_file_reach_the_dependency_layers():
    """A version bump or a code change must leave the dependency layers' IDs unchanged."""
    stages = dockerfile_stages()
    for st in ("deps-cuda", "deps"):
        text = " ".join(stages[st])
        assert "KTDEPLOY_VERSION" not in text and "image.version" not in text, st
        assert not any(ln.startswith("COPY") and ("ktdeploy/" in ln.split()[1] or ln.split()[1] == ".")
                       for ln in stages[st]), st


@pytest.mark.parametrize("isa", list(ISA_VARIANTS))
def test_build_commits_the_same_variant_config_as_the_dockerfile(isa):
    from ktdeploy.controller.images.build import commit_changes

    env = [ln for ln in dockerfile_stages()[isa] if ln.startswith("ENV")]
    assert env == [c for c in commit_changes(isa, {}) if c.startswith("ENV")]


@pytest.mark.parametrize("isa", list(ISA_VARIANTS))
def test_variant_stages_only_set_env_and_labels(isa):
    lines = dockerfile_stages()[isa]
    assert lines[0].split()[1] == "agent"
    assert all(ln.split()[0] in ("ENV", "LABEL") for ln in lines[1:]), lines
    env = " ".join(ln for ln in lines if ln.startswith("ENV"))
    assert f"KTSFT_VARIANT={isa}" in env
    assert f"KT_KERNEL_CPU_VARIANT={ISA_VARIANTS[isa]}" in env


def test_dockerfile_runs_as_non_root_and_enters_the_agent():
    stages = dockerfile_stages()
    assert stages["agent"][-1] == "USER kt"
    assert not any(ln.startswith("USER") for st in ("base", "deps-cuda", "deps", "light") for ln in stages[st])
    assert any("ktdeploy.cli.image_entry" in ln for ln in stages["base"] if ln.startswith("ENTRYPOINT"))


def test_dockerignore_keeps_the_wheelhouse_and_venv_out():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[[i for i, ln in enumerate(ignore) if not ln.startswith("#")][0]] == "*"
    allowed = [ln[1:] for ln in ignore if ln.startswith("!")]
    assert not any(a.startswith((".wheelhouse", ".venv")) for a in allowed)
