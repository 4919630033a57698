"""Docker facts: `docker info --format '{{json .}}'` (runtimes: is `nvidia` registered?)."""

from __future__ import annotations

from typing import Any

from ktdeploy.core.facts.host import DockerFacts
from ktdeploy.core.safeio import parse_json


def parse_docker_info(text: str) -> dict[str, Any]:
    """The JSON object printed by `docker info --format '{{json .}}'` (first JSON line; warnings ignored)."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            info = parse_json(line)
            if isinstance(info, dict):
                return info
    raise ValueError("no JSON object in docker info output")


def _text(v: object) -> str | None:
    return v if isinstance(v, str) and v else (str(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                                               else None)


def _names(v: object) -> list[str]:
    """A list of names from docker's shapes: {"runc": {...}} (Runtimes), ["a", "b"], or anything else (none)."""
    if isinstance(v, dict):
        return sorted(str(k) for k in v)
    if isinstance(v, list):
        return sorted({x for x in v if isinstance(x, str)})
    return []


def build_docker(out: str | None, rc: int | None, err: str = "") -> DockerFacts:
    if rc is None:
        return DockerFacts()
    if rc == 127:
        return DockerFacts(present=False, error="docker: command not found")
    try:
        info = parse_docker_info(out or "")
    except ValueError:
        msg = (err or out or "").strip().splitlines()
        return DockerFacts(present=True, reachable=False, error=(msg[-1] if msg else f"exit {rc}")[:300])
    raw_errors = info.get("ServerErrors")
    server_errors = [str(x) for x in raw_errors] if isinstance(raw_errors, list) else \
        ([str(raw_errors)] if raw_errors else [])
    if server_errors or not _text(info.get("ServerVersion")):
        return DockerFacts(present=True, reachable=False,
                           error="; ".join(server_errors)[:300] or (err or "").strip()[:300] or "daemon not reachable")
    opts = info.get("SecurityOptions")
    return DockerFacts(
        present=True, reachable=True,
        server_version=_text(info.get("ServerVersion")),
        runtimes=_names(info.get("Runtimes")),
        default_runtime=_text(info.get("DefaultRuntime")),
        cgroup_driver=_text(info.get("CgroupDriver")),
        cgroup_version=_text(info.get("CgroupVersion")),
        storage_driver=_text(info.get("Driver")),
        security_options=[x for x in opts if isinstance(x, str)] if isinstance(opts, list) else [],
    )
