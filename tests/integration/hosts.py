"""Test hosts for the integration tier: containers running sshd (tests/hosts/Dockerfile) on a private docker
network, reached over real SSH with a generated key and a known_hosts file (host keys are checked).

    pool = HostPool.create(tmp_dir)              # network + keypair + known_hosts
    h = pool.start("fresh", docker_socket=True, shared=[volumes_root])
    h.target        -> "ssh://root@172.x.y.z:22"
    h.stop()        -> the host goes away (unreachable-host tests)
    pool.close()    -> every container and the network removed

``docker_socket=True`` mounts this machine's docker socket: the host's docker CLI drives this machine's engine,
so `docker run` paths are resolved HERE; ``shared`` folders are bind-mounted at the same path so both views agree.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HOST_IMAGE = "ktdeploy/testhost:latest"
HOSTS_DIR = Path(__file__).resolve().parent.parent / "hosts"
DOCKER_SOCKET = "/var/run/docker.sock"


def docker(*args, check=True, timeout=300) -> subprocess.CompletedProcess:
    p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} failed: {p.stderr.strip()[-800:]}")
    return p


def have_docker() -> bool:
    try:
        return docker("info", check=False, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def build_host_image() -> str:
    if docker("image", "inspect", HOST_IMAGE, check=False).returncode == 0:
        return HOST_IMAGE
    cli = shutil.which("docker")
    with tempfile.TemporaryDirectory() as ctx:
        for f in ("Dockerfile", "entrypoint.sh"):
            shutil.copy(HOSTS_DIR / f, ctx)
        shutil.copy(os.path.realpath(cli), Path(ctx) / "docker")
        docker("build", "-q", "-t", HOST_IMAGE, ctx, timeout=900)
    return HOST_IMAGE


@dataclass
class TestHost:
    name: str
    container: str
    ip: str
    port: int = 22

    @property
    def target(self) -> str:
        return f"ssh://root@{self.ip}:{self.port}"

    def exec(self, *argv: str, check=True) -> subprocess.CompletedProcess:
        return docker("exec", self.container, *argv, check=check)

    def stop(self) -> None:
        docker("rm", "-f", self.container, check=False)


@dataclass
class HostPool:
    root: Path
    network: str
    key: Path
    known_hosts: Path
    hosts: list[TestHost] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path) -> "HostPool":
        build_host_image()
        root.mkdir(parents=True, exist_ok=True)
        key = root / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        net = f"ktd-test-{secrets.token_hex(4)}"
        docker("network", "create", "--internal", net)
        kh = root / "known_hosts"
        kh.write_text("")
        return cls(root, net, key, kh)

    def ssh_options(self) -> dict:
        return {"key": str(self.key), "known_hosts": str(self.known_hosts)}

    def start(self, name: str, *, docker_socket: bool = True, shared: list[str] = (), record_key: bool = True,
              extra: list[str] = ()) -> TestHost:
        container = f"{self.network}-{name}"
        args = ["run", "-d", "--name", container, "--network", self.network, "--hostname", name,
                "-e", f"AUTHORIZED_KEY={(self.key.with_suffix('.pub')).read_text().strip()}"]
        if docker_socket:
            args += ["-v", f"{DOCKER_SOCKET}:{DOCKER_SOCKET}"]
        for s in shared:
            args += ["-v", f"{s}:{s}"]
        args += [*extra, HOST_IMAGE]
        docker(*args)
        ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).stdout.strip()
        host = TestHost(name, container, ip)
        self.hosts.append(host)
        self._wait_ssh(host)
        if record_key:
            pub = host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
            with open(self.known_hosts, "a") as f:
                f.write(f"{ip} {pub[0]} {pub[1]}\n")
        return host

    @staticmethod
    def _wait_ssh(host: TestHost, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((host.ip, host.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"sshd on {host.container} did not come up")

    def close(self) -> None:
        for h in self.hosts:
            h.stop()
        docker("network", "rm", self.network, check=False)


@pytest.fixture(scope="module")
def host_pool(tmp_path_factory):
    if not have_docker():
        pytest.skip("no docker engine")
    pool = HostPool.create(tmp_path_factory.mktemp("hosts"))
    yield pool
    pool.close()
