"""Image build pieces that need no docker: argv, wheelhouse checks and server, variant names."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from ktdeploy.controller.images.build import (
    BuildOptions,
    commit_changes,
    find_context,
    identity_labels,
    snapshot_context,
    stage_argv,
)
from ktdeploy.controller.images.lockfile import read_lock
from ktdeploy.controller.images.tags import expand_isa, image_tags
from ktdeploy.controller.images.wheelhouse import check_wheelhouse, missing_wheels, serve
from ktdeploy.core.errors import ImageError, UsageError

ROOT = Path(__file__).resolve().parents[4]
REDUCED = read_lock(ROOT / "docker" / "requirements" / "reduced.lock")


def test_stage_argv_builds_the_stage_offline_without_the_version(tmp_path):
    opts = BuildOptions(context=ROOT, isas=["avx512_bf16"], stack="reduced", version="9.9.9")
    argv = stage_argv(opts, "deps", REDUCED, "http://127.0.0.1:38711/", tmp_path / "iid")
    assert argv[0] == "build" and argv[-1] == str(ROOT)
    assert argv[argv.index("--target") + 1] == "deps"
    assert argv[argv.index("--iidfile") + 1] == str(tmp_path / "iid")
    assert argv[argv.index("--network") + 1] == "host"
    args = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    assert "STACK=reduced" in args and f"LOCK_SHA256={REDUCED.sha256}" in args
    # The version is a label of the final commit, never a build argument (it would be a cache key).
    assert not any("VERSION" in a or "9.9.9" in a for a in args)
    assert "--no-cache" not in argv and "--force-rm" in argv
    assert "--no-cache" in stage_argv(opts, "deps", REDUCED, "u", tmp_path / "i", no_cache=True)


def test_commit_changes_give_the_variant_config_and_identity_labels():
    opts = BuildOptions(context=ROOT, isas=["avx512_bf16"], stack="reduced", version="9.9.9")
    labels = identity_labels(opts, REDUCED, "sha256:base", "ab" * 32, revision="deadbeef",
                             source="local", created="2026-01-01T00:00:00Z")
    changes = commit_changes("avx512", labels)      # the old name is the avx512_bf16 build
    assert "ENV KTSFT_VARIANT=avx512_bf16 KT_KERNEL_CPU_VARIANT=avx512_bf16" in changes
    assert "USER kt" in changes and 'CMD ["doctor"]' in changes
    (label,) = [c for c in changes if c.startswith("LABEL ")]
    for want in ('io.ktdeploy.isa="avx512_bf16"', 'org.opencontainers.image.version="9.9.9"',
                 'org.opencontainers.image.revision="deadbeef"', f'io.ktdeploy.lock.sha256="{REDUCED.sha256}"',
                 'org.opencontainers.image.base.digest="sha256:base"',
                 f'io.ktdeploy.content.manifest.sha256="{"ab" * 32}"'):
        assert want in label, want
    # A quote in a value cannot end the label early.
    odd = commit_changes("amx", {"x": 'a" b=c'})[-1]
    assert 'x="a\\" b=c"' in odd


def test_expand_isa():
    assert expand_isa("all") == ["amx", "avx512_bf16", "avx512_vbmi", "avx512_vnni", "avx512_base", "avx2"]
    assert expand_isa("avx2") == ["avx2"] and expand_isa("avx512") == ["avx512_bf16"]
    assert image_tags("ktsft", "avx512_bf16") == ["ktsft:avx512_bf16", "ktsft:avx512"]   # the old tag still works
    assert image_tags("ktsft", "avx512_vnni") == ["ktsft:avx512_vnni"]
    with pytest.raises(UsageError):
        expand_isa("sse4")


def test_find_context_is_this_checkout():
    assert find_context() == ROOT
    with pytest.raises(UsageError):
        find_context(ROOT / "tests")


def test_snapshot_holds_what_the_dockerfile_copies(tmp_path):
    snap = snapshot_context(ROOT, tmp_path)
    for rel in ("Dockerfile", "pyproject.toml", "ktdeploy/cli/image_entry.py", "docker/verify_stack.py",
                "docker/requirements/full.lock", "recipes/tiny-moe-lora.yaml"):
        assert (snap / rel).exists(), rel
    assert not list(snap.rglob("__pycache__"))
    assert not (snap / ".wheelhouse").exists()


def test_missing_wheels_named_with_the_fix(tmp_path):
    first = REDUCED.pins[0]
    (tmp_path / first.filename).write_bytes(b"not really a wheel")
    missing = missing_wheels(REDUCED, tmp_path)
    assert first.filename not in missing and len(missing) == len(REDUCED.pins) - 1
    assert f"{first.filename} (hash differs from the lock)" in missing_wheels(REDUCED, tmp_path, verify_hashes=True)
    with pytest.raises(ImageError) as err:
        check_wheelhouse(REDUCED, tmp_path, "reduced")
    assert "docker/wheelhouse.py --stack reduced" in err.value.fix


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_exposes_the_wheelhouse_on_loopback_and_stops(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    port = _free_port()
    with serve(tmp_path, port) as url:
        assert url == f"http://127.0.0.1:{port}/"
        assert urllib.request.urlopen(url + "a-1.0-py3-none-any.whl").read() == b"wheel bytes"
        assert b"a-1.0-py3-none-any.whl" in urllib.request.urlopen(url).read()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_serve_refuses_a_busy_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ImageError) as err, serve(tmp_path, s.getsockname()[1]):
            pass
    assert "--wheelhouse-port" in err.value.fix


def test_manifest_cache_is_one_folder_per_dependency_image(tmp_path, monkeypatch):
    from ktdeploy.controller.images.build import manifest_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a = manifest_cache_dir("sha256:" + "a" * 64)
    assert a == tmp_path / "ktdeploy/image-manifest" / ("a" * 64) and a.is_dir()
    (a / "manifest-cache.tsv").write_text("1 2 " + "0" * 64 + " /opt/venv/x\n")
    b = manifest_cache_dir("sha256:" + "b" * 64)
    assert b is not None and b.is_dir() and not a.exists()       # another stack: the old hashes go
    assert manifest_cache_dir("sha256:../../etc") is None           # never a path from a bad ID
