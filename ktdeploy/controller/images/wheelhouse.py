"""The host-side wheelhouse: checked against the lock, then served on loopback to `docker build`.

The engine here has no BuildKit (no bind mounts in RUN), so the Dockerfile's deps stage installs
from an HTTP find-links URL; `docker build --network host` lets it reach this server and nothing
else matters: pip runs with --no-index and --require-hashes.
"""

from __future__ import annotations

import functools
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ktdeploy.controller.images.lockfile import Lock
from ktdeploy.core.errors import ImageError
from ktdeploy.core.hashing import sha256_file

# Fixed, so the build argument (and with it the deps layer's cache key) never changes; one per stack,
# so a CI build of the reduced stack can run beside a full build.
DEFAULT_PORTS = {"full": 38711, "reduced": 38712}


def missing_wheels(lock: Lock, wheelhouse: Path, *, verify_hashes: bool = False) -> list[str]:
    """Lock entries whose wheel is absent from the wheelhouse (or, when verifying, differs)."""
    missing = []
    for pin in lock.pins:
        f = wheelhouse / pin.filename
        if not f.is_file():
            missing.append(pin.filename)
        elif verify_hashes and sha256_file(f) != pin.sha256:
            missing.append(f"{pin.filename} (hash differs from the lock)")
    return missing


def check_wheelhouse(lock: Lock, wheelhouse: Path, stack: str) -> None:
    missing = missing_wheels(lock, wheelhouse)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ImageError(
            f"wheelhouse {wheelhouse} lacks {len(missing)} wheel(s) of {lock.path.name}: {shown}",
            key="--wheelhouse",
            fix=f"Run `python docker/wheelhouse.py --stack {stack} --dest {wheelhouse}` where PyPI is "
                "reachable (air-gapped: there, then copy the folder here).")


# pip download's line for each requirement it has: fetched, or found already there (its hash checked)
PIP_GOT = re.compile(r"^\s*(?:Saved|File was already downloaded) (.+?)\s*$")


def pip_download(argv: list[str], total: int, tick: Callable[[int, int, str], None]) -> tuple[int, str]:
    """Run ``pip download`` (argv), telling ``tick(done, total, wheel)`` as each wheel is there; (its exit status,
    its output) — the output for the error when it fails."""
    done, out = 0, []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if (m := PIP_GOT.match(line)):
                done += 1
                tick(done, max(total, done), Path(m.group(1)).name)
        rc = proc.wait()
    return rc, "".join(out)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # pip's requests are not worth a line each
        pass


@contextmanager
def serve(wheelhouse: Path, port: int, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``wheelhouse`` read-only at http://host:port/ for the duration of the block."""
    handler = functools.partial(_QuietHandler, directory=str(wheelhouse))
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as err:
        raise ImageError(f"cannot serve the wheelhouse on {host}:{port}: {err.strerror}",
                         key="--wheelhouse-port",
                         fix="Stop whatever holds the port, or pass --wheelhouse-port N "
                             "(a different port invalidates the cached deps layer once).") from None
    thread = threading.Thread(target=server.serve_forever, name="wheelhouse", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/"
    finally:
        server.shutdown()
        server.server_close()
