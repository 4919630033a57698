"""docker/lock.py: turning pip's resolution report into the hash-locked file (no network here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ktdeploy.controller.images.lockfile import parse_lock

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docker"))
spec = importlib.util.spec_from_file_location("ktd_lock", ROOT / "docker" / "lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)


def item(name, version, filename, sha="a" * 64):
    return {"metadata": {"name": name, "version": version},
            "download_info": {"url": f"https://files.example/{filename}",
                              "archive_info": {"hashes": {"sha256": sha}}}}


def test_excluded_distributions_are_dropped_and_recorded():
    report = [
        item("Transformers", "5.15.1", "transformers-5.15.1-py3-none-any.whl"),
        item("transformers-kt", "5.6.0.post6", "transformers_kt-5.6.0.post6-py3-none-manylinux_2_35_x86_64.whl"),
        item("torch", "2.9.1", "torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl", sha="b" * 64),
    ]
    text = lock.lock_text("full", report, {"transformers": "the fork provides it"}, "d" * 64)
    pins = parse_lock(text)
    assert [p.name for p in pins] == ["torch", "transformers-kt"]
    assert pins[0].sha256 == "b" * 64 and pins[0].filename.startswith("torch-2.9.1-cp311")
    assert "#   transformers==5.15.1: the fork provides it" in text
    assert not any(line.startswith("transformers==") for line in text.splitlines())


def test_platform_args_cover_every_manylinux_tag_up_to_the_floor():
    args = lock.platform_args({"python_version": "3.11", "manylinux": "2_35", "arch": "x86_64"})
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux_2_36_x86_64" not in platforms and "manylinux2014_x86_64" in platforms
    assert "--only-binary=:all:" in args and args[args.index("--python-version") + 1] == "3.11"


def test_check_compares_what_gets_installed_not_the_header():
    a = "# header one\ntorch==2.9.1 \\\n    --hash=sha256:" + "a" * 64 + "  # torch.whl\n"
    b = a.replace("header one", "header two")
    assert lock.requirement_lines(a) == lock.requirement_lines(b)
    assert lock.requirement_lines(a) != lock.requirement_lines(a.replace("2.9.1", "2.9.0"))
