"""ktdeploy doctor against real containers and real SSH (test hosts from tests/integration/hosts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.controller.connectors import DockerExecConnector, connect
from ktdeploy.controller.doctor import doctor
from ktdeploy.core.errors import ConnectError
from tests.integration.hosts import machine_cpu_flags

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
# flags the test container hides: those of these three this machine has, else avx2 (an AVX2-only CPU: hiding
# an absent flag would hide nothing)
HIDDEN = tuple(f for f in ("avx512_bf16", "avx512f", "amx_tile") if f in machine_cpu_flags()) or ("avx2",)
GiB = 1024**3


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=180,
                          cwd=REPO)


def checks(report_json: dict, layer: str | None = None) -> dict:
    return {c["name"]: c for c in report_json["checks"] if layer is None or c["layer"] == layer}


@pytest.fixture(scope="module")
def plain(host_pool):
    return host_pool.start("doc-plain", docker_socket=False)


@pytest.fixture(scope="module")
def hidden(host_pool):
    return host_pool.start("doc-hidden", docker_socket=False, hide_flags=HIDDEN)


def test_doctor_inside_container_reports_truthfully(plain):
    r = cli("doctor", "--host", f"docker://{plain.container}", "--json")
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    c = checks(rep)
    assert rep["facts"]["layer"] == "container" and rep["facts"]["container"]["kind"] == "docker"
    host_flags = Path("/proc/cpuinfo").read_text()
    assert c["cpu.isa.avx512"]["status"] == ("pass" if " avx512f " in host_flags else "warn")
    if " amx_tile " not in host_flags:  # this machine: AVX512 but no AMX -> reported absent, not unusable
        assert c["cpu.amx.listed"]["status"] == "warn" and "AMX absent" in c["cpu.amx.listed"]["detail"]
        assert c["cpu.amx.tile_exec"]["status"] == "skip"
    assert rep["facts"]["probes"]["amx"]["ran"] is True
    assert c["gpu.present"]["status"] == "fail" and "--gpus all" in c["gpu.present"]["fix"]
    # docker's default seccomp profile blocks set_mempolicy without CAP_SYS_NICE (ktransformers #350)
    assert c["numa.mempolicy"]["status"] in ("warn", "fail") and "SYS_NICE" in c["numa.mempolicy"]["fix"]
    assert c["memory.shm"]["status"] == "fail" and "--shm-size" in c["memory.shm"]["fix"]


def test_hidden_flags_fail_layer_check_with_fix(hidden):
    r = cli("doctor", "--container", hidden.container, "--json")
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    lc = checks(rep)["layer.cpu_flags"]
    assert lc["status"] == "fail"
    host_flags = set(Path("/proc/cpuinfo").read_text().split())
    assert set(lc["data"]["hidden"]) == {f for f in HIDDEN if f in host_flags}
    assert "/proc/cpuinfo" in lc["fix"]
    inner = checks(rep, "container")
    # avx512f hidden from /proc/cpuinfo, yet the probe executes it: the override itself is the failure
    if " avx512f " in Path("/proc/cpuinfo").read_text():
        assert inner["cpu.isa.avx512"]["status"] == "fail" and "hides" in inner["cpu.isa.avx512"]["detail"]
    assert rep["container_facts"]["cpu"]["flags"] and "avx512_bf16" not in rep["container_facts"]["cpu"]["flags"]


def test_hidden_bf16_fails_fp8_recipe(hidden):
    r = cli("doctor", "--host", f"docker://{hidden.container}", "--recipe", "recipes/deepseek-v3-fp8-lora.yaml",
            "--json")
    assert r.returncode == 1
    c = checks(json.loads(r.stdout))
    wf = c["recipe.weight_format_vs_isa"]
    assert wf["status"] == "fail" and "avx512_bf16" in wf["detail"] and "layer.cpu_flags" in wf["fix"]
    assert "no SFT kernels" in wf["detail"] and "avx512_bf16" in wf["data"]["missing_for_training"]


def test_doctor_over_real_ssh(host_pool, plain):
    o = host_pool.ssh_options()
    r = cli("doctor", "--host", plain.target, "--ssh-key", o["key"], "--known-hosts", o["known_hosts"], "--json")
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["host"] == plain.target
    assert rep["facts"]["os"]["ID"] == "debian" and rep["facts"]["probes"]["amx"]["ran"]
    assert checks(rep)["gpu.present"]["status"] == "fail"
    table = cli("doctor", "--host", plain.target, "--ssh-key", o["key"], "--known-hosts", o["known_hosts"])
    assert table.returncode == 1 and "gpu.present" in table.stdout and "Traceback" not in table.stderr


def test_resource_flags_of_docker_run_are_seen(host_pool):
    h = host_pool.start("doc-limits", docker_socket=False,
                        extra=["--memory", "1g", "--shm-size", "2g", "--cap-add", "SYS_NICE",
                               # this engine cannot raise RLIMIT_MEMLOCK; lowering it is seen just as well
                               "--ulimit", "memlock=4194304:4194304"])
    rep = doctor(h.connect())
    assert rep.facts.limits.cgroup_memory_limit == 1 * GiB
    assert rep.facts.limits.memlock_soft == 4194304
    by = {c.name: c for c in rep.checks}
    assert by["numa.mempolicy"].status == "pass"
    assert by["memory.shm"].status == "pass"
    assert by["memory.memlock"].status == "warn" and "4 MiB" in by["memory.memlock"].detail
    assert "cgroup limit 1.0 GiB" in by["memory.host"].detail
    h.stop()


def test_probe_uploaded_static_when_host_has_no_compiler(host_pool):
    h = host_pool.start("doc-nocc", docker_socket=False)
    h.exec("sh", "-c", "rm -f /usr/bin/cc /usr/bin/gcc /usr/bin/gcc-* /usr/bin/x86_64-linux-gnu-gcc*")
    conn = h.connect()
    assert conn.run(["sh", "-c", "command -v cc || command -v gcc"]).rc != 0
    rep = doctor(conn)
    assert rep.facts.probes.amx.ran and rep.facts.probes.mempolicy.ran
    h.stop()


def test_docker_exec_connector_contract(plain, tmp_path):
    c = DockerExecConnector(plain.container)
    weird = "a b'c\"$(touch /tmp/pwned)"
    res = c.run(["printf", "%s", weird])
    assert res.rc == 0 and res.stdout == weird
    assert c.run(["sh", "-c", "test -e /tmp/pwned"]).rc == 1
    src = tmp_path / "f.txt"
    src.write_text("hello")
    c.put_file(str(src), "/tmp/ktd/x/f.txt", mode=0o600)
    assert c.run(["stat", "-c", "%a", "/tmp/ktd/x/f.txt"]).stdout.strip() == "600"
    c.get_file("/tmp/ktd/x/f.txt", str(tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_text() == "hello"
    assert c.run(["cat"], input="piped").stdout == "piped"


def test_ssh_connector_contract(plain, tmp_path):
    c = plain.connect()
    weird = "x y'z\"$(touch /tmp/pwned-ssh);`id`"
    assert c.run(["printf", "%s", weird]).stdout == weird
    assert c.run(["sh", "-c", "test -e /tmp/pwned-ssh"]).rc == 1
    res = c.run(["sh", "-c", "echo out; echo err >&2; exit 5"])
    assert (res.rc, res.stdout, res.stderr) == (5, "out\n", "err\n")
    assert c.run(["sh", "-c", "echo $FOO"], env={"FOO": "b a r"}).stdout == "b a r\n"
    assert c.run(["cat"], input="stdin data").stdout == "stdin data"
    big = c.run(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; head -c 300000 /dev/zero | tr '\\0' b >&2"])
    assert len(big.stdout) == 3000000 and len(big.stderr) == 300000
    src = tmp_path / "up.bin"
    src.write_bytes(b"\x00\x01payload")
    c.put_file(str(src), "/tmp/ktd-up/dir/up.bin", mode=0o755)
    assert c.run(["stat", "-c", "%a", "/tmp/ktd-up/dir/up.bin"]).stdout.strip() == "755"
    c.get_file("/tmp/ktd-up/dir/up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == b"\x00\x01payload"
    assert c.run(["sleep", "5"], timeout=1).rc == 124
    c.close()


def test_unreachable_host_exit_3_no_traceback(host_pool):
    h = host_pool.start("doc-gone", docker_socket=False)
    target = h.target
    h.stop()
    o = host_pool.ssh_options()
    r = cli("doctor", "--host", target, "--ssh-key", o["key"], "--known-hosts", o["known_hosts"])
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "ConnectError" in r.stderr and "Traceback" not in r.stderr + r.stdout
    with pytest.raises(ConnectError) as e:
        connect(target, **o)
    assert e.value.fix


def test_unknown_host_key_refused_unless_accepted(host_pool, tmp_path):
    h = host_pool.start("doc-newkey", docker_socket=False, record_key=False)
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    r = cli("doctor", "--host", h.target, "--ssh-key", str(host_pool.key), "--known-hosts", str(kh))
    assert r.returncode == 3 and "host key" in r.stderr.lower() and "ssh-keyscan" in r.stderr
    r = cli("doctor", "--host", h.target, "--ssh-key", str(host_pool.key), "--known-hosts", str(kh),
            "--accept-new-host-key", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["facts"]["layer"] == "container"
    assert h.address in kh.read_text()
    h.stop()


def test_remote_host_compared_with_its_container_over_ssh(host_pool, hidden):
    """--host over SSH + --container: the container is reached with `docker exec` run on that host."""
    h = host_pool.start("doc-dockerhost", docker_socket=True)
    o = host_pool.ssh_options()
    r = cli("doctor", "--host", h.target, "--ssh-key", o["key"], "--known-hosts", o["known_hosts"],
            "--container", hidden.container, "--json")
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["container_facts"]["host"].startswith(f"docker://{hidden.container}@ssh://")
    lc = checks(rep)["layer.cpu_flags"]
    host_flags = set(Path("/proc/cpuinfo").read_text().split())
    assert lc["status"] == "fail" and set(lc["data"]["hidden"]) == {f for f in HIDDEN if f in host_flags}
    assert rep["container_facts"]["probes"]["amx"]["ran"]  # probe source uploaded via SSH, then docker cp
    h.stop()
