"""`up --sync-model DIR` / `--sync-data DIR`: a local folder onto the host, before doctor looks at it (SkyPilot's
file mounts, for one folder).

- the copy is rsync's, over the connection's own settings (connectors: ``SSHConnector.rsync`` hands the key,
  port, known_hosts and host-key policy to ssh through rsync's argv, no shell; ``LocalConnector.rsync`` copies on
  this machine; both through connectors/rsync.py);
- resumable: ``--partial-dir`` keeps a cut-off file's bytes on the host (in ``.ktdeploy-partial/`` of the target),
  and the next run goes on from them; files already there are never replaced (``--ignore-existing``). rsync's
  temp file of the file in flight lives there too (``--temp-dir``, its ``tmp/``), so a copy stopped at any moment
  leaves nothing among the folder's files; the temp files an older ktdeploy's rsync left beside them
  (``.NAME.XXXXXX`` of a file being uploaded) are recognised as an interrupted upload and removed. rsync dies with
  `up` (SIGTERM, Ctrl-C, SIGKILL: connectors/rsync.py);
- never through a link: a target folder (or its ``.ktdeploy-partial``) that is a symbolic link on the host is
  refused — rsync would write wherever it points;
- checked: afterwards every file's size and SHA-256 on the host are compared with the local file's;
- a model folder that exists with other content (a file the local folder does not have, or one of another size)
  is refused before anything is copied, naming the files: ktdeploy never writes into someone's model.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.core.errors import StepError, UsageError
from ktdeploy.core.events import Mark, Said, Sink, Synced, files_text, ignore, size_text
from ktdeploy.core.markers import marker, sh_block
from ktdeploy.core.plan.steps import StageName
from ktdeploy.core.safeio import printable

PARTIAL = ".ktdeploy-partial"
TEMP = f"{PARTIAL}/tmp"   # inside the partial folder: rsync removes an empty partial folder, never this one
MAX_FILES = 100_000
HASH_BATCH = 200
RSYNC_FLAGS = ["-rLt", "-s", f"--partial-dir={PARTIAL}", f"--temp-dir={TEMP}", "--ignore-existing",
               "--timeout=600"]
# what the host holds under DIR: `SIZE<TAB>RELATIVE PATH` per regular file (links followed, as the copy does);
# a newline inside a name becomes '?', so a name can never forge a line. DIR or its partial folder being a link
# is said first (the copy would go wherever it points).
MISSING, LINK = marker("missing"), marker("link")
LIST_SH = ('if [ -L "$1" ] || [ -L "$1/' + PARTIAL + '" ] || [ -L "$1/' + TEMP + '" ]; then ' + sh_block("link")
           + '; exit 0; fi; '
           '[ -d "$1" ] || { ' + sh_block("missing") + '; exit 0; }; '
           'find -L "$1" -path "$1/' + PARTIAL + '" -prune -o -type f -printf \'%s\\t%P\\0\' 2>/dev/null '
           f"| tr '\\n\\0' '?\\n' | head -n {MAX_FILES}")
# rsync's temp file of NAME when it writes beside it (an older ktdeploy's flags): `.NAME.` + 6 random characters
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9]{6}")
HASH_SH = 'cd -- "$1" && shift && sha256sum -- "$@"'


@dataclass
class SyncResult:
    role: str
    local: str
    remote: str
    files: int = 0
    bytes: int = 0
    copied: int = 0            # files that were not on the host before
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def link_roots(root: Path) -> list[Path]:
    """Where a link inside ``root`` may point: ``root`` itself, and for a Hugging Face cache snapshot
    (``<repo>/snapshots/<rev>``) the repository's ``blobs`` folder, where its links go."""
    real = root.resolve()
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return roots


def _check_link(p: Path, rel: str, root: Path, roots: list[Path]) -> None:
    """A link is copied as the file it points to (rsync -L): one pointing out of the folder (``~/.ssh/id_rsa``,
    ``/etc``) would upload that file to the host. Refused, naming it."""
    target = p.resolve()
    if not any(target == r or r in target.parents for r in roots):
        raise UsageError(f"{printable(rel)} in {printable(str(root))} is a link to {printable(str(target))}, outside "
                         "the folder: ktdeploy uploads what a folder holds, never what its links reach elsewhere",
                         key="--sync-model/--sync-data",
                         fix="Replace the link by the file itself, or remove it (a Hugging Face cache snapshot's "
                             "links into its blobs/ folder are fine).")


def local_files(root: Path) -> dict[str, int]:
    """relative path -> size of every regular file under ``root`` (links followed, as the copy follows them, but
    only to files inside ``root``: ``link_roots``)."""
    if not root.is_dir():
        raise UsageError(f"{printable(str(root))} is not a folder", fix="Give the local folder to upload.")
    out: dict[str, int] = {}
    roots = link_roots(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != PARTIAL)
        for d in dirnames:
            if Path(dirpath, d).is_symlink():
                _check_link(Path(dirpath, d), str(Path(dirpath, d).relative_to(root)), root, roots)
        for name in sorted(filenames):
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if any(ord(c) < 32 or ord(c) == 127 for c in rel):
                raise UsageError(f"{printable(rel)} in {printable(str(root))} has a control character in its name",
                                 fix="Rename it; ktdeploy uploads files whose names are plain text.")
            if p.is_symlink():
                _check_link(p, rel, root, roots)
            if p.is_file():
                out[rel] = p.stat().st_size
            if len(out) > MAX_FILES:
                raise UsageError(f"{printable(str(root))} holds more than {MAX_FILES} files",
                                 fix="Upload a model or data folder, not a tree of that size.")
    return out


def remote_files(conn: Connector, remote: str, role: str = "model") -> dict[str, int] | None:
    """The host's files under ``remote`` (None when the folder does not exist)."""
    r = conn.run(["sh", "-c", LIST_SH, "ktdeploy-sync", remote], timeout=300)
    if r.stdout.strip() == MISSING:
        return None
    if r.stdout.strip() == LINK:
        raise UsageError(f"the host's {printable(remote)} (or its {PARTIAL} folder) is a symbolic link: the upload "
                         "would write wherever it points; nothing was copied", key=f"--sync-{role}",
                         fix="Point the recipe's path at the real folder (or remove the link on the host).")
    if r.rc != 0:
        raise StepError(f"could not list {remote} on {conn.name}: {r.stderr.strip()[-300:]}", step="sync.list")
    out: dict[str, int] = {}
    for line in r.stdout.splitlines():
        size, tab, rel = line.partition("\t")
        if tab and size.isdigit():
            out[rel] = int(size)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def remote_hashes(conn: Connector, remote: str, names: list[str], nbytes: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(0, len(names), HASH_BATCH):
        batch = names[i:i + HASH_BATCH]
        r = conn.run(["sh", "-c", HASH_SH, "ktdeploy-hash", remote, *batch], timeout=120 + nbytes / 50e6)
        if r.rc != 0:
            raise StepError(f"could not hash the uploaded files on {conn.name}: {r.stderr.strip()[-300:]}",
                            step="sync.verify", fix="Check that sha256sum (coreutils) is installed on the host.")
        for line in r.stdout.splitlines():
            digest, _, name = line.partition("  ")
            if name in batch:
                out[name] = digest
    return out


def interrupted(local: dict[str, int], remote: dict[str, int]) -> list[str]:
    """The host's files that are rsync's temp files of the local files (``dir/.NAME.XXXXXX`` beside ``dir/NAME``):
    what an upload stopped mid-file by an older ktdeploy left; never "other content"."""
    out = []
    for rel in remote:
        folder, base = posixpath.split(rel)
        m = TEMP_NAME.fullmatch(base)
        if rel not in local and m and posixpath.join(folder, m.group("name")) in local:
            out.append(rel)
    return sorted(out)


def conflicts(local: dict[str, int], remote: dict[str, int]) -> list[str]:
    """What the host's folder holds that is not the local folder's: other files, or the same names, other sizes."""
    extra = [f"{n} (not in the local folder)" for n in sorted(set(remote) - set(local))]
    other = [f"{n} ({remote[n]} bytes on the host, {local[n]} here)" for n in sorted(set(remote) & set(local))
             if remote[n] != local[n]]
    return extra + other


def sync_folder(conn: Connector, local_dir: str, remote: str, *, role: str, dry_run: bool = False,
                emit: Sink = ignore) -> SyncResult:
    """Upload ``local_dir`` to ``remote`` on the host (role: "model" or "data"); see the module's docstring. Ends
    with a Synced event (the run record's "sync")."""
    src = Path(local_dir).expanduser().resolve()
    remote = remote.rstrip("/") or "/"   # "DIR/" would follow a link at DIR
    if not posixpath.isabs(remote):
        raise UsageError(f"--sync-{role}: the target {printable(remote)} is not an absolute host path",
                         key=f"--sync-{role}", fix="Set the recipe's path to an absolute folder on the host.")
    here = local_files(src)
    res = SyncResult(role=role, local=str(src), remote=remote, files=len(here), bytes=sum(here.values()))
    there = remote_files(conn, remote, role) or {}
    leftovers = interrupted(here, there)
    there = {n: size for n, size in there.items() if n not in leftovers}
    clash = conflicts(here, there)
    if role == "model" and clash:
        raise UsageError(f"the host's {printable(remote)} already holds other content: " + "; ".join(clash[:5])
                         + (f"; ... {len(clash) - 5} more" if len(clash) > 5 else ""), key="--sync-model",
                         fix="ktdeploy never writes into a model folder with other content: point "
                             "train.model_name_or_path at a new folder (--set train.model_name_or_path=...), or "
                             "empty that one on the host yourself.")
    missing = [n for n in here if n not in there]
    res.copied = len(missing)
    need = sum(here[n] for n in missing)
    if dry_run:
        emit(Said(Mark.NOT, f"would upload {files_text(len(here), len(missing), need)} from {src} to {remote} (dry run)",
                  StageName.SYNC))
        emit(_synced(res, dry_run=True))
        return res
    t0 = time.monotonic()
    if missing:
        emit(Said(Mark.GO, f"upload {files_text(len(here), len(missing), need)} from {src} to {remote} on {conn.name}",
                  StageName.SYNC))
        free = free_bytes(conn, remote)
        if free is not None and free < need + SPACE_MARGIN:
            raise StepError(f"the host's {remote} has {size_text(free)} free, the upload needs {size_text(need)} (and "
                            f"{size_text(SPACE_MARGIN)} to spare): nothing was copied or created", step=f"sync.{role}",
                            fix="Free space on the host's file system (df -h there), or point the recipe's path at "
                                "a larger one.")
        rsync = getattr(conn, "rsync", None)
        if rsync is None:
            raise UsageError(f"--sync-{role} needs an SSH or local host; {conn.name} is neither", key=f"--sync-{role}",
                             fix="Copy the folder into the container's volume on its host instead.")
        r = conn.run(["mkdir", "-p", "--", remote], timeout=120)
        if r.rc == 0:   # rsync's partial and temp folders: private, never a link (LIST_SH said so)
            r = conn.run(["sh", "-c", 'umask 077 && mkdir -p -- "$1/' + TEMP + '"', "ktdeploy-sync", remote],
                         timeout=120)
        if r.rc != 0:
            raise StepError(f"could not create {remote} on {conn.name}: {r.stderr.strip()[-300:]}", step="sync.mkdir",
                            fix="Create the folder on the host, writable by the SSH user.")
        if leftovers:
            conn.run(["rm", "-f", "--", *[posixpath.join(remote, n) for n in leftovers]], timeout=120)
            res.notes.append(f"resumed an interrupted upload ({len(leftovers)} temp file(s) of it removed)")
        rsync(str(src), remote, RSYNC_FLAGS)
    _verify(conn, src, remote, here, role)
    # a finished upload leaves no trace of rsync's resumable state in the model or data folder
    conn.run(["sh", "-c", 'rm -rf -- "$1/' + PARTIAL + '"', "ktdeploy-sync", remote], timeout=120)
    res.seconds = round(time.monotonic() - t0, 2)
    emit(_synced(res, dry_run=False))
    return res


def _synced(res: SyncResult, *, dry_run: bool) -> Synced:
    return Synced(role=res.role, local=res.local, remote=res.remote, files=res.files, bytes=res.bytes,
                  copied=res.copied, seconds=res.seconds, notes=tuple(res.notes), dry_run=dry_run)


SPACE_MARGIN = 256 << 20   # bytes left free after an upload (the host's logs, rsync's partial file)
# free bytes of the file system that will hold DIR (its nearest existing ancestor): `df -P -k`'s "Available"
FREE_SH = ('p=$1; while [ ! -d "$p" ] && [ "$p" != / ]; do p=$(dirname -- "$p"); done; '
           "df -P -k -- \"$p\" 2>/dev/null | awk 'NR==2 {print $4}'")


def free_bytes(conn: Connector, remote: str) -> int | None:
    """Free bytes where ``remote`` will be written; None when the host cannot say (no df): not checked then."""
    r = conn.run(["sh", "-c", FREE_SH, "ktdeploy-df", remote], timeout=60)
    text = r.stdout.strip()
    return int(text) * 1024 if r.rc == 0 and text.isdigit() and len(text) < 20 else None


def _verify(conn: Connector, src: Path, remote: str, here: dict[str, int], role: str) -> None:
    there = remote_files(conn, remote, role) or {}
    short = [n for n in here if there.get(n) != here[n]]
    if short:
        raise StepError(f"after the upload the host's {remote} lacks or holds other sizes of: " + ", ".join(short[:5]),
                        step=f"sync.{role}", fix="Run the same command again: the upload resumes where it stopped.")
    names = sorted(here)
    theirs = remote_hashes(conn, remote, names, sum(here.values()))
    differ = [n for n in names if theirs.get(n) != _sha256(src / n)]
    if differ:
        raise StepError(f"the host's {remote} holds other content than {src} in: " + ", ".join(differ[:5]),
                        step=f"sync.{role}",
                        fix="Those files were there before the upload and were not replaced (ktdeploy never "
                            "overwrites them): remove them on the host, then run the same command again.")
