"""ktdeploy.controller.fleet_wheelhouse: the host installs only pinned, hashed wheels; the tarball is reproducible."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from ktdeploy.controller.fleet_wheelhouse import pack, requirements
from ktdeploy.controller.images.lockfile import read_lock
from ktdeploy.core.errors import ImageError

LOCK = Path(__file__).resolve().parents[3] / "docker" / "requirements" / "reduced.lock"


def test_requirements_pin_and_hash_every_lock_entry_and_ktdeploy(tmp_path):
    wheel = tmp_path / "ktdeploy-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel bytes")
    lock = read_lock(LOCK)
    text = requirements(lock, wheel)
    pins = [ln for ln in text.splitlines() if "==" in ln and not ln.startswith("#")]
    assert len(pins) == len(lock.pins) + 1
    assert text.count("--hash=sha256:") == len(pins)
    assert f"ktdeploy==0.1.0 \\\n    --hash=sha256:{hashlib.sha256(b'wheel bytes').hexdigest()}" in text
    assert any(p.startswith("pydantic==") for p in pins)


def test_pack_is_byte_identical_and_records_its_digest(tmp_path):
    root = tmp_path / "wh"
    (root / "wheels").mkdir(parents=True)
    files = []
    for n in ("b.whl", "a.whl"):
        f = root / "wheels" / n
        f.write_bytes(n.encode())
        files.append(f)
    d1 = pack(files, root, tmp_path / "one.tar")
    (root / "wheels" / "a.whl").touch()           # a newer mtime must not leak into the tarball
    d2 = pack(files, root, tmp_path / "two.tar")
    assert d1 == d2 == hashlib.sha256((tmp_path / "one.tar").read_bytes()).hexdigest()
    assert (tmp_path / "one.tar.sha256").read_text().strip() == d1
    with tarfile.open(tmp_path / "one.tar") as t:
        assert t.getnames() == ["wheels/a.whl", "wheels/b.whl"]


def test_a_lock_wheel_with_another_hash_is_refused(tmp_path):
    from ktdeploy.controller.fleet_wheelhouse import build

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "ktdeploy-0.1.0-py3-none-any.whl").write_bytes(b"x")
    lock = read_lock(LOCK)
    for p in lock.pins:
        (wheels / p.filename).write_bytes(b"tampered")
    # offline: the index is unreachable or the download fixes nothing -> the mismatch is reported, never installed
    with pytest.raises(ImageError):
        build(LOCK, wheels, tmp_path / "wh.tar", ["--no-index"])
