"""Raw outputs -> HostFacts (pure): each source of core/facts/sources.py handed its commands' answers.

``RawFacts`` is what a host answered (and what a golden folder records): the gather script's sections, the
probes' outputs and skip reasons, the paths script's output. Every parse goes through ``total.parsed``: text of
an unexpected shape is reported in ``HostFacts.errors`` under the source's name, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ktdeploy.core.facts.host import HostFacts, Probes
from ktdeploy.core.facts.sources import (
    AMX_PROBE,
    COMMANDS,
    CONTAINER,
    CPU,
    DOCKER,
    FACT_SOURCES,
    GPU,
    KERNEL,
    LIMITS,
    MEMORY,
    NUMA_PROBE,
    OS,
    PATHS,
    VIRT,
    FactSource,
    P,
    ProbeSource,
)
from ktdeploy.core.facts.total import parsed
from ktdeploy.core.markers import Section

T = TypeVar("T")
QUIET = frozenset(c.name for c in COMMANDS if c.quiet)


@dataclass
class RawFacts:
    host: str = "localhost"
    sections: dict[str, Section] = field(default_factory=dict)
    probes: dict[str, str] = field(default_factory=dict)
    probe_skips: dict[str, str] = field(default_factory=dict)
    paths: str = ""


class Values:
    """Each source's value, looked up by the source itself (``values[CPU]`` is a CpuFacts)."""

    def __init__(self) -> None:
        self._by_source: dict[FactSource[Any], Any] = {}

    def __getitem__(self, source: FactSource[T]) -> T:
        value: T = self._by_source[source]
        return value

    def add(self, source: FactSource[T], value: T) -> None:
        self._by_source[source] = value


def value_of(source: FactSource[T], sections: Mapping[str, Section], errors: dict[str, str],
             values: Values | None = None) -> T:
    """``source`` parsed from its commands' answers (``values``: those of the sources it needs)."""
    answers = [sections.get(c.name) or Section(None, None) for c in source.commands]
    needed = [values[n] for n in source.needs] if values is not None else []
    return parsed(source.name, errors, lambda: source.parse(*answers, *needed), source.default)


def failed_commands(sections: Mapping[str, Section]) -> dict[str, str]:
    """The commands that exited non-zero (quiet ones aside) and the first line of why."""
    errors: dict[str, str] = {}
    for name, section in sections.items():
        if section.rc not in (0, None) and name not in QUIET:
            errors[name] = (section.stderr or f"exit {section.rc}").splitlines()[0][:200] if (
                section.stderr or section.rc) else ""
    return errors


def probe_value(source: ProbeSource[P], outputs: Mapping[str, str], skips: Mapping[str, str]) -> P:
    if source.name in outputs:
        return source.read(outputs[source.name])
    return source.model(skipped=skips.get(source.name, "probe not run"))


def probes_from(outputs: Mapping[str, str], skips: Mapping[str, str]) -> Probes:
    return Probes(amx=probe_value(AMX_PROBE, outputs, skips), mempolicy=probe_value(NUMA_PROBE, outputs, skips))


def build_facts(raw: RawFacts) -> HostFacts:
    """Pure: raw outputs -> HostFacts."""
    errors = failed_commands(raw.sections)
    values = Values()
    for source in FACT_SOURCES:
        values.add(source, value_of(source, raw.sections, errors, values))
    facts = HostFacts(
        host=raw.host, kernel=values[KERNEL], os=values[OS], cpu=values[CPU], memory=values[MEMORY],
        gpu=values[GPU], docker=values[DOCKER], virt=values[VIRT], container=values[CONTAINER],
        limits=values[LIMITS],
        paths=parsed(PATHS.name, errors, lambda: PATHS.parse(raw.paths) if raw.paths else [], list),
        errors=errors,
    )
    facts.layer = "container" if facts.container.in_container else ("vm" if facts.virt.is_vm else "host")
    facts.probes = probes_from(raw.probes, raw.probe_skips)
    return facts
