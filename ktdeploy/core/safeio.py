"""Hostile input never wins: the few helpers every reader, writer and path rule goes through.

- ``norm_path`` / ``inside`` / ``overlaps``: compare paths the way the kernel and docker resolve them
  (``//``, ``/./``, trailing ``/`` and ``..`` all collapse); ``host=True`` also resolves symlinks (doctor,
  convert and render run where the files are, so they can see them).
- ``read_bytes`` / ``read_text`` / ``load_json``: bounded readers that refuse FIFOs, devices and folders before
  reading a byte (a FIFO never blocks: it is opened with O_NONBLOCK and refused on fstat).
- ``parse_json``: the one JSON parser for text from outside (hosts, files, records): any failure, a nesting
  too deep for the parser or an integer past Python's digit limit included, is a ValueError.
- ``write_file`` / ``writing`` / ``appending`` / ``append_line``: the one way ktdeploy writes a file: never
  through a symlink, never out of the target folder, never over an existing file unless asked, atomically
  (temp file + rename) unless appending to a log.
- ``run_lock``: one lock per job (``up``/``down``), held by an open file so a killed process frees it.
- ``redact``: drops the password of ``scheme://user:PASSWORD@host`` from any text before it is printed,
  recorded or put on an argv.
- ``run_id_name``: a run id is a name, never a path.

Pure apart from the file operations themselves; errors are KtdeployErrors with a fix.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, overload

from ktdeploy.core.errors import OverwriteRefused, RunRecordError, UsageError

MAX_TEXT = 1 << 20          # recipes, YAML and JSON configs are small text files
MAX_JSON = 16 << 20         # config.json, manifests, run records


# ---------------------------------------------------------------- paths

def norm_path(p: str) -> str:
    """An absolute POSIX path as the kernel resolves it without symlinks: '//a/./b/../c/' -> '/a/c'.

    posixpath.normpath keeps a leading '//' (POSIX leaves it implementation-defined; Linux and docker treat
    it as '/'), which let '//srv/models' escape a containment test against '/srv/models'."""
    if not isinstance(p, str) or not p:
        raise ValueError("empty path")
    parts: list[str] = []
    for part in p.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return ("/" if p.startswith("/") else "") + "/".join(parts) or "."


def host_path(p: str | os.PathLike[str]) -> str:
    """The real path on this machine (symlinks resolved, missing tails kept)."""
    return norm_path(os.path.realpath(os.fspath(p)))


def inside(path: str, root: str, *, host: bool = False) -> bool:
    """``path`` is ``root`` or lies below it, in any spelling (and through symlinks with ``host=True``)."""
    if host:
        path, root = host_path(path), host_path(root)
    else:
        path, root = norm_path(path), norm_path(root)
    return path == root or root == "/" or path.startswith(root + "/")


def overlaps(a: str, b: str, *, host: bool = False) -> bool:
    return inside(a, b, host=host) or inside(b, a, host=host)


# ---------------------------------------------------------------- reading

def _open_regular(path: Path, what: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", fix=f"give the path of the {what}") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder, not a file", fix=f"give the path of the {what}") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot be read: {err.strerror}", fix="check the path and its permissions") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UsageError(f"{path}: not a regular file (a FIFO, device, socket or folder)",
                         fix=f"give the path of the {what}, a plain file")
    return fd, st


def open_binary(path: str | os.PathLike[str], what: str = "file") -> IO[bytes]:
    """A regular file opened for reading (a FIFO or device refused without blocking), e.g. to stream it."""
    fd, _st = _open_regular(Path(path), what)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_TEXT, what: str = "file") -> bytes:
    path = Path(path)
    fd, st = _open_regular(path, what)
    try:
        if st.st_size > limit:
            raise UsageError(f"{path}: {st.st_size} bytes is too large for a {what} (at most {limit})",
                             fix="check the path")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise UsageError(f"{path}: cannot be read: {err.strerror}", fix="check the path and its permissions") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UsageError(f"{path}: larger than {limit} bytes; not a {what}", fix="check the path")
    return data


def read_text(path: str | os.PathLike[str], limit: int = MAX_TEXT, what: str = "file") -> str:
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text", fix=f"save the {what} as UTF-8") from None


def parse_json(text: str | bytes) -> Any:
    """JSON text from outside -> a value, or ValueError for ANY failure: bad syntax, bytes that are not UTF-8,
    a nesting deeper than the parser's stack (RecursionError, which the CLI would map to "the system refused"),
    an integer of more than 4,300 digits (Python's int limit raises a plain ValueError, not a JSONDecodeError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, TypeError) as err:
        raise ValueError(str(err)[:200] or type(err).__name__) from None


def load_json(path: str | os.PathLike[str], limit: int = MAX_JSON, what: str = "JSON file") -> Any:
    text = read_text(path, limit, what)
    try:
        return parse_json(text)
    except ValueError as err:
        raise UsageError(f"{path}: not valid JSON ({str(err)[:200]})", fix=f"give a valid {what}") from None


# ---------------------------------------------------------------- writing

def _target_dir(directory: str | os.PathLike[str]) -> Path:
    if directory is None or os.fspath(directory) == "":
        raise UsageError("the output folder is empty", fix="give a folder, e.g. -o out/")
    d = Path(directory)
    try:
        if d.is_symlink():
            raise UsageError(f"{d} is a symbolic link; ktdeploy never writes through a link",
                             fix="give the real folder")
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{d} exists and is not a folder", fix="give a folder for -o") from None
    except NotADirectoryError:
        raise UsageError(f"{d}: a part of the path is a file, not a folder", fix="give a folder for -o") from None
    except OSError as err:
        raise UsageError(f"{d}: cannot create the folder: {err.strerror}",
                         fix="choose a writable folder") from None
    if not d.is_dir():
        raise UsageError(f"{d} exists and is not a folder", fix="give a folder for -o")
    return d


def _open_dir(d: Path) -> int:
    try:
        return os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:
        raise UsageError(f"{d}: cannot open the folder: {err.strerror}", fix="choose a writable folder") from None


def _check_target(dfd: int, d: Path, name: str, overwrite: bool) -> None:
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{d / name} is a symbolic link; ktdeploy never writes through a link",
                         fix="remove the link or choose another folder")
    if not overwrite:
        raise OverwriteRefused(f"{d / name} exists; ktdeploy does not overwrite files",
                               fix="remove it, choose another folder, or pass --force")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{d / name} exists and is not a plain file", fix="choose another folder")


def _fdopen(fd: int, binary: bool, mode: str) -> IO[Any]:
    """os.fdopen in binary or UTF-8 text mode ("w" or "a")."""
    if binary:
        return os.fdopen(fd, mode + "b")
    return os.fdopen(fd, mode, encoding="utf-8")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise UsageError(f"invalid file name {name!r}", fix="a bare file name")


@contextmanager
def writing(directory: str | os.PathLike[str], name: str, *, mode: int = 0o644, overwrite: bool = False,
            binary: bool = True) -> Iterator[IO[Any]]:
    """``with writing(folder, name) as f: ...``: a streaming write with write_file's guarantees. ``f`` is a new
    temp file in ``folder`` (O_EXCL, O_NOFOLLOW); when the block ends without an exception it becomes
    ``folder/name`` in one step (rename, or link when not overwriting: a file that appeared meanwhile is kept);
    on an exception it is removed and ``folder/name`` is untouched."""
    _check_name(name)
    d = _target_dir(directory)
    dfd = _open_dir(d)
    tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
    try:
        _check_target(dfd, d, name, overwrite)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         0o600, dir_fd=dfd)
        except OSError as err:
            raise UsageError(f"{d}: cannot write: {err.strerror}", fix="choose a writable folder") from None
        try:
            with _fdopen(fd, binary, "w") as f:
                yield f   # the caller's own exceptions pass through unchanged; the temp file goes
                f.flush()
                os.fchmod(f.fileno(), mode)
            _publish(dfd, d, tmp, name, overwrite)
        finally:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)


def _publish(dfd: int, d: Path, tmp: str, name: str, overwrite: bool) -> None:
    _check_target(dfd, d, name, overwrite)  # a link planted while writing is refused, not replaced
    try:
        if overwrite:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)  # fails if it appeared
    except FileExistsError:
        raise OverwriteRefused(f"{d / name} appeared while writing; not overwritten",
                               fix="remove it or choose another folder") from None
    except OSError as err:
        raise UsageError(f"{d / name}: cannot write: {err.strerror}", fix="choose a writable folder") from None


def write_file(directory: str | os.PathLike[str], name: str, data: bytes | str, *, mode: int = 0o644,
               overwrite: bool = False) -> Path:
    """Write ``directory/name`` atomically. ``name`` is one path component. A symlink at the target (even a
    dangling one) is refused; an existing file is refused unless ``overwrite``; the rename replaces the entry
    in ``directory`` itself, so nothing outside the folder is ever touched."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with writing(directory, name, mode=mode, overwrite=overwrite) as f:
        f.write(data)
    return Path(directory) / name


def write_path(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644, overwrite: bool = False) -> Path:
    """write_file for a whole path (its folder is made when missing)."""
    p = Path(path)
    return write_file(p.parent, p.name, data, mode=mode, overwrite=overwrite)


def creating(directory: str | os.PathLike[str], name: str, *, overwrite: bool = False, binary: bool = True,
             mode: int = 0o644) -> IO[Any]:
    """A new file opened for writing that others may read while it grows (a trial's log): created with O_EXCL and
    O_NOFOLLOW in ``directory``; an existing plain file there is removed first when ``overwrite`` (a link, a FIFO
    or a folder is refused, never followed). The caller closes it."""
    _check_name(name)
    d = _target_dir(directory)
    dfd = _open_dir(d)
    try:
        _check_target(dfd, d, name, overwrite)
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         mode, dir_fd=dfd)
        except FileExistsError:
            raise OverwriteRefused(f"{d / name} appeared while writing; not overwritten",
                                   fix="remove it or choose another folder") from None
        except OSError as err:
            raise UsageError(f"{d / name}: cannot write: {err.strerror}", fix="choose a writable folder") from None
    finally:
        os.close(dfd)
    return _fdopen(fd, binary, "w")


def appending(path: str | os.PathLike[str], *, binary: bool = False) -> IO[Any]:
    """A log or record file opened for appending (created when missing): never through a symlink (the file or its
    folder), only a regular file (a FIFO or device is refused without blocking). The caller closes it."""
    p = Path(path)
    d = p.parent if str(p.parent) else Path(".")
    _check_name(p.name)
    if d.is_symlink():
        raise UsageError(f"{d} is a symbolic link; ktdeploy never writes through a link", fix="give the real folder")
    dfd = _open_dir(d)
    try:
        try:
            fd = os.open(p.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=dfd)
        except OSError as err:
            raise UsageError(f"{p}: cannot append: {err.strerror} (a link there is never followed)",
                             fix="remove the link or choose another folder") from None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{p}: not a regular file", fix="remove it or choose another folder")
    os.set_blocking(fd, True)
    return _fdopen(fd, binary, "a")


def staging_dir(parent: str | os.PathLike[str], prefix: str) -> Path:
    """A new temp folder in ``parent`` to build an output in before one rename publishes it; its mode is what a
    plain mkdir gives (mkdtemp's 0700 would hide a published model or adapter from the training/serving user)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def _trusted_ancestors(path: Path) -> None:
    """Every folder from / down to ``path`` (as written and as resolved) is root's or this uid's, and none that
    others may write to lacks the sticky bit (/tmp has it): whoever owns or may write into a folder of the chain can
    rename what ktdeploy made below it and put their own in its place (probe 3, F13: ``/tmp/.cache`` made first by
    another user)."""
    uid = os.getuid()
    for chain in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        cur = Path("/")
        for part in ("", *chain.parts[1:]):
            cur = cur / part if part else cur
            try:
                st = os.lstat(cur)
            except OSError as err:
                raise UsageError(f"{cur}: cannot be read: {err.strerror}",
                                 fix="set HOME to a folder of this user") from None
            if st.st_uid not in (0, uid):
                raise UsageError(f"{cur} belongs to uid {st.st_uid}, another user: a cache below it could be "
                                 "replaced by them", fix=f"set HOME to a folder of this user (or remove {cur})")
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise UsageError(f"{cur} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}, no sticky "
                                 "bit): a cache below it could be replaced by them",
                                 fix=f"chmod go-w {cur}, or set HOME to a folder of this user")


def private_dir(path: str | os.PathLike[str], owned_from: str | os.PathLike[str]) -> Path:
    """``mkdir -p path`` where every folder from ``owned_from`` down is this uid's own, mode 0700, and no link:
    a cache another user could write into (and so plant files the server reads) is refused."""
    p, top = Path(path), Path(owned_from)
    try:
        rel = p.relative_to(top)
    except ValueError:
        raise UsageError(f"{p} is not inside {top}", fix="report this as a ktdeploy bug") from None
    chain = [top]
    for part in rel.parts:
        chain.append(chain[-1] / part)
    try:
        top.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{top.parent}: cannot create it: {err.strerror}",
                         fix="set HOME to a writable folder of this user") from None
    _trusted_ancestors(top.parent)
    for d in chain:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as err:
            raise UsageError(f"{d}: cannot create the cache folder: {err.strerror}",
                             fix="set HOME to a writable folder of this user") from None
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{d} is a link or not a folder; ktdeploy keeps its caches in a folder of its own",
                             fix=f"remove {d}")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise UsageError(f"{d} belongs to uid {st.st_uid} or is open to others (mode {stat.S_IMODE(st.st_mode):o})",
                             fix=f"remove {d}, or set HOME to a folder of this user")
    return p


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append one line to a log/record file; refuses to follow a symlink."""
    with appending(path) as f:
        f.write(line.rstrip("\n") + "\n")


@contextmanager
def run_lock(lock_dir: str | os.PathLike[str], key: str, what: str) -> Iterator[None]:
    """Hold the lock named ``key`` (any text; hashed into a file name) in ``lock_dir`` for the block, or raise a
    RunRecordError naming ``what`` holds it. flock on an open file: a process that dies (SIGKILL included)
    frees its lock, so a stale lock never blocks the next run."""
    import fcntl
    import hashlib

    d = _target_dir(lock_dir)
    name = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".lock"
    with appending(d / name, binary=True) as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunRecordError(f"another ktdeploy command is already working on {what}; nothing was started",
                                 fix="Wait for it to end (or stop it with Ctrl-C), then run this again; "
                                     "`ktdeploy status` shows the job.") from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------- secrets, names, text

_LETTERS = frozenset(string.ascii_letters)
_SCHEME_CHARS = _LETTERS | frozenset(string.digits + "+.-")


def _schemes(s: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every 'scheme://' the regex [A-Za-z][A-Za-z0-9+.-]*:// finds, left to right, without its
    cost: the regex tries every start of a long run of letters and scans the run from each (64 KB of letters in a
    record took 24 s); here each '://' scans back over its own scheme characters once."""
    pos = 0
    for m in re.finditer("://", s):
        q = m.start()
        if q < pos:
            continue
        p = q
        while p > pos and s[p - 1] in _SCHEME_CHARS:
            p -= 1
        while p < q and s[p] not in _LETTERS:     # a scheme starts with a letter: the leftmost one of the run
            p += 1
        if p < q:
            yield p, q + 3
            pos = q + 3


def _redact_str(s: str) -> str:
    """The userinfo of every 'scheme://user:PW@host' loses its password. The authority is read the way
    urllib.parse.urlsplit reads it (up to '/', '?' or '#', the userinfo ends at the LAST '@'), so a password
    holding ':', '@', ';' or spaces is covered too; when in doubt more is hidden, never less."""
    out, i = [], 0
    for start, m_end in _schemes(s):
        if start < i:
            continue
        end = m_end
        while end < len(s) and s[end] not in "/?#\n":
            end += 1
        authority = s[m_end:end]
        if _redact_authority(authority) != authority:
            out.append(s[i:m_end] + _redact_authority(authority))
            i = end
    out.append(s[i:])
    return "".join(out)


def _redact_authority(authority: str) -> str:
    """'user:PW@host:port' -> 'user:***@host:port'; the userinfo ends at the LAST '@'."""
    userinfo, at, hostport = authority.rpartition("@")
    if at and ":" in userinfo:
        return f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    return authority


def redact(text: Any) -> Any:
    """'ssh://user:PASSWORD@host' -> 'ssh://user:***@host' (strings, and strings inside dicts/lists)."""
    if isinstance(text, str):
        return _redact_str(text)
    if isinstance(text, dict):
        return {k: redact(v) for k, v in text.items()}
    if isinstance(text, (list, tuple)):
        return type(text)(redact(v) for v in text)
    return text


_SECRET_OPTION = re.compile(r"api[-_]key|(^|[-_])(token|password|passwd|secret)($|[-_])")  # not --max-total-tokens


def secret_option(arg: Any) -> bool:
    """``arg`` names a command-line option that carries a secret, in any spelling argparse accepts: ``--api-key``,
    ``--api-key=K``, an abbreviation (``--api-k``, argparse's allow_abbrev), ``--admin-api-key``, ``--hf-token``."""
    if not isinstance(arg, str) or not arg.startswith("-") or len(arg) < 3:
        return False
    name = arg.split("=", 1)[0].lower()
    if not name.startswith("--"):  # a one-dash spelling (-api-key): not argparse's, but never let a key through
        return bool(_SECRET_OPTION.search(name[1:]))
    return (len(name) >= 5 and "--api-key".startswith(name)) or bool(_SECRET_OPTION.search(name[2:]))


@overload
def redact_host(host: str) -> str: ...
@overload
def redact_host(host: None) -> None: ...
def redact_host(host: str | None) -> str | None:
    """A --host value without its password, whether written ssh://user:PW@h or user:PW@h."""
    if not isinstance(host, str) or not host:
        return host
    scheme, sep, rest = host.partition("://")
    # a host has no path: all of it is the authority, even a password holding '/', '#' or '?'
    return scheme + sep + _redact_authority(rest) if sep else _redact_authority(host)


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a run id; also docker's rule for a container name


def run_id_name(run_id: str) -> str:
    """A run id (or prefix) is a name: letters, digits, '.', '_', '-'; never '/', '..' or empty."""
    if not isinstance(run_id, str) or not NAME.match(run_id) or ".." in run_id:
        raise UsageError(f"--run {printable(run_id)}: a run id is a name, not a path",
                         fix="List the runs with `ktdeploy status --all` and give one id.")
    return run_id


def printable(text: Any, limit: int = 200) -> str:
    """User text made safe for one line of a generated file or a message: quoted, escaped, bounded."""
    s = str(text)
    if len(s) > limit:
        s = s[:limit] + "..."
    return json.dumps(s, ensure_ascii=True)
