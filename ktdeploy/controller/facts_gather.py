"""Gather HostFacts through a connector: one fixed script for every source, the probes, the paths.

``gather_raw`` returns the raw outputs (what golden files record), ``build_facts`` turns raw outputs
into HostFacts (pure), ``gather_facts`` does both. ``save_raw``/``load_raw`` read and write a golden
folder: ``<section>.txt`` per source (raw stdout), ``meta.json`` (exit codes, stderr),
``amx_probe.json``/``numa_probe.json`` (probe lines) and ``paths.txt``.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.facts_probes import PROBE_PARSERS, gather_probes, parse_probe
from ktdeploy.core.facts import container, cpu, disk, docker, gpu, kernel, limits, memory, virt
from ktdeploy.core.facts.host import (
    ContainerFacts,
    CpuFacts,
    DockerFacts,
    GpuFacts,
    HostFacts,
    KernelFacts,
    LimitsFacts,
    MemoryFacts,
    Probes,
    VirtFacts,
)
from ktdeploy.core.facts.total import parsed
from ktdeploy.core.markers import SECTION_SH, Section, parse_sections
from ktdeploy.core.safeio import write_file

SECTION_MODULES = (kernel, cpu, memory, gpu, docker, virt, container, limits)


def all_sections() -> dict[str, str]:
    out: dict[str, str] = {}
    for mod in SECTION_MODULES:
        out.update(mod.SECTIONS)
    return out


def gather_script(sections: dict[str, str] | None = None) -> str:
    """One POSIX sh script printing every section between markers with its exit code and stderr."""
    sections = sections or all_sections()
    lines = [
        't=$(mktemp 2>/dev/null || echo "/tmp/ktd-gather-$$")',
        SECTION_SH,
    ]
    for name, cmd in sections.items():
        lines.append(f"sec {name} {shlex.quote(cmd)}")
    lines.append('rm -f "$t"')
    return "\n".join(lines) + "\n"


@dataclass
class RawFacts:
    host: str = "localhost"
    sections: dict[str, Section] = field(default_factory=dict)
    probes: dict[str, str] = field(default_factory=dict)
    probe_skips: dict[str, str] = field(default_factory=dict)
    paths: str = ""




def gather_raw(connector: Connector, paths: Sequence[str] = (), *, probes: bool = True, base: RawFacts | None = None) -> RawFacts:
    """The host's raw facts through ``connector``. With ``base`` (facts this process already gathered on the same
    host, e.g. by the image's entrypoint), its sections and probe outputs are reused and only ``paths`` are
    looked at: facts are gathered once per container start."""
    if base is not None:
        raw = RawFacts(host=base.host, sections=base.sections, probes=dict(base.probes),
                       probe_skips=dict(base.probe_skips))
    else:
        res = connector.run_shell(gather_script(), timeout=120)
        raw = RawFacts(host=connector.name, sections=parse_sections(res.stdout))
    if paths:
        p = connector.run(["sh", "-c", disk.PATHS_SCRIPT, "ktdeploy-paths", *paths], env={"KTD_DU": "1"},
                          timeout=120)
        raw.paths = p.stdout
    if probes and base is None:
        add_probes(connector, raw)
    return raw


def add_probes(connector: Connector, raw: RawFacts) -> RawFacts:
    """Run the probes (AMX tile multiply, NUMA mempolicy) and add their outputs to ``raw``."""
    machine = parsed("uname", {}, lambda: (raw.sections.get("uname") and
                                           kernel.build_kernel(raw.sections["uname"].stdout).machine) or None,
                     lambda: None)
    got, outputs = gather_probes(connector, machine)
    raw.probes = outputs
    if got.amx.skipped:
        raw.probe_skips["amx_probe"] = got.amx.skipped
    if got.mempolicy.skipped:
        raw.probe_skips["numa_probe"] = got.mempolicy.skipped
    return raw


def build_facts(raw: RawFacts) -> HostFacts:
    """Pure: raw outputs -> HostFacts."""
    s = raw.sections

    def out(name: str) -> Any:
        sec = s.get(name)
        return sec.stdout if sec and sec.rc == 0 else None

    def sec(name: str) -> Section:
        return s.get(name) or Section(None, None)

    errors: dict[str, str] = {}
    for name, section in s.items():
        if section.rc not in (0, None) and name not in ("detect_virt_vm", "detect_virt_container", "nvidia_smi",
                                                          "docker_info", "container_markers"):
            errors[name] = (section.stderr or f"exit {section.rc}").splitlines()[0][:200] if (
                section.stderr or section.rc) else ""

    e = errors   # every section parsed through total.parsed: an unexpected shape is reported, never a crash
    cg = parsed("cgroup", e, lambda: limits.parse_cgroup(out("cgroup") or ""), lambda: {"cpu_quota": None})
    cpu_facts = parsed("cpu", e, lambda: cpu.build_cpu(out("cpuinfo"), out("lscpu_json"), out("lscpu_parse"),
                                                       out("cpus_allowed"), out("numa_sysfs"),
                                                       cpu_quota=cg.get("cpu_quota")), CpuFacts)
    lscpu_hv = None
    if out("lscpu_json"):
        lscpu_hv = parsed("lscpu_json", e, lambda: cpu.parse_lscpu_json(out("lscpu_json")).get("hypervisor_vendor"),
                          lambda: None)
    v = sec("detect_virt_vm")
    c = sec("detect_virt_container")
    n = sec("nvidia_smi")
    d = sec("docker_info")
    facts = HostFacts(
        host=raw.host,
        kernel=parsed("uname", e, lambda: kernel.build_kernel(out("uname")), KernelFacts),
        os=parsed("os_release", e, lambda: kernel.parse_os_release(out("os_release")), dict),
        cpu=cpu_facts,
        memory=parsed("meminfo", e, lambda: memory.build_memory(out("meminfo")), MemoryFacts),
        gpu=parsed("nvidia_smi", e, lambda: gpu.build_gpu(n.stdout, n.rc, n.stderr, out("nvidia_devices")), GpuFacts),
        docker=parsed("docker_info", e, lambda: docker.build_docker(d.stdout, d.rc, d.stderr), DockerFacts),
        virt=parsed("virt", e, lambda: virt.build_virt(cpu_facts.hypervisor, v.stdout, v.rc, out("dmi"), lscpu_hv),
                    VirtFacts),
        container=parsed("container", e, lambda: container.build_container(
            c.stdout, c.rc, out("container_markers"), out("proc1_cgroup"), out("root_mount")), ContainerFacts),
        limits=parsed("limits", e, lambda: limits.build_limits(out("proc_limits"), out("cgroup"), out("shm")),
                      LimitsFacts),
        paths=parsed("paths", e, lambda: disk.parse_paths(raw.paths) if raw.paths else [], list),
        errors=errors,
    )
    facts.layer = "container" if facts.container.in_container else ("vm" if facts.virt.is_vm else "host")
    probes = Probes()
    for name, field_, parse, model in PROBE_PARSERS:
        if name in raw.probes:
            setattr(probes, field_, parse_probe(name, parse, model, raw.probes[name]))
        else:
            getattr(probes, field_).skipped = raw.probe_skips.get(name, "probe not run")
    facts.probes = probes
    return facts


def gather_facts(connector: Connector, paths: Sequence[str] = (), *, probes: bool = True, base: RawFacts | None = None) -> HostFacts:
    """Run every fact command (and the probes) through ``connector`` and build HostFacts (``base``: see
    gather_raw)."""
    paths = [p.rstrip("/") or "/" for p in paths]
    return build_facts(gather_raw(connector, paths, probes=probes, base=base))


# -- golden folders ----------------------------------------------------------------------------
def save_raw(raw: RawFacts, folder: str) -> None:
    """Write a golden folder (through the safe writer: a link planted there is never followed)."""
    meta: dict = {"host": raw.host, "sections": {}, "probe_skips": raw.probe_skips}
    for name, sec in raw.sections.items():
        if sec.stdout is not None:
            write_file(folder, f"{name}.txt", sec.stdout, overwrite=True)
        meta["sections"][name] = {"rc": sec.rc, "stderr": sec.stderr}
    for name, out in raw.probes.items():
        write_file(folder, f"{name}.json", out, overwrite=True)
    if raw.paths:
        write_file(folder, "paths.txt", raw.paths, overwrite=True)
    write_file(folder, "meta.json", json.dumps(meta, indent=2, sort_keys=True) + "\n", overwrite=True)


def load_raw(folder: str) -> RawFacts:
    """Read a golden folder. Without meta.json (outputs captured by hand), a present file means exit 0
    and an absent one means the source was not captured."""
    meta: dict = {}
    mp = os.path.join(folder, "meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
    raw = RawFacts(host=meta.get("host", os.path.basename(folder.rstrip("/"))),
                   probe_skips=meta.get("probe_skips", {}))
    names = set(all_sections()) | set(meta.get("sections", {}))
    for name in names:
        path = os.path.join(folder, f"{name}.txt")
        m = meta.get("sections", {}).get(name)
        stdout = open(path).read() if os.path.exists(path) else None
        if m is None and stdout is None:
            continue
        raw.sections[name] = Section(stdout=stdout if stdout is not None else "",
                                     rc=m["rc"] if m else 0, stderr=(m or {}).get("stderr", ""))
    for probe in ("amx_probe", "numa_probe"):
        path = os.path.join(folder, f"{probe}.json")
        if os.path.exists(path):
            raw.probes[probe] = open(path).read()
    if os.path.exists(os.path.join(folder, "paths.txt")):
        raw.paths = open(os.path.join(folder, "paths.txt")).read()
    return raw
