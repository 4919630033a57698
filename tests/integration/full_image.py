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


def why_this_cpu_cannot_run(ref: str, *, but_amx: bool = False) -> str | None:
    """Why this machine's CPU cannot run the kt-kernel build of image ``ref`` (its io.ktdeploy.kt_kernel_variant
    label against /proc/cpuinfo's flags, as the image's entry point checks before it runs anything), or None. Tests
    that enter the image past that check (``--entrypoint python3``) and run kt-kernel's CPU code need it: the amx
    build on an AVX2-only host dies of SIGILL. ``but_amx``: code of the build that runs without AMX too (the
    online quantizer; its SFT kernels are the AMX part)."""
    from ktdeploy.core import variants as V
    from tests.integration.cpu_trains import this_cpu_flags

    got = subprocess.run(["docker", "image", "inspect", "--format",
                          '{{index .Config.Labels "io.ktdeploy.kt_kernel_variant"}}', ref],
                         capture_output=True, text=True)
    build = got.stdout.strip()
    if got.returncode != 0 or not V.known(build):
        return None
    flags = this_cpu_flags()
    missing = [f for f in V.get(build).requires if not V.has_flags(flags, f) and not (but_amx and f in V.AMX_FLAGS)]
    if missing:
        return f"this CPU ({V.detect(flags).name}) lacks {', '.join(missing)}, which {ref}'s kt-kernel {build} build needs"
    return None
