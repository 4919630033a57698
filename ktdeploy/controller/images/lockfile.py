"""Read the hash-locked requirement files that docker/lock.py writes."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ktdeploy.core.errors import ImageError

_ENTRY = re.compile(r"^([a-z0-9-]+)==(\S+) \\\n\s+--hash=sha256:([0-9a-f]{64})\s+#\s+(\S+\.whl)$", re.M)


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str
    filename: str


@dataclass(frozen=True)
class Lock:
    path: Path
    sha256: str
    pins: tuple[Pin, ...]

    def version(self, name: str) -> str | None:
        return next((p.version for p in self.pins if p.name == name), None)

    def versions_label(self, names: Iterable[str]) -> str:
        """'torch=2.9.1,kt-kernel=0.7.2,…' for the names the lock holds (an OCI label value)."""
        return ",".join(f"{n}={self.version(n)}" for n in names if self.version(n))


def parse_lock(text: str) -> tuple[Pin, ...]:
    pins = tuple(Pin(*m.groups()) for m in _ENTRY.finditer(text))
    declared = len(re.findall(r"^[a-z0-9-]+==", text, flags=re.M))
    if declared != len(pins):
        raise ValueError(f"{declared - len(pins)} lock entries lack a sha256 hash or a wheel file name")
    return pins


def read_lock(path: Path) -> Lock:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"lock file {path} is missing", fix="Run `python docker/lock.py` in the repo.") from None
    try:
        pins = parse_lock(data.decode())
    except ValueError as err:
        raise ImageError(f"lock file {path} is malformed: {err}",
                         fix="Regenerate it with `python docker/lock.py`; never edit it by hand.") from None
    return Lock(path=path, sha256=hashlib.sha256(data).hexdigest(), pins=pins)
