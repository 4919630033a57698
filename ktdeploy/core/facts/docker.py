"""Docker facts: `docker info --format '{{json .}}'` (runtimes: is `nvidia` registered?)."""

from __future__ import annotations

import json

from ktdeploy.core.facts.host import DockerFacts

SECTIONS = {"docker_info": "docker info --format '{{json .}}'"}


def parse_docker_info(text: str) -> dict:
    """The JSON object printed by `docker info --format '{{json .}}'` (first JSON line; warnings ignored)."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON object in docker info output")


def build_docker(out: str | None, rc: int | None, err: str = "") -> DockerFacts:
    if rc is None:
        return DockerFacts()
    if rc == 127:
        return DockerFacts(present=False, error="docker: command not found")
    try:
        info = parse_docker_info(out or "")
    except (ValueError, RecursionError):
        msg = (err or out or "").strip().splitlines()
        return DockerFacts(present=True, reachable=False, error=(msg[-1] if msg else f"exit {rc}")[:300])
    server_errors = info.get("ServerErrors") or []
    if server_errors or not info.get("ServerVersion"):
        return DockerFacts(present=True, reachable=False,
                           error="; ".join(server_errors)[:300] or (err or "").strip()[:300] or "daemon not reachable")
    return DockerFacts(
        present=True, reachable=True,
        server_version=info.get("ServerVersion"),
        runtimes=sorted((info.get("Runtimes") or {}).keys()),
        default_runtime=info.get("DefaultRuntime"),
        cgroup_driver=info.get("CgroupDriver"),
        cgroup_version=str(info["CgroupVersion"]) if info.get("CgroupVersion") else None,
        storage_driver=info.get("Driver"),
        security_options=list(info.get("SecurityOptions") or []),
    )
