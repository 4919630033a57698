"""Image build pieces that need no docker: argv, wheelhouse checks and server, variant names."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from ktdeploy.core.errors import ImageError, UsageError
from ktdeploy.controller.images.build import BuildOptions, build_argv, find_context, snapshot_context
from ktdeploy.controller.images.lockfile import read_lock
from ktdeploy.controller.images.variants import expand_isa
from ktdeploy.controller.images.wheelhouse import check_wheelhouse, missing_wheels, serve

ROOT = Path(__file__).resolve().parents[3]
REDUCED = read_lock(ROOT / "docker" / "requirements" / "reduced.lock")


def test_build_argv_targets_the_variant_offline_with_lock_labels():
    opts = BuildOptions(context=ROOT, isas=["avx512"], stack="reduced")
    argv = build_argv(opts, "avx512", REDUCED, "http://127.0.0.1:38711/")
    assert argv[0] == "build" and argv[-1] == str(ROOT)
    assert argv[argv.index("--target") + 1] == "avx512"
    assert argv[argv.index("--tag") + 1] == "ktsft-reduced:avx512"
    assert argv[argv.index("--network") + 1] == "host"
    args = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    assert "STACK=reduced" in args and f"LOCK_SHA256={REDUCED.sha256}" in args
    assert any(a.startswith("STACK_VERSIONS=") and "pydantic=" in a for a in args)


def test_no_cache_only_where_asked():
    opts = BuildOptions(context=ROOT, isas=["amx", "avx2"], stack="reduced", no_cache=True)
    assert "--no-cache" in build_argv(opts, "amx", REDUCED, "u")
    assert "--no-cache" not in build_argv(opts, "avx2", REDUCED, "u", no_cache=False)
    assert "--force-rm" in build_argv(opts, "avx2", REDUCED, "u")


def test_expand_isa():
    assert expand_isa("all") == ["amx", "avx512", "avx2"]
    assert expand_isa("avx2") == ["avx2"]
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
        with pytest.raises(ImageError) as err:
            with serve(tmp_path, s.getsockname()[1]):
                pass
    assert "--wheelhouse-port" in err.value.fix
