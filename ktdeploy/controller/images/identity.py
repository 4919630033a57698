"""Image identity next to a saved tarball: ``ARCHIVE.images.json`` = {"images": {ref: image ID}, "sha256",
"size"}. Written once on the controller by `ktdeploy image save`; the fleet's ktsft_image role rolls hosts
out by these IDs (a host whose tag points at another ID is updated; a load that does not give the recorded ID
fails with "digest mismatch"), and skips re-copying a tarball already on a host with the same sha256."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ktdeploy.core.errors import UsageError
from ktdeploy.core.hashing import sha256_file
from ktdeploy.core.safeio import parse_json, read_text, write_path


def sidecar(archive: Path) -> Path:
    return archive.with_name(archive.name + ".images.json")


def write_sidecar(archive: Path, images: dict[str, str]) -> dict[str, Any]:
    data = {"images": dict(sorted(images.items())), "sha256": sha256_file(archive), "size": archive.stat().st_size}
    write_path(sidecar(archive), json.dumps(data, indent=2) + "\n")  # new, never through a link
    return data


def read_sidecar(archive: Path) -> dict[str, Any] | None:
    p = sidecar(archive)
    if not p.is_file():
        return None
    try:
        data = parse_json(read_text(p, 1 << 20, "image identity file"))
    except (UsageError, ValueError):
        return None
    return data if isinstance(data, dict) else None
