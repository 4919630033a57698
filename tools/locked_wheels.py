"""The locked wheels the oracles read (tools/serve_oracle.py, tools/stack_oracle.py): a wheel pinned by
docker/requirements/full.lock, taken where one already lies with the lock's sha256, else `pip download`-ed into the
oracle's git-ignored cache and checked the same way. Nothing from a wheel is committed."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "docker" / "requirements" / "full.lock"
VERSION = "0.7.2"   # the KT stack's one matched release (sglang-kt, kt-kernel)


def locked_hash(dist: str, version: str = VERSION) -> str:
    """The sha256 the lock pins for ``dist``==``version``."""
    pin = rf"^{re.escape(dist)}=={re.escape(version)} \\\n\s+--hash=sha256:([0-9a-f]{{64}})"
    m = re.search(pin, LOCK.read_text(), re.M)
    if not m:
        raise SystemExit(f"{dist}=={version} with a sha256 not found in {LOCK}")
    return m.group(1)


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def locked_wheel(dist: str, name: str, cache: Path, found: Iterable[Path] = (), version: str = VERSION) -> Path:
    """``dist``'s wheel file ``name`` as the lock pins it: the first of ``found`` (wheel files), then cache/name,
    holding the lock's sha256; else downloaded into ``cache`` (a hash that still differs stops the oracle)."""
    want = locked_hash(dist, version)
    for w in (*found, cache / name):
        if w.is_file() and sha256(w) == want:
            return w
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "311", "--implementation", "cp", "--platform", "manylinux_2_35_x86_64",
                    "-d", str(cache), f"{dist}=={version}"], check=True)
    w = cache / name
    if not w.is_file() or sha256(w) != want:
        raise SystemExit(f"{w}: sha256 does not match the lock ({want})")
    return w
