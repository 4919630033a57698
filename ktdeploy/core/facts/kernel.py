"""Kernel facts: `uname -r`, `uname -m`, /etc/os-release."""

from __future__ import annotations

import re

from ktdeploy.core.facts.host import KernelFacts


def parse_kernel_release(release: str) -> tuple[int, int, int] | None:
    """'6.1.0-18-amd64' -> (6, 1, 0); '5.15.0-1051-azure' -> (5, 15, 0)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def build_kernel(text: str | None) -> KernelFacts:
    lines = (text or "").split()
    if not lines:
        return KernelFacts()
    release = lines[0]
    return KernelFacts(release=release, version=parse_kernel_release(release),
                       machine=lines[1] if len(lines) > 1 else None)


def parse_os_release(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            if k in ("ID", "VERSION_ID", "PRETTY_NAME", "ID_LIKE", "VERSION_CODENAME"):
                out[k] = v.strip().strip('"')
    return out
