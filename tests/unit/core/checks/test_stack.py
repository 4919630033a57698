"""The image stack probe (core/facts/stack_probe.py) and its checks (core/checks/stack.py), from recorded outputs.

base-headers-no-torch.txt and ktsft-no-gpu.txt are the probe's real output on this machine (ktdeploy/base:bookworm,
ktsft:amx without a GPU); the GPU outcomes (gpu-*.txt, cuda-*.txt, triton-*.txt) are in the probe's format with
the errors torch / Triton give (a GPU host is needed to record them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.checks.stack import stack_checks
from ktdeploy.core.facts.stack_probe import MARKER, STACK_PROBE, parse_stack_output, probe_argv

DATA = Path(__file__).resolve().parent / "data" / "stack"


def verdicts(name: str, rc: int = 0, stderr: str = "") -> dict:
    facts = parse_stack_output((DATA / name).read_text() if name else "", rc, stderr)
    return {c.name: c for c in stack_checks(facts)}


def status(checks: dict) -> dict:
    return {n: c.status for n, c in checks.items()}


def test_headers_present_no_torch():
    c = verdicts("base-headers-no-torch.txt")
    assert status(c) == {"stack.probe": "pass", "stack.python_headers": "pass", "stack.torch": "fail",
                         "stack.cuda": "skip", "stack.triton": "skip"}
    assert "/usr/include/python3.11/Python.h" in c["stack.python_headers"].detail
    assert "No module named 'torch'" in c["stack.torch"].detail
    assert all(x.layer == "container" for x in c.values())


def test_ktsft_without_gpu_fails_cuda_and_triton_with_the_reason():
    c = verdicts("ktsft-no-gpu.txt")
    assert status(c) == {"stack.probe": "pass", "stack.python_headers": "pass", "stack.torch": "pass",
                         "stack.cuda": "fail", "stack.triton": "fail"}
    assert "2.9.1+cu128" in c["stack.torch"].detail and "12.8" in c["stack.torch"].detail
    assert "Found no NVIDIA driver" in c["stack.cuda"].detail and "--waive stack.cuda" in c["stack.cuda"].fix
    assert "CUDA is not available" in c["stack.triton"].detail and "--waive stack.triton" in c["stack.triton"].fix


def test_gpu_host_all_pass():
    c = verdicts("gpu-ok.txt")
    assert set(status(c).values()) == {"pass"}
    assert "NVIDIA H200" in c["stack.cuda"].detail and c["stack.cuda"].data["device_count"] == 1


def test_headers_absent_fail_the_header_check_and_triton_with_the_dev_package_fix():
    c = verdicts("gpu-no-headers.txt")
    assert c["stack.python_headers"].status == "fail"
    assert "python3.11-dev" in c["stack.python_headers"].fix and "ktdeploy image build" in c["stack.python_headers"].fix
    assert "driver.c" in c["stack.python_headers"].detail
    assert c["stack.triton"].status == "fail" and "python3.11-dev" in c["stack.triton"].fix


def test_cuda_error_driver_too_old():
    c = verdicts("cuda-driver-too-old.txt")
    assert c["stack.cuda"].status == "fail" and "too old" in c["stack.cuda"].detail
    assert "gpu.driver" in c["stack.cuda"].fix   # the driver check on nvidia-smi facts is gpu.driver, not repeated
    assert c["stack.triton"].status == "fail"


def test_cuda_sees_fewer_gpus_than_given():
    c = verdicts("cuda-fewer-gpus.txt")
    assert c["stack.cuda"].status == "fail" and "sees 1 GPU(s), the container was given 2" in c["stack.cuda"].detail


def test_triton_error_timeout():
    c = verdicts("triton-timeout.txt")
    assert c["stack.cuda"].status == "pass" and c["stack.triton"].status == "fail"
    assert "within 240 s" in c["stack.triton"].detail and "python3.11-dev" not in c["stack.triton"].fix


def test_no_report_python_missing():
    c = verdicts("", 127, (DATA / "no-python.stderr").read_text())
    assert c["stack.probe"].status == "fail" and "python3 is not in the image" in c["stack.probe"].detail
    assert {c[n].status for n in c if n != "stack.probe"} == {"skip"}


@pytest.mark.parametrize("out", ["KTDEPLOY_STACK {not json", "KTDEPLOY_STACK [1]", "noise\n"])
def test_unreadable_report(out):
    f = parse_stack_output(out, 0, "")
    assert not f.ran and f.error


def test_probe_is_stdlib_python_that_prints_the_marker():
    argv = probe_argv(2)
    assert argv[0] == "python3" and argv[1] == "-c" and argv[3:] == ["2", "240"]
    compile(STACK_PROBE, "<stack probe>", "exec")
    assert MARKER in STACK_PROBE and "signal.alarm" in STACK_PROBE  # the Triton step is bounded in the image too
