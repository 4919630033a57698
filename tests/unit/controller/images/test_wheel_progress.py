"""The wheel download tells each wheel as pip has it (controller/images/wheelhouse.pip_download): a real, offline
`pip download --require-hashes` of two tiny wheels from a local folder, fetched, then found already there."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

from ktdeploy.controller.images.wheelhouse import pip_download


def _wheel(folder: Path, name: str, version: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_each_wheel_is_told_as_pip_has_it(tmp_path):
    index, dest = tmp_path / "index", tmp_path / "dest"
    index.mkdir()
    lock = tmp_path / "lock.txt"
    lines = []
    for name in ("ktdnc2alpha", "ktdnc2beta"):
        w = _wheel(index, name, "1.0")
        lines.append(f"{name}==1.0 --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}\n")
    lock.write_text("".join(lines))
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
            "--no-deps", "--require-hashes", "--no-index", "--find-links", str(index), "--dest", str(dest), "-r",
            str(lock)]
    for _ in range(2):   # fetched, then already there: told either way
        ticks: list[tuple[int, int, str]] = []
        rc, out = pip_download(argv, 2, lambda d, t, w, got=ticks: got.append((d, t, w)))
        assert rc == 0, out
        assert ticks == [(1, 2, "ktdnc2alpha-1.0-py3-none-any.whl"), (2, 2, "ktdnc2beta-1.0-py3-none-any.whl")], out
