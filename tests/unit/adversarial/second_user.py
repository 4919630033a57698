"""Acting as the second local user of tests/unit/adversarial/conftest.py (``intruder``): a child process that
setuid/setgid()s to them (subprocess's user=/group=, no supplementary groups) before it runs."""

from __future__ import annotations

import subprocess


def as_intruder(user: tuple[int, int], script: str, *args: str, stdin: str | bytes | None = None
                ) -> subprocess.CompletedProcess:
    """``sh -c SCRIPT`` run as ``user``; fails the test when it fails."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    p = subprocess.run(["sh", "-c", script, "intruder", *args], input=data, capture_output=True, timeout=60,
                       user=user[0], group=user[1], extra_groups=[], cwd="/")
    assert p.returncode == 0, p.stderr
    return p
