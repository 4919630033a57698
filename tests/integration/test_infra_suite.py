"""The testinfra readiness suite (tests/infra) run against a real container host, over SSH and docker exec."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    """--kt-image: doctor runs inside the image on the host, started with the training container's flags; the tests
    are the checks the image's doctor reports (as the container sees the machine), with the timeout kept."""
    image = "ktsft-reduced:avx2"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        b = subprocess.run(["bash", str(REPO / "docker" / "ci-build-reduced.sh")], capture_output=True, text=True,
                           timeout=1500, cwd=REPO)
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  IdentityFile {host_pool.key}\n  UserKnownHostsFile {host_pool.known_hosts}\n"
                   "  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n")
    target = f"ssh://root@{ready_host.address}" + (f":{ready_host.port}" if ready_host.port != 22 else "")
    r = suite(f"--hosts={target}", f"--ssh-config={cfg}", "--kt-image", image, "--kt-waive", "gpu.present",
              "--kt-timeout", "300")
    out = r.stdout
    inside = json.loads(subprocess.run(["docker", "run", "--rm", "--network", "none", "--ipc=host", "--cap-add",
                                        "SYS_NICE", image, "doctor", "--json"], capture_output=True, text=True,
                                       timeout=300).stdout)
    assert inside["facts"]["layer"] == "container"
    assert ran_checks(out) == {c["name"] for c in inside["checks"]}, out[-3000:]
    assert outcome(out, "gpu.present") == "XFAIL" and outcome(out, "cpu.variant") == "PASSED", out[-3000:]
    # the 64 MiB default /dev/shm is what a container gets without --ipc=host: the flags made it the host's
    assert outcome(out, "memory.shm") == "PASSED"
