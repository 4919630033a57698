"""What an image tarball would tag, read the way the engine reads it, before `docker load` applies it.

`docker load` applies every name an archive carries (docker save's manifest.json RepoTags; the legacy
`repositories` file and an OCI index.json's image-name annotations for other engines). A tarball from elsewhere
could so retag any image on the host (`ubuntu:22.04`, another team's `ktsft:amx`…). ktdeploy reads those names
first and loads only an archive whose every name is one it asked for (issue 35).

Two readers of one file must agree (issue 45). The engine (moby's image/tarexport) untars the whole archive into a
folder with Go's archive/tar — later members replace earlier ones, paths are cleaned (`a/../manifest.json` is
`manifest.json`), links are made and followed — then reads manifest.json with Go's encoding/json, whose field
names match in any case (`repotags` is `RepoTags`). So this module reads the tar bytes itself, as Go does, and
refuses every archive two readers could read differently: a header that is not plain POSIX ustar/pax, a name that
is not its own clean form, a name given twice, a link (hard, or symbolic at or above an index file or pointing
out of the archive), a compressed archive, data after the end, a JSON key other than docker's own spelling or
given twice. What is left has one reading, the engine's and ours."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ktdeploy.core.errors import ImageError
from ktdeploy.core.safeio import open_binary, printable

MAX_MEMBERS = 200_000          # docker save writes a few per layer; a tar of millions of entries is not one
MAX_INDEX_BYTES = 16 << 20     # manifest.json / repositories / index.json
MAX_PAX_BYTES = 1 << 20
BLOCK = 512
ZERO = bytes(BLOCK)
INDEX_FILES = ("manifest.json", "repositories", "index.json")
FIX = "Use the file `ktdeploy image save` (docker save) wrote, unchanged; never a repacked or edited archive."
# what the engine's decompressor recognises (moby pkg/archive DetectCompression): it would read another archive
COMPRESSED = {b"\x1f\x8b\x08": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
# docker save's manifest.json entry (moby image/tarexport manifestItem) and the OCI index's fields
MANIFEST_KEYS = ("Config", "RepoTags", "Layers", "Parent", "LayerSources")
INDEX_KEYS = ("schemaVersion", "mediaType", "manifests", "annotations", "artifactType", "subject")
DESCRIPTOR_KEYS = ("mediaType", "digest", "size", "urls", "annotations", "platform", "artifactType", "data")
IMAGE_NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"
# pax records whose meaning Go's and Python's readers share; any other (GNU sparse maps, charsets) is refused
PAX_KEYS = ("path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname")
_OCTAL = re.compile(rb" *[0-7]*[ \x00]*")      # no NUL before the digits: Python stops there, Go skips it
_PAX_RECORD = re.compile(rb"([1-9][0-9]{0,6}) ")
_NAME_CHARS = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def ambiguous(archive: str | Path, why: str) -> ImageError:
    return ImageError(f"{printable(str(archive))}: {why}; the engine could read another archive than ktdeploy "
                      "checked, so nothing was loaded", fix=FIX)


def normalise(ref: str) -> str:
    """'docker.io/library/ktsft:amx' -> 'ktsft:amx' (the names docker shows for the same image)."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


@dataclass(frozen=True)
class Member:
    name: str          # cleaned: no trailing '/'
    kind: str          # "file", "dir" or "symlink"
    size: int
    target: str = ""   # a symlink's
    data: bytes | None = None   # an index file's content


# ---------------------------------------------------------------- the tar, byte by byte, as Go's archive/tar

def _octal(field: bytes, what: str, archive: str | Path) -> int:
    if field[:1] and field[0] & 0x80:
        raise ambiguous(archive, f"{what} is written in base-256 (a GNU extension docker save never writes)")
    if not _OCTAL.fullmatch(field):
        raise ambiguous(archive, f"{what} {field!r} is not a plain octal number")
    digits = field.strip(b" \x00")
    return int(digits, 8) if digits else 0


def _text(raw: bytes, what: str, archive: str | Path) -> str:
    """A header's name or link target: its bytes to the first NUL (both readers stop there)."""
    return _plain_text(raw.split(b"\x00", 1)[0], what, archive)


def _plain_text(raw: bytes, what: str, archive: str | Path) -> str:
    """Printable ASCII, no blank at either end: what docker save writes, read the same by every reader."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ambiguous(archive, f"{what} {raw[:80]!r} is not plain ASCII") from None
    if text and not _NAME_CHARS.fullmatch(text):
        raise ambiguous(archive, f"{what} {text[:80]!r} holds control characters or leading/trailing blanks")
    return text


def _pax(data: bytes, archive: str | Path) -> dict[str, str]:
    """Strict pax records (`LEN key=value\\n`, LEN counting the whole record), each key once and known."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        m = _PAX_RECORD.match(data, i)
        if not m or i + int(m.group(1)) > len(data) or data[i + int(m.group(1)) - 1:i + int(m.group(1))] != b"\n":
            raise ambiguous(archive, "a pax extended header is malformed")
        record = data[m.end():i + int(m.group(1)) - 1]
        key, eq, value = record.partition(b"=")
        k = key.decode("ascii", "replace")
        if not eq or k not in PAX_KEYS:
            raise ambiguous(archive, f"a pax extended header holds {k[:40]!r}, which ktdeploy does not read")
        if k in out:
            raise ambiguous(archive, f"a pax extended header gives {k} twice")
        out[k] = _plain_text(value, f"the pax {k}", archive)
        i += int(m.group(1))
    return out


def _read(f: IO[bytes], n: int, archive: str | Path) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ambiguous(archive, "the archive ends in the middle of an entry (an incomplete copy?)")
    return data


def _skip(f: IO[bytes], n: int, archive: str | Path) -> None:
    here = f.tell()
    f.seek(0, 2)
    end = f.tell()
    if here + n > end:
        raise ambiguous(archive, "the archive ends in the middle of an entry (an incomplete copy?)")
    f.seek(here + n)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _entries(f: IO[bytes], archive: str | Path) -> Iterator[Member]:
    pax: dict[str, str] | None = None
    count = 0
    while True:
        blk = f.read(BLOCK)
        if len(blk) < BLOCK:
            raise ambiguous(archive, "the archive ends without its end-of-archive blocks (an incomplete copy?)")
        if blk == ZERO:
            if pax is not None:
                raise ambiguous(archive, "a pax extended header is followed by the end of the archive")
            _end(f, archive)
            return
        count += 1
        if count > MAX_MEMBERS:
            raise ImageError(f"{printable(str(archive))}: more than {MAX_MEMBERS} entries; not an image archive; nothing was loaded",
                             fix=FIX)
        if blk[257:265] != b"ustar\x0000" or blk[500:] != bytes(12):
            raise ambiguous(archive, "an entry's header is not POSIX ustar (a GNU, star or v7 tar header, which "
                                     "Go's and Python's tar readers read differently)")
        stored = _octal(blk[148:156], "a header checksum", archive)
        sums = {sum(blk[:148]) + 256 + sum(blk[156:]),
                sum(b - 256 if b > 127 else b for b in blk[:148] + blk[156:]) + 256}
        if stored not in sums:
            raise ambiguous(archive, "an entry's header checksum is wrong (Python's tar reader stops there, Go's "
                                     "does not)")
        kind = blk[156:157]
        size = _octal(blk[124:136], "an entry's size", archive)
        if kind == b"x":
            if pax is not None:
                raise ambiguous(archive, "two pax extended headers in a row (each reader keeps another)")
            if size > MAX_PAX_BYTES:
                raise ambiguous(archive, f"a pax extended header of {size} bytes")
            pax = _pax(_read(f, _padded(size), archive)[:size], archive)
            continue
        prefix = _text(blk[345:500], "a name prefix", archive)
        name = _text(blk[0:100], "a name", archive)
        name = f"{prefix}/{name}" if prefix else name
        target = _text(blk[157:257], "a link target", archive)
        if pax is not None:
            name = pax.get("path", name)
            target = pax.get("linkpath", target)
            if "size" in pax:
                if not re.fullmatch(r"[0-9]{1,19}", pax["size"]):
                    raise ambiguous(archive, f"a pax size {pax['size'][:30]!r} is not a plain number")
                size = int(pax["size"])
            pax = None
        yield _member(f, archive, kind, name, size, target)


def _end(f: IO[bytes], archive: str | Path) -> None:
    """After the first zero block: only zeros to the end (a second zero block, a writer's padding)."""
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return
        if chunk.count(0) != len(chunk):
            raise ambiguous(archive, "data follows the end-of-archive block")


def _member(f: IO[bytes], archive: str | Path, kind: bytes, name: str, size: int, target: str) -> Member:
    shown = printable(name, 120)
    if kind == b"5":
        if size:
            raise ambiguous(archive, f"the folder {shown} has a size")
        return Member(_clean(name[:-1] if name.endswith("/") else name, archive), "dir", 0)
    if kind == b"2":
        if size:
            raise ambiguous(archive, f"the link {shown} has a size")
        return Member(_clean(name, archive), "symlink", 0, target=target)
    if kind == b"0":
        clean = _clean(name, archive)
        if clean in INDEX_FILES:
            if size > MAX_INDEX_BYTES:
                raise ImageError(f"{printable(str(archive))}: {clean} is {size} bytes; not an image archive's; nothing was "
                                 "loaded",
                                 fix=FIX)
            return Member(clean, "file", size, data=_read(f, _padded(size), archive)[:size])
        _skip(f, _padded(size), archive)
        return Member(clean, "file", size)
    what = {b"1": "a hard link", b"g": "a global pax header", b"\x00": "an old-style regular entry",
            b"L": "a GNU long name", b"K": "a GNU long link name", b"S": "a GNU sparse file",
            b"3": "a character device", b"4": "a block device", b"6": "a FIFO"}.get(kind, f"type {kind!r}")
    raise ambiguous(archive, f"{shown} is {what}, which docker save never writes")


def _clean(name: str, archive: str | Path) -> str:
    """A member's name must be the path the engine cleans it to: relative, no '.', '..', '//' or trailing '/'."""
    if not name or name.startswith("/") or posixpath.normpath(name) != name or name == "." or \
            ".." in name.split("/"):
        clean = posixpath.normpath("/" + name).lstrip("/") if name else ""
        raise ambiguous(archive, f"the entry {printable(name, 120)} is not written as the path it names"
                                 + (f" ({clean})" if clean and clean != name else ""))
    return name


# ---------------------------------------------------------------- the archive's structure

def read_members(archive: str | Path) -> dict[str, Member]:
    """Every entry of ``archive`` by name; ImageError when it is unreadable or ambiguous (see the module's doc)."""
    try:
        with open_binary(archive, "image archive") as f:
            head = f.read(8)
            for magic, kind in COMPRESSED.items():
                if head.startswith(magic):
                    raise ImageError(f"{printable(str(archive))} is {kind}-compressed; ktdeploy reads the "
                                     "archive docker save writes, as it wrote it; nothing was loaded", fix=f"Decompress it first (e.g. {kind} -d), then "
                                                                       "load the .tar.")
            f.seek(0)
            members: dict[str, Member] = {}
            for m in _entries(f, archive):
                if m.name in members:
                    raise ambiguous(archive, f"{printable(m.name, 120)} appears twice (the engine keeps the last, "
                                             "a reader of the first sees another archive)")
                members[m.name] = m
    except OSError as err:
        raise ImageError(f"{printable(str(archive))}: not a readable image archive ({err.strerror or err})",
                         fix="Is the file complete? Compare its size or sha256 with the source host's.") from None
    _check_structure(archive, members)
    return members


def _check_structure(archive: str | Path, members: dict[str, Member]) -> None:
    for m in members.values():
        parts = m.name.split("/")
        for i in range(1, len(parts)):
            above = members.get("/".join(parts[:i]))
            if above is not None and above.kind != "dir":
                raise ambiguous(archive, f"{printable(m.name, 120)} lies under {above.name}, which is a "
                                         f"{'link' if above.kind == 'symlink' else 'file'}")
        if m.name in INDEX_FILES and m.kind != "file":
            raise ambiguous(archive, f"{m.name} is a {'link' if m.kind == 'symlink' else 'folder'}, not a file")
        if m.kind == "symlink":
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(m.name), m.target))
            to = members.get(resolved)
            if m.target.startswith("/") or resolved.split("/")[0] == ".." or to is None or to.kind != "file" \
                    or resolved in INDEX_FILES:
                raise ambiguous(archive, f"the link {printable(m.name, 120)} points to "
                                         f"{printable(m.target, 120)}, not to a file of the archive")
    if "manifest.json" not in members:
        raise ImageError(f"{printable(str(archive))} has no manifest.json: not an archive docker save wrote "
                         "(legacy archives are read another way); nothing was loaded", fix=FIX)


# ---------------------------------------------------------------- the index files, as Go's encoding/json

def _json(archive: str | Path, name: str, data: bytes) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ambiguous(archive, f"{name} gives the key {printable(k, 60)} twice")
            out[k] = v
        return out

    def constant(word: str) -> Any:
        raise ambiguous(archive, f"{name} holds {word}, which is not JSON")

    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):
            raise ValueError("a byte-order mark")
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except ImageError:
        raise
    except RecursionError:
        raise ambiguous(archive, f"{name} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ambiguous(archive, f"{name} is not plain UTF-8 JSON ({str(err)[:120]})") from None


def _keys(archive: str | Path, name: str, obj: dict, known: tuple[str, ...]) -> None:
    """Go's encoding/json takes a key in any case (and a few Unicode look-alikes) for a field: only docker's own
    spelling is read here, any other key is refused."""
    for k in obj:
        if k not in known:
            fold = k.casefold().replace("ſ", "s").replace("\u212a", "k")
            same = next((f for f in known if f.casefold() == fold), None)
            raise ambiguous(archive, f"{name} has the key {printable(k, 60)}"
                                     + (f", which the engine reads as {same} (Go's JSON field names ignore case)"
                                        if same else ", which docker save never writes"))


def _strings(archive: str | Path, name: str, value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ambiguous(archive, f"{name}: {what} is not a list of names")
    return value


def _manifest_names(archive: str | Path, data: bytes) -> set[str]:
    doc = _json(archive, "manifest.json", data)
    if not isinstance(doc, list):
        raise ambiguous(archive, "manifest.json is not a list of images")
    names: set[str] = set()
    for entry in doc:
        if not isinstance(entry, dict):
            raise ambiguous(archive, "manifest.json lists something that is not an image")
        _keys(archive, "manifest.json", entry, MANIFEST_KEYS)
        names |= set(_strings(archive, "manifest.json", entry.get("RepoTags"), "RepoTags"))
        if not isinstance(entry.get("Config"), str) or not isinstance(entry.get("Layers", []), list):
            raise ambiguous(archive, "manifest.json names no Config file or Layers list")
    return names


def _repositories_names(archive: str | Path, data: bytes) -> set[str]:
    doc = _json(archive, "repositories", data)
    if not isinstance(doc, dict) or not all(isinstance(t, dict) and all(isinstance(x, str) for x in t.values())
                                            for t in doc.values()):
        raise ambiguous(archive, "repositories is not {repository: {tag: id}}")
    return {f"{repo}:{tag}" for repo, tags in doc.items() for tag in tags}


def _index_names(archive: str | Path, data: bytes) -> set[str]:
    doc = _json(archive, "index.json", data)
    if not isinstance(doc, dict):
        raise ambiguous(archive, "index.json is not an OCI index")
    _keys(archive, "index.json", doc, INDEX_KEYS)
    names: set[str] = set()
    for d in doc.get("manifests") or []:
        if not isinstance(d, dict):
            raise ambiguous(archive, "index.json lists something that is not a descriptor")
        _keys(archive, "index.json", d, DESCRIPTOR_KEYS)
        ann = d.get("annotations") or {}
        if not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values()):
            raise ambiguous(archive, "index.json has annotations that are not names")
        full = ann.get(IMAGE_NAME)
        if full:
            names.add(full)
        ref = ann.get(REF_NAME)
        # an OCI ref name is a whole reference, or (docker save's) the tag of the image name beside it
        if ref and not (full and full.endswith(":" + ref)):
            names.add(ref)
    return names


def archive_tags(archive: str | Path) -> set[str]:
    """Every image name ``archive`` would apply when loaded. ImageError when it is not a readable image tar or
    can be read in more than one way."""
    members = read_members(archive)
    names: set[str] = set()
    for kind, read in (("manifest.json", _manifest_names), ("repositories", _repositories_names),
                       ("index.json", _index_names)):
        m = members.get(kind)
        if m is not None and m.data is not None:
            names |= read(archive, m.data)
    return {normalise(n) for n in names}


def require_only(archive: str | Path, allowed: set[str], what: str) -> set[str]:
    """The archive's names, when every one is in ``allowed``; else ImageError naming the others (nothing loaded)."""
    tags = archive_tags(archive)
    extra = sorted(tags - {normalise(a) for a in allowed})
    if extra:
        raise ImageError(f"{archive} would also tag {', '.join(printable(e, 120) for e in extra[:10])}"
                         + (" …" if len(extra) > 10 else "") +
                         f", which ktdeploy did not ask for ({what}); nothing was loaded",
                         fix="Load only archives `ktdeploy image save` wrote for these images, or load this one "
                             "yourself with `docker load` if you trust every name in it.")
    return tags
