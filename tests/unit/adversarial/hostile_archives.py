"""Image archives that two readers read differently (issue 45, class 1), written byte by byte.

Each case takes the members of a real or minimal `docker save` archive (everything but its manifest.json and
repositories), the manifest ktdeploy was asked to allow (``benign``) and one naming a victim tag (``evil``), and
hides the evil one where moby's loader (Go's archive/tar into a folder, then encoding/json) finds it and the old
pre-check (Python's tarfile, exact "RepoTags") did not. The unit tier checks each is refused before the engine
is asked; the docker tier (tests/integration/test_image_archive_hostile.py) loads them into the real engine."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass

BLOCK = 512


def _octal(n: int, width: int) -> bytes:
    return b"%0*o\x00" % (width - 1, n)


def header(name: str, size: int = 0, kind: bytes = b"0", *, link: str = "", prefix: str = "",
           magic: bytes = b"ustar\x0000", checksum: str = "plain") -> bytes:
    b = bytearray(BLOCK)
    b[0:len(name)] = name.encode()
    b[100:108] = _octal(0o755 if kind in (b"5", b"2") else 0o644, 8)
    b[108:116] = _octal(0, 8)
    b[116:124] = _octal(0, 8)
    b[124:136] = _octal(size, 12)
    b[136:148] = _octal(0, 12)
    b[156:157] = kind
    b[157:157 + len(link)] = link.encode()
    b[257:265] = magic
    b[345:345 + len(prefix)] = prefix.encode()
    b[148:156] = b" " * 8
    chk = sum(b)
    # "nul-first": a NUL before the digits. Go's reader trims it and takes the header; Python's tarfile reads 0,
    # calls the header invalid and silently ends the archive there.
    b[148:156] = (b"%06o\x00 " % chk) if checksum == "plain" else (b"\x00%06o " % chk)
    return bytes(b)


def entry(name: str, data: bytes = b"", kind: bytes = b"0", **kw) -> bytes:
    pad = (-len(data)) % BLOCK
    return header(name, len(data), kind, **kw) + data + bytes(pad)


def pax(records: dict[str, str]) -> bytes:
    body = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + 1
        while len(str(n).encode() + rec) != n:
            n += 1
        body += str(n).encode() + rec
    return entry("PaxHeader", body, b"x")


def end() -> bytes:
    return bytes(2 * BLOCK)


@dataclass(frozen=True)
class Image:
    """An image's own entries (config, layers) without manifest.json and repositories."""
    members: tuple[tuple[str, bytes, bytes], ...]   # (name, data, kind)
    config: str
    layers: tuple[str, ...]

    def body(self) -> bytes:
        return b"".join(entry(n, d, k) for n, d, k in self.members)

    def manifest(self, tags: list[str], key: str = "RepoTags", also: tuple[str, list[str]] | None = None) -> bytes:
        item: dict = {"Config": self.config, key: tags, "Layers": list(self.layers)}
        if also:
            item[also[0]] = also[1]
        return json.dumps([item]).encode()


def minimal_image() -> Image:
    """A config and one layer (not loadable: enough for the reading before any load)."""
    layer = "0" * 64 + "/layer.tar"
    return Image((("c.json", b"{}", b"0"), ("0" * 64, b"", b"5"), (layer, bytes(1024), b"0")), "c.json", (layer,))


Build = Callable[[Image, list[str], list[str]], bytes]


def _case(f: Build, why: str, *, bypassed_before: bool = True) -> tuple[Build, str, bool]:
    return f, why, bypassed_before


# name -> (build(image, allowed tags, victim tags) -> archive, what the refusal says, whether the pre-check of
# main before issue 45 let the victim's tag through)
CASES: dict[str, tuple[Build, str, bool]] = {
    "symlink named manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("evil.json", i.manifest(bad))
        + entry("manifest.json", kind=b"2", link="evil.json") + end(), "manifest.json is a link"),
    "hard link named manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("evil.json", i.manifest(bad))
        + entry("manifest.json", kind=b"1", link="evil.json") + end(), "hard link"),
    "a/../manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("a/../manifest.json", i.manifest(bad)) + end(),
        "not written as the path it names"),
    "./a/../manifest.json after manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok))
        + entry("./a/../manifest.json", i.manifest(bad)) + end(), "not written as the path it names"),
    "./manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("./manifest.json", i.manifest(bad)) + end(),
        "not written as the path it names", bypassed_before=False),
    "second manifest.json, a v7 header with a prefix": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok))
        + entry("manifest.json", i.manifest(bad), prefix="zz", magic=bytes(8)) + end(), "not POSIX ustar"),
    "second manifest.json behind a NUL-first checksum": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok))
        + entry("manifest.json", i.manifest(bad), checksum="nul-first") + end(), "not a plain octal number"),
    "second manifest.json, plain": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok)) + entry("manifest.json", i.manifest(bad))
        + end(), "appears twice", bypassed_before=False),
    "a folder link above manifest.json": _case(
        lambda i, ok, bad: i.body() + entry("d", kind=b"2", link=".") + entry("d/manifest.json", i.manifest(bad))
        + end(), 'the link "d" points to'),
    "repotags in lower case": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(bad, key="repotags")) + end(),
        "Go's JSON field names ignore case"),
    "RepoTags, then REPOTAGS": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok, also=("REPOTAGS", bad))) + end(),
        "Go's JSON field names ignore case"),
    "RepoTag\u017f (a long s)": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(bad, key="RepoTag\u017f")) + end(),
        "Go's JSON field names ignore case"),
    "pax path naming manifest.json again": _case(
        lambda i, ok, bad: i.body() + entry("manifest.json", i.manifest(ok)) + pax({"path": "manifest.json"})
        + entry("other.json", i.manifest(bad)) + end(), "appears twice", bypassed_before=False),
    "gzip-compressed": _case(
        lambda i, ok, bad: gzip.compress(i.body() + entry("manifest.json", i.manifest(bad)) + end()),
        "gzip-compressed", bypassed_before=False),
}
