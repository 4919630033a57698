"""Container detection: marker files, `systemd-detect-virt --container`, PID 1's cgroup and the root mount."""

from __future__ import annotations

import re

from ktdeploy.core.facts.host import ContainerFacts

_CGROUP_KINDS = [
    (re.compile(r"kubepods"), "kubernetes"),
    (re.compile(r"/docker[/-]|docker-[0-9a-f]{12,}\.scope"), "docker"),
    (re.compile(r"libpod|/machine\.slice/libpod"), "podman"),
    (re.compile(r"/lxc[/.]|lxc\.payload"), "lxc"),
    (re.compile(r"containerd"), "containerd"),
]


def build_container(detect_out: str | None, detect_rc: int | None, markers: str | None,
                    proc1_cgroup: str | None, root_mount: str | None) -> ContainerFacts:
    evidence: list[str] = []
    kind = None
    word = (detect_out or "").strip()
    if detect_rc == 0 and word and word != "none":
        kind = word.splitlines()[0]
        evidence.append(f"systemd-detect-virt --container: {kind}")
    for line in (markers or "").splitlines():
        line = line.strip()
        if not line:
            continue
        evidence.append(line)
        kind = kind or {"/.dockerenv": "docker", "/run/.containerenv": "podman"}.get(line, "kubernetes")
    for line in (proc1_cgroup or "").splitlines():
        for rx, k in _CGROUP_KINDS:
            if rx.search(line):
                evidence.append(f"/proc/1/cgroup: {line.strip()}")
                kind = kind or k
                break
        else:
            continue
        break
    fs = _root_fstype(root_mount or "")
    if fs in ("overlay", "fuse.fuse-overlayfs", "aufs"):
        evidence.append(f"root filesystem is {fs}")
    in_container = bool(kind) or bool(evidence)
    return ContainerFacts(in_container=in_container, kind=kind or ("unknown" if in_container else None),
                          evidence=evidence)


def _root_fstype(line: str) -> str | None:
    # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
    for ln in line.splitlines():
        if " - " in ln:
            after = ln.split(" - ", 1)[1].split()
            if after:
                return after[0]
    return None
