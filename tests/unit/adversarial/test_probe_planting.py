"""Issue 35, class 1: doctor never runs a probe another user could plant.

The probe runner (facts_probes._RUN_SCRIPT) is the one every path uses (local, SSH and docker hosts, ansible
preflight, up's PREFLIGHT). These tests create a real second user (useradd) who plants a forged probe — a
program that leaves a marker file and prints `tile_exec: true` with a sentinel palette count — everywhere the
old runner looked or a shared folder could lead it, then run the probes as root through the local connector and
check the planted program never ran and its JSON was never taken. Root only (skipped otherwise): only root can
make a second user and give a file away. The second user is tests/unit/adversarial/conftest.py's ``intruder``."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.controller.facts_probes import gather_probes, source_hash

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("cc"),
                                reason="needs root (a second user, chown) and a C compiler")

SENTINEL = 4242  # the forged probe's palette count; the real probe prints the CPU's (null without AMX)


def _forged(marker: Path) -> str:
    return ("#!/bin/sh\n"
            f"echo pwned >> {marker}\n"
            "echo '{\"listed\": true, \"amx_int8\": true, \"amx_bf16\": true, \"xtiledata_os\": true, "
            f"\"permission\": true, \"tile_exec\": true, \"correct\": true, \"palettes\": {SENTINEL}}}'\n")


def _plant_input(user, folder: Path, marker: Path) -> None:
    """As ``user``: mkdir -p folder (mode 0777 where it creates), the forged probe and a matching sha256."""
    p = subprocess.run(["sh", "-c", f'umask 0; mkdir -p "{folder}" && cat > "{folder}/amx_probe" && '
                                    f'chmod 0777 "{folder}/amx_probe" && sha256sum < "{folder}/amx_probe" | '
                                    f'cut -d" " -f1 > "{folder}/amx_probe.sha256"'],
                       input=_forged(marker), text=True, timeout=30, user=user[0], group=user[1], extra_groups=[])
    assert p.returncode == 0


def _probe(env: dict[str, str]):
    old = {k: os.environ.get(k) for k in ("HOME", "XDG_CACHE_HOME", "KTDEPLOY_PROBE_DIR", "TMPDIR")}
    t0 = time.monotonic()
    try:
        for k in old:
            os.environ.pop(k, None)
        os.environ.update(env)
        probes, _raw = gather_probes(LocalConnector(), "x86_64")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert time.monotonic() - t0 < 60
    return probes


@pytest.fixture
def shared(tmp_path, intruder):
    """A folder every user can reach (tmp_path's parents are root's 0700 folders otherwise)."""
    root = Path("/tmp") / f"ktd-plant-{secrets.token_hex(4)}"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o1777)  # like /tmp: anyone may create, nobody may replace another's entry
    marker_dir = root / "markers"
    marker_dir.mkdir()
    os.chmod(marker_dir, 0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _never_ran(probes, marker: Path) -> None:
    assert not marker.exists(), "the planted probe was executed"
    assert probes.amx.palettes != SENTINEL, "the planted probe's JSON was accepted"
    assert probes.amx.ran or probes.amx.skipped  # the real probe ran instead, or it was said why not


def test_the_old_predictable_tmp_path_is_never_used(shared, intruder):
    """The issue's case: HOME unwritable, another user created /tmp/ktdeploy-probes-0/<hash>/amx_probe first."""
    marker = shared / "markers" / "old-path"
    planted = Path(f"/tmp/ktdeploy-probes-{os.getuid()}") / source_hash("amx_probe")
    if Path(f"/tmp/ktdeploy-probes-{os.getuid()}").exists():
        pytest.skip("/tmp/ktdeploy-probes-0 exists on this machine already (not ours to remove)")
    try:
        _plant_input(intruder, planted, marker)
        probes = _probe({"HOME": "/proc/ktdeploy-unwritable-home"})
        _never_ran(probes, marker)
        assert probes.amx.ran, probes.amx.skipped  # built in a private mktemp -d folder and run from there
    finally:
        shutil.rmtree(f"/tmp/ktdeploy-probes-{os.getuid()}", ignore_errors=True)


def test_a_cache_folder_another_user_owns_is_never_trusted(shared, intruder):
    """XDG_CACHE_HOME (or HOME) leads into a folder the other user made: their sealed probe is refused."""
    marker = shared / "markers" / "their-cache"
    cache = shared / "their-cache"
    _plant_input(intruder, cache / "ktdeploy" / "probes" / source_hash("amx_probe"), marker)
    probes = _probe({"HOME": "/proc/nohome", "XDG_CACHE_HOME": str(cache)})
    _never_ran(probes, marker)


def test_a_writable_folder_above_the_cache_is_never_trusted(shared, intruder, tmp_path):
    """Root's own cache, but under a folder anyone may write without the sticky bit: the other user can swap it."""
    marker = shared / "markers" / "open-parent"
    open_dir = shared / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    cache = open_dir / "cache"
    _probe({"HOME": "/proc/nohome", "XDG_CACHE_HOME": str(cache)})
    assert not cache.exists()  # nothing is even made under a folder others can write
    _plant_input(intruder, cache / "ktdeploy" / "probes" / source_hash("amx_probe"), marker)
    probes = _probe({"HOME": "/proc/nohome", "XDG_CACHE_HOME": str(cache)})
    _never_ran(probes, marker)


@pytest.mark.parametrize("how", ["owned-by-intruder", "group-writable", "world-writable", "link-to-theirs",
                                 "sha-mismatch"])
def test_a_tampered_binary_in_my_own_cache_is_never_run(shared, intruder, tmp_path, how):
    """My own cache, already holding a sealed probe, changed behind my back: rebuilt, never run."""
    marker = shared / "markers" / how
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {"HOME": str(home)}
    first = _probe(env)  # builds and seals the real probe in ~/.cache
    assert first.amx.ran, first.amx.skipped
    folder = home / ".cache" / "ktdeploy" / "probes" / source_hash("amx_probe")
    binary = folder / "amx_probe"
    forged = _forged(marker).encode()
    import hashlib

    if how == "link-to-theirs":
        theirs = shared / "theirs"
        _plant_input(intruder, theirs, marker)
        binary.unlink()
        binary.symlink_to(theirs / "amx_probe")
        (folder / "amx_probe.sha256").write_text(hashlib.sha256(forged).hexdigest() + "\n")
    else:
        binary.write_bytes(forged)
        (folder / "amx_probe.sha256").write_text(
            ("0" * 64 if how == "sha-mismatch" else hashlib.sha256(forged).hexdigest()) + "\n")
        binary.chmod({"group-writable": 0o775, "world-writable": 0o777}.get(how, 0o755))
        if how == "owned-by-intruder":
            os.chown(binary, *intruder)
    probes = _probe(env)
    _never_ran(probes, marker)
    assert probes.amx.ran, probes.amx.skipped  # rebuilt and run


def test_a_probe_dir_the_other_user_can_write_is_never_trusted(shared, intruder):
    """KTDEPLOY_PROBE_DIR (the image's prebuilt probes) pointing at a folder the other user owns."""
    marker = shared / "markers" / "probe-dir"
    folder = shared / "prebuilt"
    _plant_input(intruder, folder, marker)
    probes = _probe({"HOME": "/proc/nohome", "KTDEPLOY_PROBE_DIR": str(folder)})
    _never_ran(probes, marker)


def test_no_private_build_folder_is_left_behind(tmp_path):
    """With no usable cache, the probe is built in a fresh mktemp -d folder and that folder goes afterwards."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(mode=0o700)
    probes = _probe({"HOME": "/proc/nohome", "TMPDIR": str(tmpdir)})
    assert probes.amx.ran, probes.amx.skipped
    assert list(tmpdir.iterdir()) == []
