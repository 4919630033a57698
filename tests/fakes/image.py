"""Build the TEST DOUBLE trainer image (tests/fakes/Dockerfile.fake-trainer) once per content hash."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
REPO = "ktdeploy/fake-trainer"
PKG = HERE.parent.parent / "ktdeploy"  # the real package: its converter runs in the image


def _ruamel_dir() -> Path:
    import ruamel.yaml

    return Path(ruamel.yaml.__file__).parent.parent


def _site_packages_of(module: str) -> Path:
    return Path(__import__(module).__file__).parent.parent


def build_fake_image() -> str:
    """Build (or reuse) the image; returns its reference 'ktdeploy/fake-trainer:<hash>'."""
    h = hashlib.sha256()
    for f in ("fake_llamafactory.py", "Dockerfile.fake-trainer", "kt_layout.py"):
        h.update((HERE / f).read_bytes())
    for f in sorted(PKG.rglob("*.py")):
        h.update(str(f.relative_to(PKG)).encode() + b"\0" + f.read_bytes())
    import numpy

    h.update(numpy.__version__.encode())
    ref = f"{REPO}:{h.hexdigest()[:12]}"
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0:
        return ref
    with tempfile.TemporaryDirectory() as ctx:
        shutil.copy(HERE / "fake_llamafactory.py", ctx)
        shutil.copy(HERE / "kt_layout.py", ctx)
        shutil.copytree(PKG, Path(ctx) / "ktdeploy", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(HERE / "Dockerfile.fake-trainer", Path(ctx) / "Dockerfile")
        shutil.copytree(_ruamel_dir(), Path(ctx) / "ruamel", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        # the real merge needs numpy: this interpreter's (CPython 3.11, manylinux) runs in the bookworm base image
        site = _site_packages_of("numpy")
        for name in ("numpy", "numpy.libs"):
            if (site / name).is_dir():
                shutil.copytree(site / name, Path(ctx) / "site" / name, ignore=shutil.ignore_patterns("__pycache__"))
        p = subprocess.run(["docker", "build", "-q", "-t", ref, ctx], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"building the fake trainer image failed:\n{p.stderr[-2000:]}")
    return ref


def image_archive(path: Path, tags: tuple[str, ...] = ("ktsft:amx",)) -> Path:
    """A minimal `docker save`-shaped tarball naming ``tags`` (manifest.json only): what `up --image-tar`
    reads before it ships an archive. Enough for a dry run, never loaded."""
    import io
    import json
    import tarfile

    data = json.dumps([{"Config": "config.json", "RepoTags": list(tags), "Layers": []}]).encode()
    with tarfile.open(path, "w") as t:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return path
