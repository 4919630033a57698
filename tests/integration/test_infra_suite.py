"""The testinfra readiness suite (tests/infra) run against a real container host, over SSH and docker exec."""

from __future__ import annotations

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
        if f"-{name}]" in line and line.split()[0] in ("PASSED", "FAILED", "SKIPPED", "XFAIL"):
            return line.split()[0]
    return "?"


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
    assert "test_every_check_is_known" in out and "FAILED tests/infra/test_readiness.py::test_every_check_is_known" \
        not in out
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
