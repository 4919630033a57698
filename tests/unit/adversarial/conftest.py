"""Fixtures of the adversarial suite: a real second local user (``intruder``) and a folder every user may create
in (``shared_folder``), for the tests where another user is the attacker (a planted probe, a staging folder made
first, a predictable temp path). Root only; tests/unit/adversarial/second_user.py has the helpers (``needs_root``,
``as_intruder``)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def intruder() -> Iterator[tuple[int, int]]:
    """A real second user on this machine (removed afterwards): (uid, gid)."""
    import pwd

    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root: only root can make a second user (useradd) and act as them")
    name = f"ktdintr{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, timeout=30)
    try:
        pw = pwd.getpwnam(name)
        yield pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], timeout=30)


@pytest.fixture
def shared_folder(intruder) -> Iterator[Path]:
    """A folder every user may create in, as /tmp (mode 1777: nobody may replace another's entry)."""
    root = Path("/tmp") / f"ktd-shared-{secrets.token_hex(4)}"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)
