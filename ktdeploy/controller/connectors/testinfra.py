"""TestinfraConnector: the Connector protocol over a pytest-testinfra ``host``, so the testinfra suite
(tests/infra) runs ktdeploy's own fact gathering and checks through whatever backend testinfra was given
(ssh://, paramiko://, docker://, local://, ansible://)."""

from __future__ import annotations

import base64
from typing import Any

from ktdeploy.controller.connectors.base import Result, checked, env_prefix, quote_argv
from ktdeploy.core.safeio import write_path

_CHUNK = 48 * 1024  # bytes per upload command (well under the kernel's 128 KiB limit for one argument)


class TestinfraConnector:
    __test__ = False  # not a pytest test class

    def __init__(self, host: Any, name: str | None = None, default_timeout: float | None = None) -> None:
        self.host = host
        self.name = name or getattr(host.backend, "hostname", None) or str(host.backend.get_pytest_id())
        self.default_timeout = default_timeout

    def run(self, argv: list[str], *, timeout: float | None = None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result:
        argv = [*env_prefix(env), *[str(a) for a in argv]]
        if input is not None:  # testinfra has no stdin: feed it from an argument
            data = input.decode() if isinstance(input, bytes) else input
            argv = ["sh", "-c", 'printf %s "$0" | "$@"', data, *argv]
        limit = timeout if timeout is not None else self.default_timeout
        shown = argv
        if limit is not None:  # testinfra's backends have no timeout: the host's coreutils enforce it (rc 124)
            argv = ["timeout", "-k", "5", f"{max(float(limit), 1.0):g}", *argv]
        r = self.host.run(quote_argv(argv))
        if limit is not None and r.rc in (124, 137):
            return checked(Result(124, r.stdout, (r.stderr or "") + f"\ntimed out after {limit:g} s"), shown,
                           self.name, check)
        return checked(Result(r.rc, r.stdout, r.stderr), shown, self.name, check)

    def run_shell(self, script: str, *, timeout: float | None = None, check: bool = False) -> Result:
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None:
        with open(local, "rb") as f:
            data = f.read()
        parent = remote.rsplit("/", 1)[0] or "/"
        self.run(["mkdir", "-p", "--", parent], check=True)
        self.run(["sh", "-c", ': > "$0"', remote], check=True)
        for i in range(0, len(data), _CHUNK):
            chunk = base64.b64encode(data[i:i + _CHUNK]).decode()
            self.run(["sh", "-c", 'printf %s "$1" | base64 -d >> "$0"', remote, chunk], check=True)
        if mode is not None:
            self.run(["chmod", format(mode, "o"), "--", remote], check=True)

    def get_file(self, remote: str, local: str) -> None:
        r = self.run(["base64", "--", remote], check=True)
        write_path(local, base64.b64decode(r.stdout), overwrite=True)  # never through a link at ``local``

    def close(self) -> None:
        pass
