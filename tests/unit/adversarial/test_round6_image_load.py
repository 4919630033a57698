"""Issue 45, class 1: `image load` / `up --image-tar` read an archive the way the engine does, and refuse every
archive two readers could read differently, before the engine is asked.

The engine here is a tripwire: a `docker` first on PATH that records every call (a `load` would apply the
archive's names: the test fails when one is made). tests/integration/test_image_archive_hostile.py loads the same
archives into the real engine. Against main before issue 45, the cases hostile_archives.CASES marks as bypassed
loaded with exit 0 (the real engine retagged the victim for every one)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.unit.adversarial.harness import invoke
from tests.unit.adversarial.hostile_archives import CASES, end, entry, minimal_image

REPO = "ktdeploy-sec-ok"
VICTIM = "ubuntu:22.04"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def tripwire(tmp_path, monkeypatch):
    """A `docker` that records its argv (one JSON line per call) and answers as an engine that loaded nothing."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "docker-calls.jsonl"
    (bindir / "docker").write_text("#!/usr/bin/env python3\nimport json, sys\n"
                                   f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _calls(calls: Path) -> list[list[str]]:
    return [json.loads(ln) for ln in calls.read_text().splitlines()] if calls.exists() else []


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_archive_read_two_ways_is_refused_before_the_engine_sees_it(tmp_path, tripwire, case):
    build, why, _bypassed_before = CASES[case]
    (tmp_path / "a.tar").write_bytes(build(minimal_image(), [f"{REPO}:amx"], [VICTIM]))
    rc, out, secs = invoke(["image", "load", "a.tar", "--repo", REPO], cwd=tmp_path)
    assert not [c for c in _calls(tripwire) if "load" in c], f"the engine was asked to load it: {out[-800:]}"
    assert rc == 5 and why in _flat(out) and "nothing was loaded" in _flat(out), (rc, out[-1500:])
    assert "Traceback" not in out and secs < 10


@pytest.mark.parametrize("case", sorted(CASES))
def test_up_refuses_the_same_image_tar_before_anything_is_recorded(tmp_path, tripwire, monkeypatch, case):
    from tests.unit.adversarial.test_hostile_outputs import TINY

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    build, why, _ = CASES[case]
    (tmp_path / "a.tar").write_bytes(build(minimal_image(), ["ktsft:amx"], [VICTIM]))
    (tmp_path / "r.yaml").write_text(TINY)
    rc, out, _secs = invoke(["up", "--host", "gpu01", "--image-tar", "a.tar", "r.yaml"], cwd=tmp_path)
    assert rc == 5 and why in _flat(out), (rc, out[-1500:])
    assert not (tmp_path / "home" / "runs").exists() and not _calls(tripwire)


def _docker_save_layout(tmp_path: Path, *, dedup_link: bool) -> Path:
    """What docker save (engine 20.10) writes, made with Python's tarfile: config, one folder per layer (VERSION,
    json, layer.tar; a layer stored twice is a relative link to the first), manifest.json, repositories."""
    a, b = "a" * 64, "b" * 64
    items: list[tuple[tarfile.TarInfo, bytes]] = []

    def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data)
        items.append((info, data))

    add("c" * 64 + ".json", b"{}")
    for layer in (a, b):
        add(layer, kind=tarfile.DIRTYPE)
        add(f"{layer}/VERSION", b"1.0")
        add(f"{layer}/json", b"{}")
    add(f"{a}/layer.tar", bytes(2048))
    if dedup_link:
        add(f"{b}/layer.tar", kind=tarfile.SYMTYPE, link=f"../{a}/layer.tar")
    else:
        add(f"{b}/layer.tar", bytes(1024))
    add("manifest.json", json.dumps([{"Config": "c" * 64 + ".json", "RepoTags": [f"{REPO}:amx"],
                                      "Layers": [f"{a}/layer.tar", f"{b}/layer.tar"]}]).encode())
    add("repositories", json.dumps({REPO: {"amx": b}}).encode())
    path = tmp_path / "saved.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for info, data in items:
            t.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


@pytest.mark.parametrize("dedup_link", [False, True])
def test_what_docker_save_writes_still_loads(tmp_path, tripwire, dedup_link):
    """The strict reading keeps what the engine itself writes: a layer saved twice is a relative link to the first
    copy (moby's tarexport), and that link is fine."""
    from ktdeploy.controller.images.archive import archive_tags

    path = _docker_save_layout(tmp_path, dedup_link=dedup_link)
    assert archive_tags(path) == {f"{REPO}:amx"}
    rc, out, _ = invoke(["image", "load", str(path), "--repo", REPO], cwd=tmp_path)
    assert [c for c in _calls(tripwire) if c[:1] == ["load"]] == [["load", "--input", str(path)]], out


@pytest.mark.parametrize("link,why", [("/etc/passwd", "not to a file of the archive"),
                                      ("../../x", "not to a file of the archive"),
                                      ("manifest.json", "not to a file of the archive")])
def test_links_out_of_the_archive_or_to_its_index_are_refused(tmp_path, link, why):
    from ktdeploy.controller.images.archive import archive_tags
    from ktdeploy.core.errors import ImageError

    img = minimal_image()
    data = img.body() + entry("manifest.json", img.manifest([f"{REPO}:amx"])) + entry("x/layer.tar", kind=b"2", link=link)
    (tmp_path / "a.tar").write_bytes(data + end())
    with pytest.raises(ImageError, match="nothing was loaded") as err:
        archive_tags(tmp_path / "a.tar")
    assert why in err.value.message


def test_an_engine_that_applies_another_name_after_all_is_reported(tmp_path, monkeypatch):
    """Belt and braces: should the engine ever apply a name the reading did not find, `image load` says so (exit 5)
    instead of "loaded"."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text("#!/bin/sh\necho 'Loaded image: ubuntu:22.04'\n")
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    path = _docker_save_layout(tmp_path, dedup_link=False)
    rc, out, _ = invoke(["image", "load", str(path), "--repo", REPO], cwd=tmp_path)
    assert rc == 5 and "ubuntu:22.04" in out and "check did not find" in _flat(out), out[-800:]
