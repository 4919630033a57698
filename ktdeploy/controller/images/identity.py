"""Image identity next to a saved tarball: ``ARCHIVE.images.json`` = {"images": {ref: image ID}, "sha256",
"size"}. Written once on the controller by `ktdeploy image save`; the fleet's ktsft_image role rolls hosts
out by these IDs (a host whose tag points at another ID is updated; a load that does not give the recorded ID
fails with "digest mismatch"), and skips re-copying a tarball already on a host with the same sha256."""

from __future__ import annotations

import json
from pathlib import Path

from ktdeploy.core.hashing import sha256_file


def sidecar(archive: Path) -> Path:
    return archive.with_name(archive.name + ".images.json")


def write_sidecar(archive: Path, images: dict[str, str]) -> dict:
    data = {"images": dict(sorted(images.items())), "sha256": sha256_file(archive), "size": archive.stat().st_size}
    sidecar(archive).write_text(json.dumps(data, indent=2) + "\n")
    return data


def read_sidecar(archive: Path) -> dict | None:
    p = sidecar(archive)
    return json.loads(p.read_text()) if p.is_file() else None
