"""Issue 45, class 1, against the real engine: every archive of tests/unit/adversarial/hostile_archives.py that the
pre-check of main before issue 45 let through (a link or hard link named manifest.json, a path that cleans to it,
a second manifest.json hidden from Python's tar reader, a JSON key in another case) is refused by `ktdeploy
image load` with exit 5 and the victim's tag is unchanged; then the same archive handed to `docker load` directly
does retag the victim — each case is a live attack on this engine, not a reading of our own.

The images are two tiny `docker import`s named after this run; every tag the test makes is removed after it."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.integration.hosts import docker, docker_available
from tests.unit.adversarial.hostile_archives import CASES, Image

pytestmark = pytest.mark.docker
REPO_ROOT = Path(__file__).resolve().parents[2]


def _import(ref: str, content: bytes) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("hello")
        info.size = len(content)
        t.addfile(info, io.BytesIO(content))
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True, timeout=120)
    return docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    if not docker_available():
        pytest.skip("no docker engine reachable")
    token = secrets.token_hex(4)
    tmp = tmp_path_factory.mktemp("archives")
    ours = f"ktdeploy-sec-{token}-ours:1"
    other = f"ktdeploy-sec-{token}-other:1"
    ours_id = _import(ours, b"ours")
    other_id = _import(other, b"other")
    docker("save", "-o", str(tmp / "saved.tar"), ours)
    members = []
    with tarfile.open(tmp / "saved.tar") as t:
        for m in t:
            if m.name not in ("manifest.json", "repositories"):
                f = t.extractfile(m) if m.isfile() else None
                members.append((m.name, f.read() if f else b"", b"5" if m.isdir() else b"0"))
    config = next(n for n, _d, _k in members if n.endswith(".json") and "/" not in n)
    image = Image(tuple(members), config, tuple(n for n, _d, _k in members if n.endswith("/layer.tar")))
    made = [ours, other]
    yield {"tmp": tmp, "token": token, "image": image, "ours_id": ours_id, "other_id": other_id, "made": made,
           "other": other}
    docker("rmi", "-f", *made, check=False)


def _tag_of(ref: str) -> str | None:
    r = docker("image", "inspect", "-f", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


@pytest.mark.parametrize("case", sorted(c for c, (_b, _w, before) in CASES.items() if before))
def test_a_hostile_archive_never_retags_an_image(engine, case):
    build, why, _ = CASES[case]
    repo = f"ktdeploy-sec-{engine['token']}-repo"
    victim = f"ktdeploy-sec-{engine['token']}-victim:{abs(hash(case)) % 10_000}"
    docker("tag", engine["other"], victim)
    engine["made"].append(victim)
    archive = engine["tmp"] / "hostile.tar"
    archive.write_bytes(build(engine["image"], [f"{repo}:amx"], [victim]))
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "image", "load", str(archive), "--repo", repo],
                       capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                       env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 5 and why in " ".join(r.stderr.split()), (r.returncode, r.stdout, r.stderr[-1500:])
    assert "Traceback" not in r.stderr
    assert _tag_of(victim) == engine["other_id"], "the victim was retagged"
    # the archive is a live attack on this engine: docker load itself applies the victim's name
    direct = docker("load", "-i", str(archive), check=False)
    assert direct.returncode == 0 and _tag_of(victim) == engine["ours_id"], (direct.stdout, direct.stderr)
