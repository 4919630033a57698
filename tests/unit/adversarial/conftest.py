"""Fixtures of the adversarial suite: a real second local user (``intruder``) and a folder every user may create
in (``shared_folder``), for the tests where another user is the attacker (a planted probe, a staging folder made
first, a predictable temp path; root only, tests/unit/adversarial/second_user.py acts as them); a host that
accepts SSH connections and never answers (``silent_host``), which holds `up` in its connect phase."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import threading
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


@pytest.fixture
def silent_host():
    """ssh://root@127.0.0.1:PORT that accepts connections and never sends a banner."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"ssh://root@127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()
