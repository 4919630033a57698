"""Slurm, pure: node lines for slurm.conf/gres.conf from doctor's facts, the parsers of sinfo / scontrol / sacct /
squeue answers, and the fit check that refuses a job no node can ever run, with ktdeploy's reasons.

Commands are argv lists (the login node runs them through the connector); every value a parser reads comes
from Slurm's own ``-o``/``-P`` formats, split on ``|``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.sched.features import node_features, node_weight, variant_features
from ktdeploy.core.sched.request import JobRequest

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MiB = 1024 * 1024


# -- a node's slurm.conf / gres.conf lines, from facts ------------------------------------------------------
@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    real_memory_mib: int
    gpus: int = 0
    features: tuple[str, ...] = ()
    weight: int = 1
    addr: str | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None

    def conf_line(self) -> str:
        """``NodeName=…`` for slurm.conf."""
        parts = [f"NodeName={self.name}"]
        if self.addr:
            parts.append(f"NodeAddr={self.addr}")
        parts.append(f"CPUs={self.cpus}")
        if self.sockets and self.cores_per_socket and self.threads_per_core:
            parts += [f"Sockets={self.sockets}", f"CoresPerSocket={self.cores_per_socket}",
                      f"ThreadsPerCore={self.threads_per_core}"]
        parts.append(f"RealMemory={self.real_memory_mib}")
        if self.gpus:
            parts.append(f"Gres=gpu:{self.gpus}")
        if self.features:
            parts.append("Features=" + ",".join(self.features))
        parts += [f"Weight={self.weight}", "State=UNKNOWN"]
        return " ".join(parts)

    def gres_line(self) -> str | None:
        """gres.conf: the node's GPUs as the NVIDIA driver's device files (Slurm allocates by file)."""
        if not self.gpus:
            return None
        files = "/dev/nvidia0" if self.gpus == 1 else f"/dev/nvidia[0-{self.gpus - 1}]"
        return f"NodeName={self.name} Name=gpu File={files}"


def node_from_facts(name: str, facts: HostFacts, *, gpus: int | None = None, addr: str | None = None) -> SlurmNode:
    """A Slurm node from doctor's facts: features from the proven CPU checks, RealMemory (the cgroup limit when
    lower), CPUs and topology, GPUs (``gpus`` when given, e.g. an inventory's count, else nvidia-smi's)."""
    if not NODE_NAME.match(name):
        raise ValueError(f"invalid Slurm node name {name!r}")
    cpu = facts.cpu
    total = facts.memory.total_bytes or 0
    limit = facts.limits.cgroup_memory_limit
    if isinstance(limit, int) and 0 < limit < total:
        total = limit
    feats = tuple(node_features(facts))
    logical = cpu.logical_cpus or 1
    topo_ok = (cpu.sockets and cpu.cores_per_socket and cpu.threads_per_core
               and cpu.sockets * cpu.cores_per_socket * cpu.threads_per_core == logical)
    return SlurmNode(name=name, addr=addr, cpus=logical, real_memory_mib=total // MiB,
                     gpus=gpus if gpus is not None else facts.gpu.count, features=feats, weight=node_weight(feats),
                     sockets=cpu.sockets if topo_ok else None, cores_per_socket=cpu.cores_per_socket if topo_ok else None,
                     threads_per_core=cpu.threads_per_core if topo_ok else None)


BASE_CONF = """\
ClusterName={cluster}
SlurmctldHost={controller}
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType={proctrack}
TaskPlugin={task}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge={min_job_age}
KillWait={kill_wait}
MpiDefault=none
"""


CGROUP_CONF = """\
CgroupPlugin=autodetect
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
"""


def cgroup_conf() -> str:
    """cgroup.conf beside slurm.conf's proctrack/cgroup and task/cgroup: every job fenced to its cores (hwloc, which
    kt-kernel pins its threads with, then sees only them), its memory and its GPUs (core/sched/cluster.py's
    slurm.cgroup asks a cluster for exactly these)."""
    return CGROUP_CONF


def slurm_conf(cluster: str, controller: str, nodes: list[SlurmNode], *, partition: str = "main",
               proctrack: str = "proctrack/cgroup", task: str = "task/cgroup,task/affinity", min_job_age: int = 3600,
               kill_wait: int = 30, extra: tuple[str, ...] = ()) -> str:
    """slurm.conf for a cluster: ktdeploy's settings (cons_tres with core+memory, GPUs as gres, jobs kept
    ``min_job_age`` seconds for `scontrol show job`), one line per node, one partition of all nodes.
    ``kill_wait``: seconds between the job's SIGTERM and SIGKILL (the batch script's trap stops its container)."""
    for n in (cluster, controller, partition):
        if not NODE_NAME.match(n):
            raise ValueError(f"invalid Slurm name {n!r}")
    text = BASE_CONF.format(cluster=cluster, controller=controller, proctrack=proctrack, task=task,
                            min_job_age=min_job_age, kill_wait=kill_wait)
    text += "".join(f"{line}\n" for line in extra)
    text += "".join(n.conf_line() + "\n" for n in nodes)
    text += f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    return text


def gres_conf(nodes: list[SlurmNode]) -> str:
    return "".join(line + "\n" for line in (n.gres_line() for n in nodes) if line)


# -- what the cluster says ------------------------------------------------------------------------------------
SINFO = ["sinfo", "--noheader", "--Node", "--format", "%N|%f|%m|%G|%c|%T|%w"]


@dataclass(frozen=True)
class ClusterNode:
    name: str
    features: tuple[str, ...]
    memory_mib: int
    gpus: int
    cpus: int
    state: str
    weight: int = 1

    @property
    def usable(self) -> bool:
        """Not down/drained/failing: a job can be placed on it (now or once it is free)."""
        return not any(s in self.state for s in ("down", "drain", "fail", "inval", "maint", "unknown"))


def _gpu_count(gres: str) -> int:
    """``gpu:2``, ``gpu:h200:4(S:0-1)``, ``gpu:2,nic:1`` -> GPUs; ``(null)`` -> 0."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _int(text: str, default: int = 0) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group(0)) if m else default


def parse_sinfo(text: str) -> list[ClusterNode]:
    """``SINFO``'s answer -> one ClusterNode per node (a node in several partitions is listed once)."""
    nodes: dict[str, ClusterNode] = {}
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) < 7 or not f[0]:
            continue
        feats = tuple(x for x in f[1].split(",") if x and x != "(null)")
        nodes.setdefault(f[0], ClusterNode(name=f[0], features=feats, memory_mib=_int(f[2]), gpus=_gpu_count(f[3]),
                                           cpus=_int(f[4]), state=f[5].strip().lower(), weight=_int(f[6], 1)))
    return list(nodes.values())


@dataclass(frozen=True)
class Fit:
    variant: str | None
    nodes: tuple[str, ...]                       # nodes that can run the job (when free)
    reasons: dict[str, list[str]] = field(default_factory=dict)   # every other node: why not


def fit(request: JobRequest, nodes: list[ClusterNode]) -> Fit:
    """Which nodes could ever run the job (features, memory, GPUs, CPUs; not current load), and why each other
    cannot. Memory is RealMemory against the planner's upper edge."""
    need = set(variant_features(request.variant)) if request.variant else set()
    ok, reasons = [], {}
    for n in nodes:
        why = []
        missing = sorted(need - set(n.features))
        if missing:
            why.append(f"lacks CPU feature {','.join(missing)} (has {','.join(n.features) or 'none'})")
        if n.memory_mib < request.mem_mib:
            why.append(f"RealMemory {n.memory_mib / 1024:.1f} GiB < {request.mem_gib:.1f} GiB")
        if n.gpus < request.gpus:
            why.append(f"{n.gpus} GPU(s) < {request.gpus}")
        if n.cpus < request.cpus:
            why.append(f"{n.cpus} CPUs < {request.cpus}")
        if not n.usable:
            why.append(f"state {n.state}")
        if why:
            reasons[n.name] = why
        else:
            ok.append(n.name)
    return Fit(variant=request.variant, nodes=tuple(ok), reasons=reasons)


def fit_check(request: JobRequest, nodes: list[ClusterNode]) -> CheckResult:
    """``slurm.fit``: pass naming the nodes that fit, or fail with every node's reasons and the knob to turn."""
    f = fit(request, nodes)
    what = (f"{request.mem_gib:.1f} GiB ({request.mem_basis}), {request.cpus} CPUs ({request.cpus_basis}), "
            f"{request.gpus} GPU(s)" + (f", CPU feature {request.constraint}" if request.constraint else ""))
    data = {"request": {"mem_mib": request.mem_mib, "cpus": request.cpus, "gpus": request.gpus,
                        "constraint": request.constraint}, "fits": list(f.nodes), "reasons": f.reasons}
    if f.nodes:
        return CheckResult(name=CheckName.SLURM_FIT, status="pass", detail=f"{what}: fits {', '.join(f.nodes)}", data=data)
    if not nodes:
        return CheckResult(name=CheckName.SLURM_FIT, status="fail", detail="sinfo lists no node", data=data,
                           fix="Check the cluster (sinfo) and the partition (deploy.scheduler.partition).")
    per_node = "; ".join(f"{n}: {', '.join(r)}" for n, r in sorted(f.reasons.items()))
    fixes = []
    if all(any("RealMemory" in r for r in rs) for rs in f.reasons.values()):
        biggest = max(n.memory_mib for n in nodes) / 1024
        fixes.append(f"the planner's upper edge needs {request.mem_gib:.1f} GiB and the largest node has "
                     f"{biggest:.1f} GiB: lower cutoff_len / per_device_train_batch_size, use INT8/AMXINT4 experts "
                     "(`ktdeploy plan RECIPE` shows each term), or add a node with more memory")
    if all(any("GPU" in r for r in rs) for rs in f.reasons.values()):
        fixes.append(f"no node has {request.gpus} GPUs: list fewer in deploy.gpus (and accelerate.num_processes)")
    if request.variant and all(any("feature" in r for r in rs) for rs in f.reasons.values()):
        fixes.append(f"no node proved {request.constraint}: use an image variant the nodes run (deploy.image: auto "
                     "picks one) or add such a node (ansible role slurm_node sets features from doctor)")
    if all(any("CPUs" in r for r in rs) for rs in f.reasons.values()):
        fixes.append("lower kt_num_threads / deploy.scheduler.cpus or deploy.reserve_cores")
    return CheckResult(name=CheckName.SLURM_FIT, status="fail", data=data,
                       detail=f"no node of the cluster can ever run this job ({what}): {per_node}",
                       fix="; ".join(fixes) or "Fix the request or the nodes named above.")


# -- a job's state ---------------------------------------------------------------------------------------------
# scontrol knows a job while it is queued, running and for MinJobAge seconds after; sacct (where accounting runs)
# after that. The script and its framing: core/markers.py JOB_SH (a cut-short answer is never "no such job").
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED")


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str                    # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... ("" unknown)
    nodes: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    reason: str = ""
    source: str = "scontrol"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == 0

    def describe(self) -> str:
        bits = [f"job {self.job_id} {self.state or 'unknown'}"]
        if self.nodes and self.nodes not in ("(null)", "None assigned"):
            bits.append(f"on {self.nodes}")
        if self.finished and self.exit_code is not None:
            bits.append(f"exit code {self.exit_code}" + (f" (signal {self.signal})" if self.signal else ""))
        if self.state == "PENDING" and self.reason and self.reason != "None":
            bits.append(f"({self.reason})")
        if self.restarts:
            bits.append(f"requeued {self.restarts}x")
        return " ".join(bits)


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.match(r"(\d+):(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_scontrol_job(text: str, job_id: str) -> JobInfo | None:
    """One ``scontrol show job --oneliner`` line -> JobInfo (None when it does not describe ``job_id``)."""
    kv: dict[str, str] = {m.group(1): m.group(2) for m in re.finditer(r"(\S+?)=(\S*)", text)}
    if kv.get("JobId") != job_id:
        return None
    code, sig = _exit(kv.get("ExitCode", ""))
    return JobInfo(job_id=job_id, state=kv.get("JobState", "").upper(), nodes=kv.get("NodeList", ""), exit_code=code,
                   signal=sig, restarts=_int(kv.get("Restarts", "0")), reason=kv.get("Reason", ""))


def parse_sacct(text: str, job_id: str) -> JobInfo | None:
    for line in text.splitlines():
        f = line.split("|")
        if len(f) >= 5 and f[0] == job_id:
            code, sig = _exit(f[3])
            state = f[1].split()[0].upper() if f[1].strip() else ""
            return JobInfo(job_id=job_id, state=state, nodes=f[2], exit_code=code, signal=sig,
                           restarts=_int(f[4]), source="sacct")
    return None


def job_from_blocks(blocks: dict[str, str], job_id: str) -> JobInfo | None:
    """markers.parse_job's blocks -> JobInfo (scontrol first, then sacct); None when neither knows the job."""
    info = parse_scontrol_job(blocks.get("scontrol", ""), job_id)
    return info if info is not None else parse_sacct(blocks.get("sacct", ""), job_id)


def squeue_by_name(name: str) -> list[str]:
    """The queued/running jobs of this name (a second ``up`` finds its job): ``JOBID|STATE`` lines."""
    return ["squeue", "--noheader", "--name", name, "--format", "%i|%T"]


def parse_squeue(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) == 2 and f[0].isdigit():
            out.append((f[0], f[1].upper()))
    return out


JOB_ID = re.compile(r"^(\d+)(;\S+)?$")


def parse_sbatch(text: str) -> str | None:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    for line in text.strip().splitlines()[-1:]:
        m = JOB_ID.match(line.strip())
        if m:
            return m.group(1)
    return None
