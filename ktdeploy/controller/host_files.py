"""Copying one file of the host into a run record, bounded and never through a link (FETCH steps, the EVAL stage)."""

from __future__ import annotations

from pathlib import Path

from ktdeploy.controller.connectors.base import Connector

MAX_FETCH = 64 << 20  # artifacts are a loss plot and small JSON files
# exit 0: a regular file of at most $2 bytes; 2: absent (or not a plain file); 3: a link; 4: too large
FETCHABLE_SH = ('[ -h "$1" ] && exit 3; [ -f "$1" ] || exit 2; '
                '[ "$(wc -c < "$1")" -le "$2" ] || exit 4; exit 0')
MISSING = "does not exist"


def fetch_checked(conn: Connector, remote: str, dst: Path, limit: int = MAX_FETCH) -> str | None:
    """Copy ``remote`` to ``dst`` when it is a regular file, not a link, of at most ``limit`` bytes; else why not
    (``MISSING``, a link, too large) and nothing is copied. The trainer and the user write the host's folders and
    could link ~/.ssh/id_* there: a link is never read."""
    probe = conn.run(["sh", "-c", FETCHABLE_SH, "ktdeploy-fetch", remote, str(limit)], timeout=60)
    if probe.rc != 0:
        return {3: "is a symbolic link", 4: f"is larger than {limit >> 20} MiB"}.get(probe.rc, MISSING)
    conn.get_file(remote, str(dst))
    return None
