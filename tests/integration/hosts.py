"""Test hosts: containers running sshd on a private docker network, for every integration tier that needs
"a machine" (doctor --host, ktdeploy up, the ansible fleet, testinfra).

Use through the session fixture ``host_pool`` (defined here; tests/integration/conftest.py re-exports it):

    def test_x(host_pool):                    # session-scoped HostPool
        h = host_pool.start("gpu01")          # -> TestHost
        h.target                              # "ssh://root@172.18.0.3:22" (or 127.0.0.1:<published port>)
        h.connect()                           # a ktdeploy SSHConnector (key + known_hosts of this session)
        host_pool.ssh_options()               # {"key": path, "known_hosts": path} for connect() and SshOptions(**...) of up/up-slurm
        host_pool.known_hosts, host_pool.key  # the files themselves (public key: key + ".pub")

``start(name, *, shared=(), extra=(), docker_socket=True, record_key=True, hide_flags=(), cpuinfo=None,
user="root")``:
  shared         paths of this machine bind-mounted at the same path (models/data/outputs the host's
                 docker engine — this machine's — mounts into training containers);
  extra          more `docker run` arguments (--memory 2g, --cap-add SYS_NICE, --shm-size 2g, --tmpfs ...);
  docker_socket  mount this machine's /var/run/docker.sock, so the host drives this machine's docker;
  record_key     False leaves the host key out of known_hosts (unknown-host-key tests);
  hide_flags     flags removed from a copy of this machine's /proc/cpuinfo that is bind-mounted read-only
                 over the container's /proc/cpuinfo (what a layer hiding a flag looks like);
  cpuinfo        a whole cpuinfo text to mount instead.
``h.stop()`` stops one host (unreachable-host tests); everything is removed at session end.

The image ktdeploy/testhost:<hash of tests/hosts> (tests/hosts/Dockerfile, FROM ktdeploy/base:bookworm) is built
once when missing — its tag names its sources, so a tag left on the engine by an older checkout is never taken
for this one's; the base comes from docker/base/build-base.sh. Hosts are reached by their IP on the private network
when this machine can route to it, else through a port published on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _sources_tag(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


IMAGE = os.environ.get("KTDEPLOY_TESTHOST_IMAGE", f"ktdeploy/testhost:{_sources_tag(REPO / 'tests' / 'hosts')}")
BASE_IMAGE = os.environ.get("KTDEPLOY_BASE_IMAGE", "ktdeploy/base:bookworm")


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def docker_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", ref, check=False).returncode == 0


def ensure_image() -> str:
    """Build the test host image IMAGE (and the base image) if missing. Returns the image ref."""
    if image_exists(IMAGE):
        return IMAGE
    if not image_exists(BASE_IMAGE):
        subprocess.run([str(REPO / "docker" / "base" / "build-base.sh"), BASE_IMAGE], check=True)
    docker("build", "-t", IMAGE, "--build-arg", f"BASE={BASE_IMAGE}", str(REPO / "tests" / "hosts"), timeout=1800)
    return IMAGE


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class TestHost:
    name: str
    container: str
    address: str
    port: int
    user: str
    pool: HostPool = field(repr=False)

    __test__ = False  # not a pytest test class

    @property
    def target(self) -> str:
        return f"ssh://{self.user}@{self.address}:{self.port}"

    ssh_target = target

    def connect(self, **opts):
        from ktdeploy.controller.connectors import connect

        return connect(self.ssh_target, key=str(self.pool.key), known_hosts=str(self.pool.known_hosts), **opts)

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", self.container, *argv, check=check)

    def stop(self) -> None:
        docker("stop", "-t", "1", self.container, check=False)


class HostPool:
    """Starts and tears down test hosts; one per pytest session."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex[:8]
        self.prefix = os.environ.get("KTDEPLOY_TEST_PREFIX", "ktd")   # who made them, where engines are shared
        self.network = f"{self.prefix}-test-{self.tag}"
        self.key = self.workdir / "id_ed25519"
        self.known_hosts = self.workdir / "known_hosts"
        self.hosts: list[TestHost] = []
        self._network_ready = False
        self._route_to_ips: bool | None = None
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ktdeploy-test-{self.tag}",
                        "-f", str(self.key)], check=True)
        self.known_hosts.write_text("")

    def _ensure_network(self) -> None:
        if not self._network_ready:
            docker("network", "create", "--label", "ktdeploy-test=1", self.network)
            self._network_ready = True

    def ssh_options(self) -> dict[str, str]:
        return {"key": str(self.key), "known_hosts": str(self.known_hosts)}

    def start(self, name: str, *, shared=(), extra=(), docker_socket: bool = True, record_key: bool = True,
              hide_flags=(), cpuinfo: str | None = None, user: str = "root", image: str | None = None) -> TestHost:
        image = image or ensure_image()
        self._ensure_network()
        container = f"{self.prefix}-{self.tag}-{name}"
        args = ["run", "-d", "--name", container, "--hostname", name, "--network", self.network,
                "--label", "ktdeploy-test=1", "-e", f"AUTHORIZED_KEY={Path(str(self.key) + '.pub').read_text().strip()}",
                "-p", "127.0.0.1::22"]
        if hide_flags or cpuinfo is not None:
            text = cpuinfo if cpuinfo is not None else hide_cpu_flags(Path("/proc/cpuinfo").read_text(), hide_flags)
            path = self.workdir / f"cpuinfo-{name}"
            path.write_text(text)
            args += ["-v", f"{path}:/proc/cpuinfo:ro"]
        if docker_socket:
            args += ["-v", "/var/run/docker.sock:/var/run/docker.sock"]
        for path in shared:
            args += ["-v", f"{path}:{path}"]
        args += [*extra, image]
        docker(*args)
        address, port = self._address(container)
        deadline = time.monotonic() + 60
        while not _port_open(address, port):
            if time.monotonic() > deadline:
                logs = docker("logs", "--tail", "20", container, check=False)
                raise RuntimeError(f"test host {name} did not start sshd: {logs.stdout}{logs.stderr}")
            time.sleep(0.3)
        if record_key:
            self._record_host_key(address, port)
        host = TestHost(name=name, container=container, address=address, port=port, user=user, pool=self)
        self.hosts.append(host)
        return host

    def _address(self, container: str) -> tuple[str, int]:
        ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).stdout.strip()
        published = docker("port", container, "22/tcp").stdout.strip().splitlines()[0]
        port = int(published.rsplit(":", 1)[1])
        if self._route_to_ips is None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (_port_open(ip, 22) or _port_open("127.0.0.1", port)):
                time.sleep(0.3)
            self._route_to_ips = _port_open(ip, 22)
        return (ip, 22) if self._route_to_ips else ("127.0.0.1", port)

    def _record_host_key(self, address: str, port: int) -> None:
        # A stopped host's IP is reused by the next one: forget whatever key that address had.
        entry = address if port == 22 else f"[{address}]:{port}"
        subprocess.run(["ssh-keygen", "-R", entry, "-f", str(self.known_hosts)], capture_output=True)
        for _ in range(20):
            p = subprocess.run(["ssh-keyscan", "-p", str(port), "-t", "ed25519", address], capture_output=True,
                               text=True, timeout=15)
            if p.stdout.strip():
                with open(self.known_hosts, "a") as f:
                    f.write(p.stdout)
                return
            time.sleep(0.3)
        raise RuntimeError(f"no host key from {address}:{port}")

    def close(self) -> None:
        for h in self.hosts:
            docker("rm", "-f", h.container, check=False)
        if self._network_ready:
            docker("network", "rm", self.network, check=False)


@pytest.fixture(scope="session")
def host_pool(tmp_path_factory):
    """Session-wide HostPool; skips the test when no docker engine is reachable."""
    if not docker_available():
        pytest.skip("no docker engine reachable")
    pool = HostPool(tmp_path_factory.mktemp("testhosts"))
    try:
        yield pool
    finally:
        pool.close()


def hide_cpu_flags(cpuinfo: str, flags) -> str:
    """Remove ``flags`` from every processor's flags line (what a container/VM layer hiding them shows)."""
    drop = set(flags)
    out = []
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            head, rest = line.split(":", 1)
            line = head + ": " + " ".join(f for f in rest.split() if f not in drop)
        out.append(line)
    return "\n".join(out) + "\n"


def machine_cpu_flags() -> set[str]:
    """This machine's CPU flags (test hosts share its CPU; a hidden flag is only hidden where it exists)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def variant_without_amx() -> str:
    """The kt-kernel build a test host with AMX hidden resolves to here (CI machines differ: AMX Xeons, AVX512
    without AMX, and AVX2-only EPYCs all run this tier)."""
    from ktdeploy.core.checks.isa import AMX_FLAGS, best_variant
    from ktdeploy.core.facts.host import CpuFacts

    best = best_variant(CpuFacts(flags=sorted(machine_cpu_flags() - set(AMX_FLAGS))))
    assert best is not None, "this machine lists no AVX2"
    return best
