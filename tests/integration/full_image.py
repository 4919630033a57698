"""The full ktsft image for the tests that run sglang-kt's own code (test_serve_args_image.py,
test_serve_oracle_image.py): the first of a test's candidate tags present on this engine whose python finds
sglang; where there is none those tests skip (CI builds only the reduced images, which carry no sglang-kt)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

HAS_SGLANG = "import importlib.util as u; print(bool(u.find_spec('sglang')))"


def find_full_image(candidates: tuple[str, ...]) -> str | None:
    if shutil.which("docker") is None:
        return None
    for ref in candidates:
        if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0:
            continue
        probe = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c",
                                HAS_SGLANG], capture_output=True, text=True, timeout=300)
        if probe.stdout.strip() == "True":
            return ref
    return None


def full_image_or_skip(candidates: tuple[str, ...]) -> str:
    ref = find_full_image(candidates)
    if ref is None:
        pytest.skip("no full ktsft image with sglang-kt on this machine (build it: ktdeploy image build --stack full)")
    return ref
