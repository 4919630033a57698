"""Put light's files on top of the dependency image as one layer through `docker load`, not `docker commit`.

On an engine whose storage driver diffs the whole tree at a commit (fuse-overlayfs, vfs: moby's naive diff), one
commit of the multi-GB image costs tens of seconds whatever changed. `docker load` of an archive whose manifest
lists the dependency image's layers but carries only the new one costs the new layer's untar: the engine finds
each existing layer by its chain ID and never opens its file (the same trick Bazel's incremental loader uses).
The layer tar is written once, hashed as it is written (its diff ID), and the same file goes into every image
of the build, so the variants share every filesystem layer by construction.

An engine that cannot take such an archive (one whose image store wants every blob) makes ``load`` fail with
LayerLoadUnsupported; the build then commits instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ktdeploy.controller.images import docker_cli
from ktdeploy.core.errors import ImageError
from ktdeploy.core.safeio import parse_json, writing


class LayerLoadUnsupported(ImageError):
    """The engine refused an archive that leaves out the layers it already has."""


@dataclass
class LayerFile:
    path: Path
    diff_id: str                      # sha256 of the uncompressed tar: the layer's diff ID
    paths: list[str] = field(default_factory=list)   # absolute paths of its files and links


class _HashingWriter(io.RawIOBase):
    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h = f, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:   # bytes-like (io.RawIOBase.write)
        self.h.update(b)
        return self.f.write(b)


def restage(src: tarfile.TarFile, dst: tarfile.TarFile) -> list[str]:
    """Copy the members of `docker cp LIGHT:/stage -` to ``dst`` with the ``stage/`` prefix stripped, so they
    land where they belong. Returns the absolute paths of the files and links copied."""
    copied: list[str] = []
    for m in src:
        name = m.name.lstrip("./")
        if name in ("stage", ""):
            continue
        m.name = name.removeprefix("stage/")
        if m.islnk():
            m.linkname = m.linkname.lstrip("./").removeprefix("stage/")
        dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        if not m.isdir():
            copied.append("/" + m.name)
    return copied


@contextmanager
def stage_stream(light_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """The `docker cp CONTAINER:/stage -` process of a container of ``light_id`` (removed afterwards)."""
    ctr = docker_cli.run(["create", light_id]).stdout.strip()
    if not ctr:
        raise ImageError(f"docker create {light_id} failed", fix="Check `docker info` and free disk space.")
    try:
        with subprocess.Popen([docker_cli.docker_bin(), "cp", f"{ctr}:/stage", "-"], stdout=subprocess.PIPE) as out:
            yield out
            if out.wait() != 0:
                raise ImageError("reading the light stage (docker cp) failed", fix="Check `docker info`.")
    finally:
        docker_cli.run(["rm", "-f", ctr])


def write_layer(light_id: str, dest: Path) -> LayerFile:
    """Light's /stage as a layer tar at ``dest`` (paths relative to /), with its diff ID."""
    with stage_stream(light_id) as out, writing(dest.parent, dest.name, overwrite=True) as f:
        assert out.stdout is not None
        w = _HashingWriter(f)
        with tarfile.open(fileobj=out.stdout, mode="r|") as src, \
                tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as dst:
            copied = restage(src, dst)
    return LayerFile(dest, "sha256:" + w.h.hexdigest(), copied)


def write_archive(dest: Path, layer: LayerFile, images: list[tuple[dict[str, Any], list[str]]]) -> list[str]:
    """A `docker load` archive (docker save's layout) of ``images`` — (config, tags) pairs that all end in
    ``layer`` — carrying only that layer's file. Returns each image's ID (sha256 of its config)."""
    new_dir = layer.diff_id.split(":")[-1]
    manifest, ids = [], []
    with writing(dest.parent, dest.name, overwrite=True) as f, tarfile.open(fileobj=f, mode="w") as t:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))

        for config, tags in images:
            diff_ids = config["rootfs"]["diff_ids"]
            if diff_ids[-1] != layer.diff_id:
                raise ValueError("every image of the archive must end in the layer it carries")
            raw = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
            digest = hashlib.sha256(raw).hexdigest()
            add(f"{digest}.json", raw)
            ids.append("sha256:" + digest)
            # the layers the engine already has are named, never stored: it looks them up by chain ID
            manifest.append({"Config": f"{digest}.json", "RepoTags": list(tags),
                             "Layers": [f"{d.split(':')[-1]}/layer.tar" for d in diff_ids]})
        t.add(str(layer.path), arcname=f"{new_dir}/layer.tar")
        add("manifest.json", json.dumps(manifest).encode())
    return ids


_MISSING = re.compile(r"no such file|not found|does not exist|missing|content digest", re.I)


def load_archive(archive: Path) -> None:
    proc = docker_cli.run(["load", "--input", str(archive)])
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-400:]
        if _MISSING.search(err):
            raise LayerLoadUnsupported(f"this engine wants every layer in a loaded archive: {err}",
                                       fix="The build falls back to `docker commit` (slower on this engine).")
        raise ImageError(f"docker load of the built image failed: {err}", fix="Check free disk space and `docker info`.")


def history_rows(image: str) -> list[dict[str, Any]]:
    proc = docker_cli.run(["history", "--no-trunc", "--human=false", "--format", "{{json .}}", image])
    if proc.returncode != 0:
        return []
    rows = []
    for line in proc.stdout.splitlines():
        try:
            rows.append(parse_json(line))
        except ValueError:
            return []
    return rows
