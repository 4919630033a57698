"""Every fact source in one place (pure): what fact gathering runs on a host, within which bounds, and the pure
function that reads each answer. The controller (``controller/facts_gather.py``, ``facts_probes.py``,
``doctor.gather_data``) iterates these tuples and runs the commands through a connector; ``core/facts/assemble.py``
hands the answers to the parse functions. A source is named by its constant here, never by a string
(``tests/unit/core/facts/test_fact_sources.py``).

- ``FactCommand``: one command of the gather script (sh text). The whole script is one connector call bounded by
  GATHER_TIMEOUT_S; each command's stderr is kept to 2000 bytes (``core/markers.SECTION_SH``). Its answer, a
  ``markers.Section``, is ``<name>.txt`` + a ``meta.json`` entry in a golden folder.
- ``FactSource``: one value of HostFacts built by a pure function from its commands' answers (and the values of
  the sources it needs); its ``name`` is its key in ``HostFacts.errors`` when the text had an unexpected shape.
- ``ScriptSource``: a fixed script run on its own, the caller's values as argv (paths, a recipe's data).
- ``ProbeSource``: an execution probe (``ktdeploy/probes/<name>.c``) run by ``controller/facts_probes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ktdeploy.core.facts import container, cpu, data_listing, disk, docker, gpu, kernel, limits, memory, probes, virt
from ktdeploy.core.facts.host import (
    AmxProbe,
    ContainerFacts,
    CpuFacts,
    DockerFacts,
    GpuFacts,
    KernelFacts,
    LimitsFacts,
    MemoryFacts,
    MempolicyProbe,
    Probes,
    VirtFacts,
)
from ktdeploy.core.markers import Section

T = TypeVar("T")
P = TypeVar("P", AmxProbe, MempolicyProbe)

GATHER_TIMEOUT_S = 120       # the one gather script, every command in it


@dataclass(frozen=True, eq=False)
class FactCommand:
    name: str
    sh: str
    # a non-zero exit is not reported in facts.errors: it is part of the answer (systemd-detect-virt's 1 on bare
    # metal, nvidia-smi's 127 when it is missing), which the parse reads from the whole Section
    quiet: bool = False


def ok(answer: Section) -> str | None:
    """What a command printed when it exited 0, else None (how a parse reads a command whose exit says only whether
    it worked)."""
    return answer.stdout if answer.rc == 0 else None


# -- the gather script's commands, in the order it runs them --------------------------------------------------------
UNAME = FactCommand("uname", "uname -r; uname -m")
OS_RELEASE = FactCommand("os_release", "cat /etc/os-release")
CPUINFO = FactCommand("cpuinfo", "cat /proc/cpuinfo")
LSCPU_JSON = FactCommand("lscpu_json", "lscpu -J")
LSCPU_PARSE = FactCommand("lscpu_parse", "lscpu -p=CPU,CORE,SOCKET,NODE")
CPUS_ALLOWED = FactCommand("cpus_allowed", "grep -E '^Cpus_allowed_list' /proc/self/status")
NUMA_SYSFS = FactCommand("numa_sysfs", "for n in /sys/devices/system/node/node[0-9]*; do [ -e \"$n/cpulist\" ] && "
                                       "printf '%s %s\\n' \"${n##*/node}\" \"$(cat \"$n/cpulist\")\"; done; true")
MEMINFO = FactCommand("meminfo", "cat /proc/meminfo")
NVIDIA_SMI = FactCommand("nvidia_smi", f"nvidia-smi --query-gpu={gpu.QUERY} --format=csv,noheader,nounits",
                         quiet=True)
NVIDIA_DEVICES = FactCommand("nvidia_devices", "ls -1 /dev/nvidia* 2>/dev/null; true")
DOCKER_INFO = FactCommand("docker_info", "docker info --format '{{json .}}'", quiet=True)
DETECT_VIRT_VM = FactCommand("detect_virt_vm", "systemd-detect-virt --vm", quiet=True)
DMI = FactCommand("dmi", "for f in sys_vendor product_name; do printf '%s=%s\\n' \"$f\" "
                         "\"$(cat /sys/class/dmi/id/$f 2>/dev/null)\"; done")
DETECT_VIRT_CONTAINER = FactCommand("detect_virt_container", "systemd-detect-virt --container", quiet=True)
CONTAINER_MARKERS = FactCommand(
    "container_markers", "for f in /.dockerenv /run/.containerenv /run/secrets/kubernetes.io; do "
                         "[ -e \"$f\" ] && echo \"$f\"; done; "
                         "[ -n \"$KUBERNETES_SERVICE_HOST\" ] && echo KUBERNETES_SERVICE_HOST; true", quiet=True)
PROC1_CGROUP = FactCommand("proc1_cgroup", "cat /proc/1/cgroup")
ROOT_MOUNT = FactCommand("root_mount", "awk '$5 == \"/\" {print $0}' /proc/self/mountinfo")
PROC_LIMITS = FactCommand("proc_limits", "cat /proc/self/limits")
# Reads our own cgroup's limits (v2: memory.max/cpu.max; v1: memory.limit_in_bytes/cpu.cfs_*),
# falling back to the cgroup root, which is the container's own cgroup inside a container.
CGROUP = FactCommand("cgroup", (
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo version=v2; "
    "p=$(sed -n 's/^0:://p' /proc/self/cgroup); d=/sys/fs/cgroup$p; [ -f \"$d/memory.max\" ] || d=/sys/fs/cgroup; "
    "echo memory=$(cat \"$d/memory.max\" 2>/dev/null); echo cpu=$(cat \"$d/cpu.max\" 2>/dev/null); "
    "else echo version=v1; "
    "p=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup); d=/sys/fs/cgroup/memory$p; "
    "[ -f \"$d/memory.limit_in_bytes\" ] || d=/sys/fs/cgroup/memory; "
    "echo memory=$(cat \"$d/memory.limit_in_bytes\" 2>/dev/null); "
    "c=/sys/fs/cgroup/cpu; [ -d \"$c\" ] || c=/sys/fs/cgroup/cpu,cpuacct; "
    "echo cpu=$(cat \"$c/cpu.cfs_quota_us\" 2>/dev/null) $(cat \"$c/cpu.cfs_period_us\" 2>/dev/null); fi"))
SHM = FactCommand("shm", "df -Pk /dev/shm")

COMMANDS: tuple[FactCommand, ...] = (
    UNAME, OS_RELEASE, CPUINFO, LSCPU_JSON, LSCPU_PARSE, CPUS_ALLOWED, NUMA_SYSFS, MEMINFO, NVIDIA_SMI,
    NVIDIA_DEVICES, DOCKER_INFO, DETECT_VIRT_VM, DMI, DETECT_VIRT_CONTAINER, CONTAINER_MARKERS, PROC1_CGROUP,
    ROOT_MOUNT, PROC_LIMITS, CGROUP, SHM)


@dataclass(frozen=True, eq=False)
class FactSource(Generic[T]):
    """``parse(*answers, *needed)``: one ``markers.Section`` per command (``Section(None, None)`` when it was not
    captured), then the value of each source in ``needs``; ``default()`` when it raises on text of an unexpected
    shape (``core/facts/total.parsed``)."""

    name: str
    commands: tuple[FactCommand, ...]
    parse: Callable[..., T]
    default: Callable[[], T]
    needs: tuple[FactSource[Any], ...] = ()


# -- HostFacts' values, in the order they are built (a source's needs come before it) -------------------------------
CPU_QUOTA = FactSource("cgroup", (CGROUP,), lambda cg: limits.parse_cgroup(ok(cg) or "")["cpu_quota"], lambda: None)
CPU = FactSource(
    "cpu", (CPUINFO, LSCPU_JSON, LSCPU_PARSE, CPUS_ALLOWED, NUMA_SYSFS),
    lambda info, js, table, allowed, nodes, quota: cpu.build_cpu(ok(info), ok(js), ok(table), ok(allowed), ok(nodes),
                                                                 cpu_quota=quota),
    CpuFacts, needs=(CPU_QUOTA,))
LSCPU_HYPERVISOR = FactSource(
    "lscpu_json", (LSCPU_JSON,),
    lambda js: cpu.parse_lscpu_json(js.stdout).get("hypervisor_vendor") if ok(js) else None, lambda: None)
KERNEL = FactSource("uname", (UNAME,), lambda u: kernel.build_kernel(ok(u)), KernelFacts)
OS: FactSource[dict[str, str]] = FactSource("os_release", (OS_RELEASE,), lambda o: kernel.parse_os_release(ok(o)), dict)
MEMORY = FactSource("meminfo", (MEMINFO,), lambda m: memory.build_memory(ok(m)), MemoryFacts)
GPU = FactSource("nvidia_smi", (NVIDIA_SMI, NVIDIA_DEVICES),
                 lambda smi, dev: gpu.build_gpu(smi.stdout, smi.rc, smi.stderr, ok(dev)), GpuFacts)
DOCKER = FactSource("docker_info", (DOCKER_INFO,), lambda d: docker.build_docker(d.stdout, d.rc, d.stderr),
                    DockerFacts)
VIRT = FactSource(
    "virt", (DETECT_VIRT_VM, DMI),
    lambda vm, dmi, cpu_facts, hv: virt.build_virt(cpu_facts.hypervisor, vm.stdout, vm.rc, ok(dmi), hv),
    VirtFacts, needs=(CPU, LSCPU_HYPERVISOR))
CONTAINER = FactSource(
    "container", (DETECT_VIRT_CONTAINER, CONTAINER_MARKERS, PROC1_CGROUP, ROOT_MOUNT),
    lambda c, marks, cg1, root: container.build_container(c.stdout, c.rc, ok(marks), ok(cg1), ok(root)),
    ContainerFacts)
LIMITS = FactSource("limits", (PROC_LIMITS, CGROUP, SHM),
                    lambda lim, cg, shm: limits.build_limits(ok(lim), ok(cg), ok(shm)), LimitsFacts)

FACT_SOURCES: tuple[FactSource[Any], ...] = (
    CPU_QUOTA, CPU, LSCPU_HYPERVISOR, KERNEL, OS, MEMORY, GPU, DOCKER, VIRT, CONTAINER, LIMITS)


@dataclass(frozen=True, eq=False)
class ScriptSource(Generic[T]):
    """Run as ``sh -c SCRIPT ktdeploy-NAME ARG...`` (user values travel as argv, never spliced into shell text)."""

    name: str
    script: str
    timeout_s: float
    parse: Callable[[str], T]
    env: tuple[tuple[str, str], ...] = ()

    def argv(self, args: Sequence[str]) -> list[str]:
        return ["sh", "-c", self.script, f"ktdeploy-{self.name}", *args]


# the recipe's paths: existence, writability, free space (du of a folder bounded by `timeout 20` in the script)
PATHS = ScriptSource("paths", disk.PATHS_SCRIPT, 120, disk.parse_paths, env=(("KTD_DU", "1"),))
# a recipe's data and weights: every read bounded by `head -c` / `head -n` in the script
DATA = ScriptSource("data", data_listing.DATA_SCRIPT, 60, data_listing.parse_data_output)


@dataclass(frozen=True, eq=False)
class ProbeSource(Generic[P]):
    """A probe's answer is its last JSON line (``core/facts/probes.py``); ``read`` never raises."""

    name: str              # ktdeploy/probes/<name>.c, its binary, <name>.json in a golden folder
    parse: Callable[[str], P]
    model: type[P]
    of: Callable[[Probes], P]   # its value in a Probes
    timeout_s: float = 60

    def read(self, text: str) -> P:
        """The probe's output parsed, or the probe reported skipped as unreadable: never a crash (host text is
        untrusted; pydantic's ValidationError is a ValueError)."""
        try:
            return self.parse(text)
        except (ValueError, TypeError) as e:
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            return self.model(skipped=f"unreadable {self.name} output: {why}")


AMX_PROBE = ProbeSource("amx_probe", probes.amx_from_output, AmxProbe, lambda p: p.amx)
NUMA_PROBE = ProbeSource("numa_probe", probes.mempolicy_from_output, MempolicyProbe, lambda p: p.mempolicy)
PROBE_SOURCES: tuple[ProbeSource[Any], ...] = (AMX_PROBE, NUMA_PROBE)
