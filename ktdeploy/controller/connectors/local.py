"""LocalConnector: run on this machine with subprocess (no shell unless run_shell)."""

from __future__ import annotations

import os
import shutil
import subprocess

from ktdeploy.controller.connectors.base import Result, checked, to_text
from ktdeploy.core.safeio import writing


def _copy(src: str, dest: str, mode: int | None) -> None:
    """A copy through the safe writer: never through a link at ``dest``, atomic (the folder is made when missing)."""
    dest = os.path.abspath(dest)
    with open(src, "rb") as f, writing(os.path.dirname(dest), os.path.basename(dest), overwrite=True,
                                       mode=0o644 if mode is None else mode) as out:
        shutil.copyfileobj(f, out)


class LocalConnector:
    def __init__(self, name: str = "localhost"):
        self.name = name

    def run(self, argv: list[str], *, timeout: float | None = None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result:
        full_env = {**os.environ, **env} if env else None
        data = input.encode() if isinstance(input, str) else input
        try:
            p = subprocess.run([str(a) for a in argv], input=data, capture_output=True, timeout=timeout,
                               env=full_env)
            res = Result(p.returncode, to_text(p.stdout), to_text(p.stderr))
        except FileNotFoundError as e:
            res = Result(127, "", f"{argv[0]}: command not found ({e.strerror})")
        except subprocess.TimeoutExpired as e:
            res = Result(124, to_text(e.stdout), to_text(e.stderr) + f"\ntimed out after {timeout}s")
        return checked(res, argv, self.name, check)

    def run_shell(self, script: str, *, timeout: float | None = None, check: bool = False) -> Result:
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None:
        _copy(local, remote, mode)

    def get_file(self, remote: str, local: str) -> None:
        _copy(remote, local, None)

    def rsync(self, local_dir: str, remote_dir: str, flags: list[str]) -> None:
        """rsync a folder's content into another folder of this machine (controller/sync.py chooses the flags); it
        dies with this process (connectors/rsync.py)."""
        from ktdeploy.core.errors import StepError, UsageError

        if shutil.which("rsync") is None:
            raise UsageError("rsync is not installed on this machine", key="rsync", fix="apt-get install rsync")
        from ktdeploy.controller.connectors.rsync import run_rsync

        p = run_rsync(["rsync", *flags, "--", local_dir.rstrip("/") + "/", remote_dir.rstrip("/") + "/"])
        if p.returncode != 0:
            raise StepError(f"rsync into {remote_dir} failed (exit {p.returncode}): {p.stderr.strip()[-600:]}",
                            step="sync", rc=p.returncode, fix="Run the same command again: the copy resumes.")

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalConnector({self.name!r})"
