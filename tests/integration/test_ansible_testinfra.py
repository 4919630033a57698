"""The testinfra readiness suite (tests/infra) over a fleet, hosts in parallel (pytest-xdist), addressed
through the ansible inventory or a --hosts list: each host gets its own verdict per doctor check.

Two sshd test hosts: ti-ok (configured like a training box: --shm-size, SYS_NICE) and ti-smallshm (docker's
64 MiB /dev/shm, which doctor's memory.shm refuses). No GPU here, so gpu.present/docker.nvidia_runtime are waived.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.test_ansible_fleet import HEALTHY, write_inventory

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
WAIVE = ["--kt-waive", "gpu.present", "--kt-waive", "docker.nvidia_runtime"]


@pytest.fixture(scope="module")
def two_hosts(host_pool, tmp_path_factory):
    pytest.importorskip("xdist")
    tmp = tmp_path_factory.mktemp("testinfra-fleet")
    hosts = {"ti-ok": (host_pool.start("ti-ok", extra=HEALTHY, docker_socket=False), {}),
             "ti-smallshm": (host_pool.start("ti-smallshm", extra=["--cap-add", "SYS_NICE"], docker_socket=False), {})}
    inv = write_inventory(tmp / "inventory.yml", host_pool, hosts)
    ssh_config = tmp / "ssh_config"
    ssh_config.write_text(f"Host *\n  IdentityFile {host_pool.key}\n  UserKnownHostsFile {host_pool.known_hosts}\n"
                          "  StrictHostKeyChecking yes\n  ConnectTimeout 10\n")
    return {"tmp": tmp, "inv": inv, "ssh_config": ssh_config, "hosts": {k: v[0] for k, v in hosts.items()}}


def suite(tmp: Path, name: str, *args: str):
    """Run tests/infra with -n 2; returns {(host, check): (outcome, message)} from the JUnit XML."""
    xml = tmp / f"{name}.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "tests/infra",
                        f"--junitxml={xml}", *WAIVE, *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"))
    assert xml.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    res = {}
    for case in ET.parse(xml).iter("testcase"):
        name_ = case.get("name", "")
        if not name_.startswith("test_check["):
            continue
        param = name_[len("test_check["):-1]
        check, host = param.split("-", 1)   # test_check[CHECK-HOST]: the checks are doctor's, parametrized first
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, msg = tag, (el.get("message") or "") + (el.text or "")
        res[(host, check)] = (outcome, msg)
    return res, p


def by_host(res, fragment: str) -> dict[str, tuple[str, str]]:
    return {check: v for (host, check), v in res.items() if fragment in host}


def test_suite_over_the_ansible_inventory_in_parallel(two_hosts):
    res, p = suite(two_hosts["tmp"], "ansible", f"--ansible-inventory={two_hosts['inv']}",
                   "--hosts=ansible://ktdeploy_fleet")
    ok, small = by_host(res, "ti-ok"), by_host(res, "ti-smallshm")
    assert ok and small, p.stdout[-3000:]
    assert ok["memory.shm"][0] == "passed", ok["memory.shm"]
    assert small["memory.shm"][0] == "failure" and "--shm-size" in small["memory.shm"][1], small["memory.shm"]
    for h in (ok, small):
        assert h["gpu.present"][0] == "skipped" and "waived" in h["gpu.present"][1]   # xfail in JUnit
        assert h["cpu.variant"][0] == "passed"
    assert not [c for c, (o, _) in ok.items() if o in ("failure", "error")], ok
    assert "bringing up nodes" in p.stdout, p.stdout[-2000:]  # pytest-xdist workers ran the hosts


def test_suite_over_a_hosts_list(two_hosts):
    hosts = ",".join(f"ssh://root@{h.address}:{h.port}" for h in two_hosts["hosts"].values())
    res, p = suite(two_hosts["tmp"], "ssh", f"--hosts={hosts}", f"--ssh-config={two_hosts['ssh_config']}")
    small_addr = two_hosts["hosts"]["ti-smallshm"]
    small = by_host(res, f"{small_addr.address}:{small_addr.port}" if small_addr.port != 22 else small_addr.address)
    assert len({h for h, _ in res}) == 2, sorted(res)[:5]
    assert small["memory.shm"][0] == "failure" and "--shm-size" in small["memory.shm"][1]


def test_suite_honours_the_inventory_host_vars(two_hosts):
    """Through the inventory, a host's own ktdeploy_waive_checks (ktdeploy.core.host_settings, as the fleet's preflight
    reads it) applies to that host only: ti-smallshm accepts its small /dev/shm, ti-ok is unaffected."""
    from tests.integration.test_ansible_fleet import write_inventory

    pool = two_hosts["hosts"]["ti-ok"].pool
    inv = write_inventory(two_hosts["tmp"] / "inventory-vars.yml", pool, {
        "ti-ok": (two_hosts["hosts"]["ti-ok"], {}),
        "ti-smallshm": (two_hosts["hosts"]["ti-smallshm"],
                        {"ktdeploy_waive_checks": ["gpu.present", "docker.nvidia_runtime", "memory.shm"]})})
    res, p = suite(two_hosts["tmp"], "hostvars", f"--ansible-inventory={inv}", "--hosts=ansible://ktdeploy_fleet")
    ok, small = by_host(res, "ti-ok"), by_host(res, "ti-smallshm")
    assert small["memory.shm"][0] == "skipped" and "waived" in small["memory.shm"][1], small["memory.shm"]
    assert ok["memory.shm"][0] == "passed"
    assert p.returncode == 0, p.stdout[-3000:]
