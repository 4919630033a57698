"""HostFacts: everything doctor knows about one host (or one container on it), as typed data.

Schema version 1. ``ktdeploy doctor --json`` prints ``{"facts": HostFacts, "checks": [...]}``; fields
are only ever added (never renamed) within a schema version. ``None`` always means "unknown / could
not be read", never "zero"; unlimited limits are the string ``"unlimited"``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Limit = int | Literal["unlimited"] | None


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NumaNode(_Facts):
    id: int
    cpus: list[int] = Field(default_factory=list, description="Logical CPUs of this node.")


class CpuFacts(_Facts):
    vendor: str | None = Field(None, description="vendor_id from /proc/cpuinfo (GenuineIntel, AuthenticAMD).")
    model_name: str | None = None
    family: int | None = None
    model: int | None = None
    flags: list[str] = Field(default_factory=list, description="Sorted CPU flags of the first processor.")
    logical_cpus: int = Field(0, description="Processors listed in /proc/cpuinfo.")
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    allowed_cpus: list[int] = Field(default_factory=list,
                                    description="CPUs this process may run on (Cpus_allowed_list: cpuset, taskset).")
    physical_cores: int | None = Field(None, description="Distinct (socket, core) pairs among the allowed CPUs: "
                                                         "what kt_num_threads may use, SMT siblings excluded.")
    numa_nodes: list[NumaNode] = Field(default_factory=list)
    cpu_quota: float | None = Field(None, description="cgroup CPU quota in CPUs (docker --cpus); None = no quota.")

    def has(self, *flags: str) -> bool:
        fl = set(self.flags)
        return all(f in fl for f in flags)

    @property
    def hypervisor(self) -> bool:
        return "hypervisor" in self.flags


class AmxProbe(_Facts):
    """Output of ktdeploy/probes/amx_probe.c: AMX proven by executing a tile multiply."""

    ran: bool = Field(False, description="The probe was built and executed.")
    skipped: str | None = Field(None, description="Why it did not run (no compiler, not x86_64, ...).")
    listed: bool | None = Field(None, description="CPUID.(7,0):EDX[24] AMX-TILE.")
    amx_int8: bool | None = None
    amx_bf16: bool | None = None
    xtiledata_os: bool | None = Field(None, description="XCR0 bits 17+18 enabled by the kernel.")
    permission: bool | None = Field(None, description="arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded.")
    permission_errno: int | None = None
    palettes: int | None = Field(None, description="CPUID leaf 0x1D max palette (0 = no tile palette).")
    max_names: int | None = None
    max_rows: int | None = None
    bytes_per_row: int | None = None
    tile_exec: bool | None = Field(None, description="A tdpbssd tile multiply executed without faulting.")
    correct: bool | None = Field(None, description="Its result equals the scalar reference.")
    avx512f_exec: bool | None = None
    avx512_bf16_exec: bool | None = None
    avx512_vnni_exec: bool | None = None
    avx512bw_exec: bool | None = Field(None, description="vpaddb on zmm executed (kt-kernel's avx512_base build).")
    avx512_vbmi_exec: bool | None = Field(None, description="vpermb executed (kt-kernel's avx512_vbmi and above).")
    amx_bf16_exec: bool | None = Field(None, description="A tdpbf16ps tile multiply executed (kt-kernel's AMXBF16_SFT).")
    amx_bf16_correct: bool | None = Field(None, description="Its result equals the scalar reference.")
    error: str | None = None


class MempolicyProbe(_Facts):
    """Output of ktdeploy/probes/numa_probe.c: can this process bind memory to a NUMA node?"""

    ran: bool = False
    skipped: str | None = None
    ok: bool | None = Field(None, description="set_mempolicy(MPOL_BIND, node 0) succeeded.")
    errno: int | None = None
    error: str | None = None


class Probes(_Facts):
    amx: AmxProbe = Field(default_factory=AmxProbe)
    mempolicy: MempolicyProbe = Field(default_factory=MempolicyProbe)


class Gpu(_Facts):
    index: int
    name: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver_version: str | None = None
    uuid: str | None = None


class GpuFacts(_Facts):
    nvidia_smi: Literal["ok", "missing", "failed", "unknown"] = "unknown"
    error: str | None = Field(None, description="nvidia-smi's message when it failed.")
    gpus: list[Gpu] = Field(default_factory=list)
    device_nodes: list[str] = Field(default_factory=list, description="/dev/nvidia* nodes present.")

    @property
    def count(self) -> int:
        return len(self.gpus)


class MemoryFacts(_Facts):
    total_bytes: int | None = None
    available_bytes: int | None = None
    swap_total_bytes: int | None = None
    hugepages_total: int | None = None
    hugepage_size_bytes: int | None = None


class PathFacts(_Facts):
    path: str
    exists: bool
    is_dir: bool = False
    writable: bool = Field(False, description="The path (or its nearest existing parent) is writable by us.")
    checked: str = Field(description="The path df was run on: the path itself or its nearest existing parent.")
    mount: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_bytes: int | None = Field(None, description="du -sk of the path when it is a directory.")
    real: str | None = Field(None, description="Where the path really is on the host: symlinks of its nearest "
                                               "existing parent resolved (readlink -f), the missing tail appended.")


class DockerFacts(_Facts):
    present: bool = Field(False, description="The docker CLI exists.")
    reachable: bool = Field(False, description="The docker daemon answered `docker info`.")
    error: str | None = None
    server_version: str | None = None
    runtimes: list[str] = Field(default_factory=list)
    default_runtime: str | None = None
    cgroup_driver: str | None = None
    cgroup_version: str | None = None
    storage_driver: str | None = None
    security_options: list[str] = Field(default_factory=list)

    @property
    def nvidia_runtime(self) -> bool:
        return "nvidia" in self.runtimes


class VirtFacts(_Facts):
    hypervisor_flag: bool = False
    vm: str | None = Field(None, description="systemd-detect-virt --vm ('kvm', 'microsoft', 'none'), else from DMI.")
    dmi_vendor: str | None = None
    dmi_product: str | None = None

    @property
    def is_vm(self) -> bool:
        return self.hypervisor_flag or (self.vm not in (None, "none"))


class ContainerFacts(_Facts):
    in_container: bool = False
    kind: str | None = Field(None, description="docker, podman, lxc, containerd, kubernetes, ...")
    evidence: list[str] = Field(default_factory=list, description="What gave it away (/.dockerenv, cgroup path, ...).")


class KernelFacts(_Facts):
    release: str | None = None
    version: tuple[int, int, int] | None = None
    machine: str | None = None


class LimitsFacts(_Facts):
    memlock_soft: Limit = Field(None, description="RLIMIT_MEMLOCK soft limit in bytes.")
    memlock_hard: Limit = None
    cgroup_version: Literal["v1", "v2"] | None = None
    cgroup_memory_limit: Limit = Field(None, description="cgroup memory limit in bytes (docker --memory).")
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None


class HostFacts(_Facts):
    schema_version: int = SCHEMA_VERSION
    host: str = Field("localhost", description="Where the facts were gathered (connector name).")
    layer: Literal["host", "vm", "container"] = Field(
        "host", description="Outermost isolation seen from inside: container, else vm, else bare host.")
    kernel: KernelFacts = Field(default_factory=KernelFacts)
    os: dict[str, str] = Field(default_factory=dict, description="/etc/os-release (ID, VERSION_ID, PRETTY_NAME).")
    cpu: CpuFacts = Field(default_factory=CpuFacts)
    memory: MemoryFacts = Field(default_factory=MemoryFacts)
    gpu: GpuFacts = Field(default_factory=GpuFacts)
    docker: DockerFacts = Field(default_factory=DockerFacts)
    virt: VirtFacts = Field(default_factory=VirtFacts)
    container: ContainerFacts = Field(default_factory=ContainerFacts)
    limits: LimitsFacts = Field(default_factory=LimitsFacts)
    paths: list[PathFacts] = Field(default_factory=list)
    probes: Probes = Field(default_factory=Probes)
    errors: dict[str, str] = Field(default_factory=dict, description="Sources that could not be read, and why.")

    def path(self, p: str) -> PathFacts | None:
        p = p.rstrip("/") or "/"
        return next((x for x in self.paths if x.path == p), None)
