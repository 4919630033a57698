"""Gather HostFacts through a connector: one fixed script of every command in core/facts/sources.py, the probes,
the paths.

``gather_raw`` returns the raw outputs (what golden files record), ``build_facts`` (core/facts/assemble.py) turns
raw outputs into HostFacts (pure), ``gather_facts`` does both. ``save_raw``/``load_raw`` read and write a golden
folder: ``<section>.txt`` per source (raw stdout), ``meta.json`` (exit codes, stderr),
``amx_probe.json``/``numa_probe.json`` (probe lines) and ``paths.txt``.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.facts_probes import gather_probes
from ktdeploy.core.facts.assemble import RawFacts, build_facts, value_of
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.facts.sources import COMMANDS, GATHER_TIMEOUT_S, KERNEL, PATHS, PROBE_SOURCES, FactCommand
from ktdeploy.core.markers import SECTION_SH, Section, parse_sections
from ktdeploy.core.safeio import write_file


def gather_script(commands: Sequence[FactCommand] = COMMANDS) -> str:
    """One POSIX sh script printing every command's output between markers with its exit code and stderr. The
    stderr goes through a fresh ``mktemp`` file; where none can be made, to /dev/null (the output and exit codes
    stay): never a predictable name, which another user could have made first, as a link or a FIFO."""
    lines = [
        "t=$(mktemp 2>/dev/null) || t=/dev/null",
        SECTION_SH,
    ]
    for command in commands:
        lines.append(f"sec {command.name} {shlex.quote(command.sh)}")
    lines.append('[ "$t" = /dev/null ] || rm -f "$t"')
    return "\n".join(lines) + "\n"


def gather_raw(connector: Connector, paths: Sequence[str] = (), *, probes: bool = True, base: RawFacts | None = None) -> RawFacts:
    """The host's raw facts through ``connector``. With ``base`` (facts this process already gathered on the same
    host, e.g. by the image's entrypoint), its sections and probe outputs are reused and only ``paths`` are
    looked at: facts are gathered once per container start."""
    if base is not None:
        raw = RawFacts(host=base.host, sections=base.sections, probes=dict(base.probes),
                       probe_skips=dict(base.probe_skips))
    else:
        res = connector.run_shell(gather_script(), timeout=GATHER_TIMEOUT_S)
        raw = RawFacts(host=connector.name, sections=parse_sections(res.stdout))
    if paths:
        p = connector.run(PATHS.argv(paths), env=dict(PATHS.env), timeout=PATHS.timeout_s)
        raw.paths = p.stdout
    if probes and base is None:
        add_probes(connector, raw)
    return raw


def add_probes(connector: Connector, raw: RawFacts) -> RawFacts:
    """Run the probes (AMX tile multiply, NUMA mempolicy) and add their outputs to ``raw``."""
    machine = value_of(KERNEL, raw.sections, {}).machine
    got, outputs = gather_probes(connector, machine)
    raw.probes = outputs
    for source in PROBE_SOURCES:
        if source.of(got).skipped:
            raw.probe_skips[source.name] = source.of(got).skipped
    return raw


def gather_facts(connector: Connector, paths: Sequence[str] = (), *, probes: bool = True, base: RawFacts | None = None) -> HostFacts:
    """Run every fact command (and the probes) through ``connector`` and build HostFacts (``base``: see
    gather_raw)."""
    paths = [p.rstrip("/") or "/" for p in paths]
    return build_facts(gather_raw(connector, paths, probes=probes, base=base))


# -- golden folders ----------------------------------------------------------------------------
def save_raw(raw: RawFacts, folder: str) -> None:
    """Write a golden folder (through the safe writer: a link planted there is never followed)."""
    meta: dict[str, Any] = {"host": raw.host, "sections": {}, "probe_skips": raw.probe_skips}
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
    meta: dict[str, Any] = {}
    mp = os.path.join(folder, "meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
    raw = RawFacts(host=meta.get("host", os.path.basename(folder.rstrip("/"))),
                   probe_skips=meta.get("probe_skips", {}))
    names = {c.name for c in COMMANDS} | set(meta.get("sections", {}))
    for name in names:
        path = os.path.join(folder, f"{name}.txt")
        m = meta.get("sections", {}).get(name)
        stdout = open(path).read() if os.path.exists(path) else None
        if m is None and stdout is None:
            continue
        raw.sections[name] = Section(stdout=stdout if stdout is not None else "",
                                     rc=m["rc"] if m else 0, stderr=(m or {}).get("stderr", ""))
    for probe in PROBE_SOURCES:
        path = os.path.join(folder, f"{probe.name}.json")
        if os.path.exists(path):
            raw.probes[probe.name] = open(path).read()
    if os.path.exists(os.path.join(folder, "paths.txt")):
        raw.paths = open(os.path.join(folder, "paths.txt")).read()
    return raw
