"""A real Slurm cluster for the integration tier: slurmctld (also the SSH login node) and three slurmd nodes in
containers of one image (tests/slurm/Dockerfile: the sshd test host + Debian's slurm-wlm 22.05 and munge), on
the test hosts' private network, sharing this machine's docker engine (a job's `docker create` starts a sibling
container here, named by its job id) and one folder of models/data/outputs at the same path everywhere.

The nodes' slurm.conf lines come from ktdeploy: doctor's facts gathered in each node container
(``node_from_facts``: features from the proven CPU checks, RealMemory from the container's memory limit), GPUs
faked as /dev/nvidiaN device files (``KTD_FAKE_GPUS``) named in gres.conf.

    node   CPU as doctor proves it                          memory  GPUs
    amx1   this machine's CPU when it proves AMX, else the  5 GiB   2
           AMX proof recorded on the GPU machine (*)
    avx1   AMX hidden (bind-mounted /proc/cpuinfo)          4.5 GiB 1
    av2    AVX512 and AMX hidden                            4.5 GiB 1

(*) a CPU without AMX cannot prove it; then amx1's features come from ``examples/facts/gpu-h200-1gpu.json`` (the
real AMX tile multiply recorded there), its CPUs and memory from the container. The fake trainer executes no AMX
instruction, so placement is what is tested, on any CI CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ktdeploy.controller.connectors import DockerExecConnector
from ktdeploy.controller.facts_gather import gather_facts
from ktdeploy.core.checks.isa import AMX_FLAGS, AVX512_FLAGS
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.sched.features import node_features, node_weight
from ktdeploy.core.sched.slurm import SlurmNode, cgroup_conf, gres_conf, node_from_facts, slurm_conf
from tests.integration.hosts import docker, ensure_image, image_exists

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "tests" / "slurm"
RECORDED_AMX = REPO / "examples" / "facts" / "gpu-h200-1gpu.json"
# name: (flags hidden, memory limit, fake GPUs)
NODES = {"amx1": ((), "5g", 2), "avx1": (AMX_FLAGS, "4608m", 1), "av2": (AMX_FLAGS + AVX512_FLAGS, "4608m", 1)}


def ensure_slurm_image() -> str:
    """ktdeploy/slurmhost:<hash of tests/slurm and the test host image>: built once, then docker's cache."""
    base = ensure_image()
    h = hashlib.sha256(docker("image", "inspect", "--format", "{{.Id}}", base).stdout.strip().encode())
    for f in sorted(SLURM_DIR.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    ref = f"ktdeploy/slurmhost:{h.hexdigest()[:12]}"
    if not image_exists(ref):
        docker("build", "-q", "-t", ref, "--build-arg", f"BASE={base}", str(SLURM_DIR), timeout=1800)
    return ref


def recorded_amx_facts() -> HostFacts:
    data = json.loads(RECORDED_AMX.read_text())
    return HostFacts.model_validate(data.get("facts", data))


@dataclass
class Cluster:
    root: Path                       # shared folder (same path here, in every container and in the jobs' containers)
    login: object                    # TestHost: slurmctld + sshd
    nodes: dict[str, object]         # name -> TestHost
    specs: dict[str, SlurmNode]
    startup_s: float                 # containers started -> every node idle (facts + config + daemons)
    daemons_s: float                 # slurmctld/slurmd launched -> every node idle
    amx_source: str
    pool: object = field(repr=False)

    def ctl(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", self.login.container, *argv, check=check)

    def job(self, job_id: str) -> dict[str, str]:
        out = self.ctl("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait_job(self, job_id: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
                 timeout: float = 180) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job_id)
            if j.get("JobState") in states:
                return j
            assert time.monotonic() < deadline, f"job {job_id} still {j.get('JobState')} after {timeout} s: {j}"
            time.sleep(0.3)

    def containers(self, label: str) -> list[str]:
        return docker("ps", "-aq", "--filter", f"label={label}").stdout.split()


def _write_config(conf: Path, specs: list[SlurmNode]) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "munge.key").write_bytes(secrets.token_bytes(1024))
    # every job in its cgroup (each node container has its own cgroup namespace, mounted writable by
    # ktd-slurm-start); KillWait > the trap's `podman/docker stop`
    (conf / "slurm.conf").write_text(slurm_conf("ktdtest", "ctl", specs, proctrack="proctrack/cgroup",
                                                task="task/cgroup,task/affinity", kill_wait=30,
                                                extra=("SlurmctldTimeout=30", "SlurmdTimeout=30",
                                                       # a requeued job waits this long before it may start again
                                                       # (default 120 s)
                                                       "AuthInfo=cred_expire=10")))
    (conf / "cgroup.conf").write_text(cgroup_conf())     # what slurm.cgroup asks a site for
    (conf / "gres.conf").write_text(gres_conf(specs))


# A node container that can fence jobs with cgroups and run rootless podman, without --privileged (which asks for
# every capability, and some machines' docker cannot grant CAP_SYS_RESOURCE): its own cgroup namespace, SYS_ADMIN to
# mount the cgroup hierarchies writable, no seccomp filter (user namespaces), no masked /proc paths (a user
# namespace may mount a fresh /proc only where none is masked)
NODE_FLAGS = ("--cgroupns", "private", "--cap-add", "SYS_ADMIN", "--cap-add", "SYS_NICE", "--security-opt", "seccomp=unconfined",
              "--security-opt", "systempaths=unconfined", "--security-opt", "apparmor=unconfined", "-e", "KTD_CGROUP=1",
              # the fake GPUs (/dev/nvidiaN, 195:N): the container's device cgroup must allow them for slurmd's job
              # cgroups (ConstrainDevices) to grant them
              "--device-cgroup-rule", "c 195:* rwm")
KT_UID = 1000      # the test hosts' user kt (tests/hosts/Dockerfile): rootless podman's user


def start_cluster(pool) -> Cluster:
    image = ensure_slurm_image()
    root = Path(tempfile.mkdtemp(prefix=f"ktd-slurm-it-{pool.tag}-", dir="/tmp"))
    root.chmod(0o755)
    conf = root / "slurm-conf"
    for d in ("models/tiny-qwen3-moe", "data", "out", "out-kt", "images"):
        (root / d).mkdir(parents=True)
    for d in ("data", "out-kt", "images"):  # kt's jobs (rootless podman) write here (out: root's docker jobs)
        os.chown(root / d, KT_UID, KT_UID)
    shared = [str(root)]
    mount = ["-v", f"{conf}:/run/ktd-slurm:ro"]
    conf.mkdir()
    t0 = time.monotonic()
    login = pool.start("ctl", image=image, shared=shared, extra=[*mount, "--network-alias", "ctl"], docker_socket=False)
    nodes = {}
    for name, (hidden, mem, gpus) in NODES.items():
        store = root / "podman" / name         # kt's podman store: kernel overlayfs on this machine's disk
        store.mkdir(parents=True)
        os.chown(store, KT_UID, KT_UID)
        os.chown(store.parent, KT_UID, KT_UID)
        nodes[name] = pool.start(name, image=image, shared=shared, hide_flags=hidden,
                                 extra=[*mount, "--network-alias", name, "--memory", mem, "--shm-size", "1g",
                                        "-e", f"KTD_FAKE_GPUS={gpus}", *NODE_FLAGS,
                                        "-v", f"{store}:/home/kt/.local/share/containers"])
    specs, amx_source = {}, "this machine's CPU"
    for name, host in nodes.items():
        facts = gather_facts(DockerExecConnector(host.container))
        spec = node_from_facts(name, facts, gpus=NODES[name][2])
        if name == "amx1" and "amx" not in spec.features:
            feats = tuple(node_features(recorded_amx_facts()))
            spec = dataclasses.replace(spec, features=feats, weight=node_weight(feats))
            amx_source = f"recorded proof ({RECORDED_AMX.relative_to(REPO)})"
        specs[name] = spec
    _write_config(conf, list(specs.values()))
    t_daemons = time.monotonic()
    docker("exec", "-d", login.container, "ktd-slurm-start", "controller")
    for host in nodes.values():
        docker("exec", "-d", host.container, "ktd-slurm-start", "node")
    deadline = time.monotonic() + 90
    while True:
        out = docker("exec", login.container, "sinfo", "--noheader", "--Node", "--format", "%N %T", check=False).stdout
        idle = {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]}
        if idle >= set(nodes):
            break
        assert time.monotonic() < deadline, f"slurm nodes not idle after 90 s: {out}"
        time.sleep(0.3)
    now = time.monotonic()
    return Cluster(root=root, login=login, nodes=nodes, specs=specs, startup_s=now - t0, daemons_s=now - t_daemons,
                   amx_source=amx_source, pool=pool)


def stop_cluster(c: Cluster, image_repo: str) -> None:
    """Remove what the cluster's jobs left (containers labelled with a job of ours) and the shared folder."""
    ps = docker("ps", "-a", "--filter", "label=ktdeploy.output", "--format", '{{.ID}}\t{{.Label "ktdeploy.output"}}',
                check=False).stdout
    mine = [line.split("\t")[0] for line in ps.splitlines() if line.split("\t")[-1].startswith(f"{c.root}/")]
    if mine:
        docker("rm", "-f", *mine, check=False)
    for h in [c.login, *c.nodes.values()]:
        docker("rm", "-f", h.container, check=False)
    subprocess.run(["docker", "run", "--rm", "-v", f"{c.root}:{c.root}", "--entrypoint", "sh", f"{image_repo}:avx2",
                    "-c", 'rm -rf "$1"/* "$1"/.[!.]*', "-", str(c.root)], capture_output=True)
    subprocess.run(["rm", "-rf", str(c.root)], capture_output=True)
