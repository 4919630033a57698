"""The Connector protocol: the only seam through which ktdeploy touches a host.

Commands are argv lists. Connectors that must go through a remote shell (SSH) join them with
``shlex.quote``, so recipe values (paths, names) never reach a shell unquoted. ``run_shell`` is for
fixed scripts shipped in this package only.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ktdeploy.core.errors import StepError


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@runtime_checkable
class Connector(Protocol):
    """What the controller uses of a host. ``timeout`` has no default here: every remote command names its bound
    (a call without one is a mypy error; the connectors' own defaults serve their direct users, tests)."""

    name: str

    def run(self, argv: list[str], *, timeout: float | None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result: ...

    def run_shell(self, script: str, *, timeout: float | None, check: bool = False) -> Result: ...

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None: ...

    def get_file(self, remote: str, local: str) -> None: ...

    def close(self) -> None: ...


def quote_argv(argv: list[str]) -> str:
    """One shell word per argv item."""
    if not argv:
        raise ValueError("empty argv")
    return " ".join(shlex.quote(str(a)) for a in argv)


def env_prefix(env: dict[str, str] | None) -> list[str]:
    """argv prefix setting environment variables through env(1), validated names, quoted values."""
    if not env:
        return []
    for k in env:
        if not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k):
            raise ValueError(f"invalid environment variable name {k!r}")
    return ["env", *[f"{k}={v}" for k, v in env.items()]]


def checked(result: Result, argv: list[str] | str, where: str, check: bool) -> Result:
    if check and result.rc != 0:
        cmd = argv if isinstance(argv, str) else quote_argv(argv)
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise StepError(f"command failed on {where} (exit {result.rc}): {cmd[:200]}",
                        rc=result.rc, output="\n".join(tail),
                        fix="See the command output above; re-run with the problem fixed.")
    return result


def to_text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data
