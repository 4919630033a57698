"""gpu.driver: the NVIDIA driver is new enough for the image's CUDA 12.8 wheels (pure, from nvidia-smi)."""

from __future__ import annotations

import pytest

from ktdeploy.core.checks.resources import gpu_driver_check
from ktdeploy.core.facts.gpu import build_gpu
from ktdeploy.core.facts.host import HostFacts


def facts(smi: str | None, rc: int | None = 0) -> HostFacts:
    f = HostFacts()
    f.gpu = build_gpu(smi, rc)
    return f


@pytest.mark.parametrize("driver,status", [
    ("570.133.20", "pass"),   # the GPU machine's driver (H200)
    ("570.26", "pass"),
    ("550.54.15", "warn"),    # minor-version compatibility only
    ("525.60.13", "warn"),
    ("525.60.11", "fail"),
    ("470.256.02", "fail"),
    ("weird", "warn"),
])
def test_driver_version_against_cuda_12_8(driver, status):
    r = gpu_driver_check(facts(f"0, NVIDIA H200, 143771, 0, {driver}, GPU-1\n"))
    assert r.status == status, r
    assert r.name == "gpu.driver"
    if status == "fail":
        assert "570.26" in r.fix and driver in r.detail


def test_no_gpu_is_skipped_with_the_reason():
    for f in (facts(None, 127), facts(None, None), facts("", 0)):
        r = gpu_driver_check(f)
        assert r.status == "skip" and r.detail.startswith("skipped: no GPU")
