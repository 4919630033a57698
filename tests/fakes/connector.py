"""An in-memory Connector for unit tests of the orchestration (the httpx MockTransport idea).

A script is a list of rules, tried in order: a rule matches a command when its ``match`` is a prefix of the
argv (a tuple of strings; ``"*"`` matches any one item) or a callable ``argv -> bool``. Its answer is a
``Result``, a callable ``argv -> Result``, or a list of answers given one per call (the last repeats). A command
no rule matches fails the test (``UnscriptedCommand``), so a test states every command it expects. Every call is
recorded in ``calls``; files put on the "host" live in ``files`` and ``get_file`` reads from there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ktdeploy.controller.connectors.base import Result

Answer = Result | Callable[[list[str]], Result] | list
Matcher = tuple | Callable[[list[str]], bool]


class UnscriptedCommand(AssertionError):
    pass


@dataclass
class Call:
    kind: str                      # run | run_shell | put_file | get_file
    argv: list[str]
    timeout: float | None = None
    env: dict[str, str] | None = None
    input: str | bytes | None = None   # what the command was given on stdin


@dataclass
class Rule:
    match: Matcher
    answer: Answer
    hits: int = 0

    def matches(self, argv: list[str]) -> bool:
        if callable(self.match):
            return bool(self.match(argv))
        pat = list(self.match)
        return len(argv) >= len(pat) and all(p == "*" or p == a for p, a in zip(pat, argv, strict=False))

    def respond(self, argv: list[str]) -> Result:
        a = self.answer
        if isinstance(a, list):
            a = a[min(self.hits, len(a) - 1)]
        self.hits += 1
        return a(argv) if callable(a) else a


def ok(stdout: str = "", stderr: str = "") -> Result:
    return Result(0, stdout, stderr)


def fail(rc: int = 1, stderr: str = "failed", stdout: str = "") -> Result:
    return Result(rc, stdout, stderr)


def container_state(status: str = "running", exit_code: int | None = 0, oom: bool = False, **more: Any) -> str:
    """`docker inspect --format '{{json .State}}'` as docker prints it."""
    return json.dumps({"Status": status, "Running": status == "running", "ExitCode": exit_code, "OOMKilled": oom,
                       "Error": "", "StartedAt": "2026-12-03T07:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z", **more})


@dataclass
class FakeConnector:
    rules: list[Rule] = field(default_factory=list)
    name: str = "fake-host"
    calls: list[Call] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)

    def on(self, match: Matcher, answer: Answer) -> FakeConnector:
        self.rules.append(Rule(match if callable(match) else tuple(match), answer))
        return self

    # -- the Connector protocol ----------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result:
        argv = [str(a) for a in argv]
        self.calls.append(Call("run", argv, timeout, env, input))
        for rule in self.rules:
            if rule.matches(argv):
                r = rule.respond(argv)
                if check and r.rc != 0:
                    from ktdeploy.core.errors import StepError

                    raise StepError(f"{argv[0]} failed (exit {r.rc})", rc=r.rc, output=r.stderr)
                return r
        if argv[:2] == ["realpath", "-m"]:   # up's output lock asks; unscripted, the host has no GNU realpath
            return fail(127, "realpath: not found")
        raise UnscriptedCommand(f"FakeConnector: no rule for {argv!r}")

    def run_shell(self, script: str, *, timeout: float | None = None, check: bool = False) -> Result:
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None:
        self.calls.append(Call("put_file", [local, remote]))
        self.files[remote] = Path(local).read_bytes()

    def get_file(self, remote: str, local: str) -> None:
        self.calls.append(Call("get_file", [remote, local]))
        if remote not in self.files:
            raise FileNotFoundError(remote)
        Path(local).write_bytes(self.files[remote])

    def close(self) -> None:
        self.calls.append(Call("close", []))

    # -- what the test asks afterwards -----------------------------------------------------------
    def ran(self, *prefix: str) -> list[list[str]]:
        """Every argv run that starts with ``prefix``."""
        return [c.argv for c in self.calls if c.kind == "run" and c.argv[:len(prefix)] == list(prefix)]
