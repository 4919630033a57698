"""The testinfra readiness suite (tests/infra) run against a real container host, over SSH and docker exec."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.hosts import BASE_IMAGE

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ready_host(host_pool):
    # A host as a training box should look, except that it has no GPU (and docker has no nvidia runtime).
    return host_pool.start("infra01", docker_socket=True, extra=["--shm-size", "2g", "--cap-add", "SYS_NICE"])


def suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "tests/infra", "-q", "-rA", "-p", "no:cacheprovider",
                           *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def outcome(out: str, name: str) -> str:
    for line in out.splitlines():
        if f"test_check[{name}-" in line and line.split()[0] in ("PASSED", "FAILED", "SKIPPED", "XFAIL"):
            return line.split()[0]
    return "?"


def ran_checks(out: str) -> set[str]:
    """Check names of the test_check tests in `pytest -rA` output (skips show as 'SKIPPED [1] FILE:LINE: NAME: why')."""
    name = r"([a-z_]+(?:\.[a-z_0-9]+)+)"
    return (set(re.findall(rf"^(?:PASSED|FAILED|XFAIL) \S*test_check\[{name}-", out, re.M))
            | set(re.findall(rf"^SKIPPED \[\d+\] \S*test_readiness\.py:\d+: {name}: ", out, re.M)))


def test_suite_over_ssh_fails_exactly_the_missing_gpu(ready_host, host_pool, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {host_pool.key}\n  UserKnownHostsFile {host_pool.known_hosts}\n"
                   "  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n")
    target = f"ssh://root@{ready_host.address}" + (f":{ready_host.port}" if ready_host.port != 22 else "")
    r = suite(f"--hosts={target}", f"--ssh-config={cfg}")
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    assert outcome(out, "gpu.present") == "FAILED" and "fix:" in out
    assert outcome(out, "docker.nvidia_runtime") == "FAILED"
    assert outcome(out, "cpu.isa.avx2") == "PASSED" and outcome(out, "numa.mempolicy") == "PASSED"
    assert outcome(out, "memory.shm") == "PASSED"
    assert "PASSED tests/infra/test_readiness.py::test_report_agrees_with_doctor" in out
    # the check list is doctor's: one test per check its JSON report names, on this host
    doctor = json.loads(subprocess.run([sys.executable, "-m", "ktdeploy", "doctor", "--json", "--host", target,
                                        "--ssh-key", str(host_pool.key), "--known-hosts", str(host_pool.known_hosts)],
                                       capture_output=True, text=True, timeout=300).stdout)
    assert ran_checks(out) == {c["name"] for c in doctor["checks"]}
    r = suite(f"--hosts={target}", f"--ssh-config={cfg}", "--kt-waive", "gpu.present",
              "--kt-waive", "docker.nvidia_runtime")
    assert r.returncode == 0, r.stdout[-3000:]
    assert outcome(r.stdout, "gpu.present") == "XFAIL"


def test_suite_over_docker_backend_sees_hidden_flag(host_pool):
    h = host_pool.start("infra-hidden", docker_socket=False, hide_flags=("avx2",),
                        extra=["--shm-size", "2g", "--cap-add", "SYS_NICE"])
    r = suite(f"--hosts=docker://{h.container}", "--kt-waive", "gpu.present")
    assert r.returncode == 1
    assert outcome(r.stdout, "cpu.isa.avx2") == "FAILED" and "passthrough" in r.stdout
    h.stop()


def test_suite_targets_the_image_on_the_host(ready_host, host_pool, tmp_path):
    """--kt-image: the container readiness check (`ktdeploy doctor --image`, one implementation) on the host: the
    image started with the training container's flags; the tests are the checks it reports (the host's, the
    container's layer checks and the stack probe's), with the timeout kept. The base image has Python's headers and
    no torch."""
    image = BASE_IMAGE
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {host_pool.key}\n  UserKnownHostsFile {host_pool.known_hosts}\n"
                   "  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n")
    target = f"ssh://root@{ready_host.address}" + (f":{ready_host.port}" if ready_host.port != 22 else "")
    waive = ("gpu.present", "stack.torch", "stack.judge", "docker.nvidia_runtime", "docker.memlock")
    r = suite(f"--hosts={target}", f"--ssh-config={cfg}", "--kt-image", image,
              *[a for w in waive for a in ("--kt-waive", w)], "--kt-timeout", "300")
    out = r.stdout
    d = subprocess.run([sys.executable, "-m", "ktdeploy", "doctor", "--host", target, "--image", image, "--json",
                        "--ssh-key", str(host_pool.key), "--known-hosts", str(host_pool.known_hosts),
                        "--waive", "docker.memlock"], capture_output=True, text=True, timeout=300, cwd=REPO)
    rep = json.loads(d.stdout)
    assert ran_checks(out) == {c["name"] for c in rep["checks"]}, out[-3000:]
    assert {"image.run", "stack.python_headers", "layer.cpu_flags"} <= ran_checks(out)
    assert outcome(out, "image.run") == "PASSED" and outcome(out, "stack.python_headers") == "PASSED", out[-3000:]
    assert outcome(out, "gpu.present") == "XFAIL" and outcome(out, "stack.torch") == "XFAIL", out[-3000:]
    # --ipc=host (a training flag): the container's /dev/shm is the host's 2 GiB, not docker's 64 MiB default
    assert outcome(out, "memory.shm") == "PASSED"
