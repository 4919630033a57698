"""The docker CLI, always through argv lists (never a shell), with errors as ImageError."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from ktdeploy.core.errors import ImageError
from ktdeploy.core.safeio import parse_json

# The engine this targets (20.10) has no buildx; the classic builder is what the Dockerfile is
# written for, so ask for it explicitly rather than depend on the client's default.
CLASSIC_BUILD_ENV = {"DOCKER_BUILDKIT": "0"}


def docker_bin() -> str:
    path = shutil.which("docker")
    if not path:
        raise ImageError("the docker CLI is not installed", fix="Install Docker Engine (apt-get install docker.io).")
    return path


def run(argv: list[str], *, env: dict[str, Any] | None = None, capture: bool = True, timeout: float | None = None,
        on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `docker …`. With on_line, stream merged output line by line (and keep it for errors)."""
    full = [docker_bin(), *argv]
    environ = {**os.environ, **(env or {})}
    if on_line is None:
        return subprocess.run(full, env=environ, capture_output=capture, text=True, timeout=timeout)
    lines: list[str] = []
    with subprocess.Popen(full, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            on_line(line)
        rc = proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(full, rc, "\n".join(lines), "")


def inspect_image(ref: str) -> dict[str, Any] | None:
    proc = run(["image", "inspect", ref])
    if proc.returncode != 0:
        return None
    try:
        info = parse_json(proc.stdout)
    except ValueError:
        return None
    return info[0] if isinstance(info, list) and info and isinstance(info[0], dict) else None


def layers(ref: str) -> list[str]:
    info = inspect_image(ref)
    if info is None:
        raise ImageError(f"image {ref} does not exist", fix=f"Build it: ktdeploy image build --isa {ref.split(':')[-1]}")
    return list(info["RootFS"].get("Layers", []))


def require_engine() -> None:
    proc = run(["version", "--format", "{{.Server.Version}}"], timeout=30)
    if proc.returncode != 0:
        raise ImageError("the docker engine is not reachable: " + (proc.stderr or proc.stdout).strip()[-300:],
                         fix="Start it (systemctl start docker / dockerd) and check `docker version`.")
