"""DockerExecConnector: run inside a running container with `docker exec` (argv, no shell)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from ktdeploy.controller.connectors.base import Connector, Result, checked, to_text
from ktdeploy.core.errors import ConnectError
from ktdeploy.core.safeio import writing


def _remote_stage(via: Connector) -> str:
    """A fresh private folder on the host behind ``via`` (mktemp -d, mode 0700): never a predictable /tmp name
    another user could plant a link at first."""
    r = via.run(["mktemp", "-d"], timeout=30)
    path = r.stdout.strip()
    if r.rc != 0 or not path.startswith("/") or "\n" in path:
        raise ConnectError(f"no private staging folder on {via.name} (mktemp -d: {(r.stderr or r.stdout).strip()[:200]})",
                           fix="Check that /tmp (or $TMPDIR) on the host is writable.")
    return path


class DockerExecConnector:
    def __init__(self, container: str, *, docker: str = "docker", user: str | None = None,
                 via: Connector | None = None) -> None:
        """``via``: another connector (e.g. SSH) on whose host the container runs; default: this machine."""
        if not container or container.startswith("-"):
            raise ConnectError(f"invalid container name {container!r}", fix="Use docker://NAME with a container name or id.")
        self.container = container
        self.docker = docker
        self.user = user
        self.via = via
        self.name = f"docker://{container}" + (f"@{via.name}" if via is not None else "")
        self._verify()

    def _verify(self) -> None:
        p = self._docker([self.docker, "inspect", "--format", "{{.State.Running}}", "--", self.container], timeout=30)
        if p.returncode == 127:
            raise ConnectError("the docker CLI is not installed", fix="Install docker (docker.io / docker-ce-cli).")
        if p.returncode == 124:
            raise ConnectError("docker did not answer within 30s", fix="Check the docker daemon: `docker info`.")
        if p.returncode != 0:
            reason = (p.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise ConnectError(f"container {self.container!r} not found: {reason}",
                               fix="Start it, or list running containers with `docker ps`.")
        if p.stdout.strip() != "true":
            raise ConnectError(f"container {self.container!r} is not running",
                               fix=f"Start it: docker start {self.container}")

    def _docker(self, argv: list[str], *, input: str | bytes | None = None, timeout: float | None = None,
                text: bool = True) -> subprocess.CompletedProcess[Any]:
        """Run a docker CLI command here or through ``via``; returns a CompletedProcess-like object."""
        if self.via is not None:
            r = self.via.run(argv, input=input, timeout=timeout)
            return subprocess.CompletedProcess(argv, r.rc, r.stdout, r.stderr)
        try:
            p = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, text=text)
        except FileNotFoundError:
            return subprocess.CompletedProcess(argv, 127, "" if text else b"", "docker: command not found")
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(argv, 124, e.stdout or ("" if text else b""),
                                               (e.stderr or ("" if text else b"")))
        return p

    def _exec(self, argv: list[str], *, interactive: bool, env: dict[str, str] | None = None) -> list[str]:
        cmd = [self.docker, "exec"]
        if interactive:
            cmd.append("-i")
        if self.user:
            cmd += ["-u", self.user]
        for k, v in (env or {}).items():
            cmd += ["-e", f"{k}={v}"]
        return [*cmd, self.container, *[str(a) for a in argv]]

    def run(self, argv: list[str], *, timeout: float | None = None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result:
        data = input.encode() if isinstance(input, str) and self.via is None else input
        p = self._docker(self._exec(argv, interactive=data is not None, env=env), input=data, timeout=timeout,
                         text=False)
        res = Result(p.returncode, to_text(p.stdout), to_text(p.stderr))
        if p.returncode == 124:
            res = Result(124, res.stdout, res.stderr + f"\ntimed out after {timeout}s")
        # docker exec itself reports 126/127 for a missing executable, as a shell would.
        return checked(res, argv, self.name, check)

    def run_shell(self, script: str, *, timeout: float | None = None, check: bool = False) -> Result:
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None:
        parent = remote.rsplit("/", 1)[0] or "/"
        self.run(["mkdir", "-p", "--", parent], check=True, timeout=120)
        src, stage, via = local, None, self.via
        if via is not None:  # stage on the remote host first (a private mktemp -d folder), then docker cp there
            stage = _remote_stage(via)
            src = f"{stage}/file"
            via.put_file(local, src)
        p = self._docker([self.docker, "cp", "--", src, f"{self.container}:{remote}"])
        if via is not None and stage is not None:
            via.run(["rm", "-rf", "--", stage], timeout=300)
        if p.returncode != 0:
            raise ConnectError(f"docker cp to {self.container}:{remote} failed: {p.stderr.strip()}")
        if mode is not None:
            self.run(["chmod", format(mode, "o"), "--", remote], check=True, timeout=60)

    def get_file(self, remote: str, local: str) -> None:
        if self.via is not None:
            stage = _remote_stage(self.via)
            try:
                p = self._docker([self.docker, "cp", "--", f"{self.container}:{remote}", f"{stage}/file"])
                if p.returncode == 0:
                    self.via.get_file(f"{stage}/file", local)
            finally:
                self.via.run(["rm", "-rf", "--", stage], timeout=300)
        else:
            import shutil
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:  # docker cp writes a private folder; the safe writer the rest
                p = self._docker([self.docker, "cp", "--", f"{self.container}:{remote}", f"{tmp}/file"])
                if p.returncode == 0:
                    with open(f"{tmp}/file", "rb") as f, writing(os.path.dirname(os.path.abspath(local)),
                                                                  os.path.basename(local), overwrite=True) as out:
                        shutil.copyfileobj(f, out)
        if p.returncode != 0:
            raise ConnectError(f"docker cp from {self.container}:{remote} failed: {p.stderr.strip()}")

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"DockerExecConnector({self.container!r})"
