"""What a Slurm cluster offers a job, read on its login node (pure: the probe script and its parser), and the two
checks on it: ``slurm.runtime`` (the container runtime the job starts the image with) and ``slurm.cgroup`` (the job's
cgroup fences its cores, memory and GPUs: what keeps kt-kernel's pinned threads on the job's cores).

    pyxis       ``srun --help`` lists ``--container-image`` (pyxis's SPANK options appear in srun's help once
                plugstack.conf loads it)
    apptainer   ``apptainer`` (or its old name ``singularity``) on PATH
    podman      ``podman`` on PATH (rootless: the user needs subuid/subgid ranges; checked by the job on its node)
    docker      ``docker`` on PATH (used only when deploy.scheduler.runtime says so)

The login node stands for the compute nodes (a site installs the same runtime on both); the batch script checks
its runtime again on the node and stops at once, naming it, when it is missing there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ktdeploy.core import markers
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.sched.runtimes import APPTAINER, AUTO_ORDER, DOCKER, DOCKER_WHY, PODMAN, PYXIS

COMMANDS = ("podman", "apptainer", "singularity", "enroot", "docker")
PROBE_SH = "\n".join([
    't=$(mktemp) || exit 1',
    markers.SECTION_SH,
    "sec config 'scontrol show config'",
    "sec srun_help 'srun --help'",
    "sec commands 'for c in " + " ".join(COMMANDS) + "; do command -v \"$c\" >/dev/null 2>&1 && echo \"$c\"; done; true'",
    'rm -f "$t"',
    markers.sh_block("end"),
    ""])

INSTALL = {
    PYXIS: "install enroot and pyxis on the nodes (plugstack.conf: required spank_pyxis.so; github.com/NVIDIA/pyxis)",
    APPTAINER: "install apptainer on the nodes (apptainer.org)",
    PODMAN: "install podman on the nodes (Debian/Ubuntu: apt install podman uidmap fuse-overlayfs) and give each user "
            "subuid/subgid ranges (usermod --add-subuids/--add-subgids)",
    DOCKER: "install docker on the nodes and add the users to the docker group",
}


@dataclass(frozen=True)
class ClusterFacts:
    config: dict[str, str] = field(default_factory=dict)    # scontrol show config (cgroup.conf's keys too)
    runtimes: tuple[str, ...] = ()                         # what the login node has, in RUNTIMES' names
    complete: bool = True                                   # the probe's answer reached its end

    def has(self, runtime: str) -> bool:
        return runtime in self.runtimes


CONFIG_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines (the first of a key wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = CONFIG_LINE.match(line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def parse_probe(text: str) -> ClusterFacts:
    secs = markers.parse_sections(text)
    found: list[str] = []
    srun = secs.get("srun_help")
    if srun is not None and "--container-image" in (srun.stdout or ""):
        found.append(PYXIS)
    cmds = set((secs["commands"].stdout or "").split()) if "commands" in secs else set()
    if cmds & {"apptainer", "singularity"}:
        found.append(APPTAINER)
    for name in (PODMAN, DOCKER):
        if name in cmds:
            found.append(name)
    cfg = secs.get("config")
    return ClusterFacts(config=parse_config(cfg.stdout or "") if cfg is not None else {}, runtimes=tuple(found),
                        complete=markers.is_complete(text))


def choose_runtime(requested: str, facts: ClusterFacts) -> str | None:
    """The runtime the job uses: the one named, or for ``auto`` the first of pyxis, apptainer, podman the cluster
    has (None: none of them)."""
    if requested != "auto":
        return requested
    return next((r for r in AUTO_ORDER if facts.has(r)), None)


def runtime_check(requested: str, facts: ClusterFacts) -> CheckResult:
    """``slurm.runtime``: fail when the runtime named (or, for auto, any of the three) is missing, naming the fix;
    warn for docker, which was asked for, with the reasons it is not the default."""
    chosen = choose_runtime(requested, facts)
    have = ", ".join(facts.runtimes) or "none of podman, apptainer, pyxis, docker"
    data = {"requested": requested, "chosen": chosen, "cluster_has": list(facts.runtimes)}
    if chosen is None:
        return CheckResult(name=CheckName.SLURM_RUNTIME, status="fail", data=data,
                           detail=f"no container runtime that keeps the job inside its cgroup on this cluster (it has "
                                  f"{have})",
                           fix=f"{INSTALL[PODMAN]}; or {INSTALL[PYXIS]}; or {INSTALL[APPTAINER]}. "
                               f"deploy.scheduler.runtime: docker runs it anyway, but {DOCKER_WHY}.")
    if not facts.has(chosen):
        others = [r for r in AUTO_ORDER if facts.has(r)]
        alt = (f" or set deploy.scheduler.runtime: {others[0]} (the cluster has it)" if others else "")
        return CheckResult(name=CheckName.SLURM_RUNTIME, status="fail", data=data,
                           detail=f"deploy.scheduler.runtime is {chosen}, and the login node has no {chosen} "
                                  f"(it has {have})",
                           fix=f"{INSTALL[chosen][0].upper()}{INSTALL[chosen][1:]}{alt}.")
    how = "named in the recipe" if requested != "auto" else f"auto: the first of {', '.join(AUTO_ORDER)} the cluster has"
    if chosen == DOCKER:
        return CheckResult(name=CheckName.SLURM_RUNTIME, status="warn", data=data,
                           detail=f"docker ({how}): {DOCKER_WHY}",
                           fix=f"Use a runtime that stays inside the job: {INSTALL[PODMAN]}, then "
                               "deploy.scheduler.runtime: podman.")
    return CheckResult(name=CheckName.SLURM_RUNTIME, status="pass", data=data, detail=f"{chosen} ({how})")


def _yes(value: str | None) -> bool:
    return (value or "").strip().lower() in ("yes", "true", "1")


def cgroup_check(facts: ClusterFacts, runtime: str, gpus: int) -> CheckResult:
    """``slurm.cgroup``: the job's cgroup fences what it was given. ProctrackType=proctrack/cgroup (every process
    of the job is found and killed with it), TaskPlugin with task/cgroup and cgroup.conf's ConstrainCores=yes (the
    job's cpuset: hwloc, which kt-kernel pins its threads with, sees only the job's cores; without it the threads
    land on other jobs' cores), ConstrainRAMSpace=yes (memory bounded by the job), ConstrainDevices=yes (only the
    job's GPUs). A warning, not a failure: the site's configuration, which ktdeploy cannot change."""
    c = facts.config
    missing = []
    if "proctrack/cgroup" not in c.get("ProctrackType", ""):
        missing.append(f"ProctrackType=proctrack/cgroup (is {c.get('ProctrackType') or 'unknown'})")
    if "task/cgroup" not in c.get("TaskPlugin", ""):
        missing.append(f"TaskPlugin=task/cgroup,task/affinity (is {c.get('TaskPlugin') or 'unknown'})")
    if not _yes(c.get("ConstrainCores")):
        missing.append("ConstrainCores=yes in cgroup.conf")
    if not _yes(c.get("ConstrainRAMSpace")):
        missing.append("ConstrainRAMSpace=yes in cgroup.conf")
    if gpus and not _yes(c.get("ConstrainDevices")):
        missing.append("ConstrainDevices=yes in cgroup.conf")
    data = {k: c.get(k) for k in ("ProctrackType", "TaskPlugin", "ConstrainCores", "ConstrainRAMSpace",
                                  "ConstrainDevices")}
    if runtime == DOCKER:
        return CheckResult(name=CheckName.SLURM_CGROUP, status="warn", data=data,
                           detail="runtime docker: the container is outside the job's cgroup, so no Slurm limit "
                                  "reaches it (cores, memory, GPUs)",
                           fix="Use podman, pyxis or apptainer (deploy.scheduler.runtime).")
    if not c:
        return CheckResult(name=CheckName.SLURM_CGROUP, status="skip", data=data,
                           detail="scontrol show config did not answer on the login node")
    if missing:
        return CheckResult(name=CheckName.SLURM_CGROUP, status="warn", data=data,
                           detail="the job's cgroup does not fence it: " + "; ".join(missing) +
                                  " (without ConstrainCores kt-kernel's pinned threads can land on other jobs' cores)",
                           fix="Ask the cluster's admin for " + ", ".join(m.split(" (")[0] for m in missing) +
                               " (docs/scaling.md: what a site needs).")
    return CheckResult(name=CheckName.SLURM_CGROUP, status="pass", data=data,
                       detail="the job's cgroup fences its cores, memory" + (" and GPUs" if gpus else "") +
                              " (proctrack/cgroup, task/cgroup, ConstrainCores, ConstrainRAMSpace"
                              + (", ConstrainDevices)" if gpus else ")"))
