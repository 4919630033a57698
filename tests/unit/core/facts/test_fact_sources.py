"""One registry of fact sources (core/facts/sources.py): each command the fact gathering runs sits beside the pure
function that reads its answer, and code names a source by its constant. A source's name written as a string
elsewhere in ktdeploy/ (the old ``out("meminfo")`` join between a command and its parser) fails here, as does a
registry entry nothing reads or a parse that does not take what its source hands it."""

import inspect
import json
from pathlib import Path

from ktdeploy.core.facts import sources
from ktdeploy.core.facts.sources import (
    COMMANDS,
    DATA,
    FACT_SOURCES,
    PATHS,
    PROBE_SOURCES,
    FactCommand,
    FactSource,
    ProbeSource,
    ScriptSource,
)
from tests.unit.literals import name_literals

ROOT = Path(__file__).resolve().parents[4]
PKG = ROOT / "ktdeploy"
HOME = PKG / "core" / "facts" / "sources.py"
NAMES = {s.name for s in (*COMMANDS, *FACT_SOURCES, *PROBE_SOURCES, PATHS, DATA)}
# names that are also plain words of another meaning in ktdeploy/, with that meaning; written as strings only there
OTHER_MEANINGS = {
    "container": "HostFacts.layer's value, the training container",
    "cpu": "a Kubernetes resource, the cgroup script's `cpu=` line, catalog entries",
    "limits": "a Kubernetes resources key",
    "shm": "a Kubernetes volume, a requirement's basis key",
    "nvidia_smi": "GpuFacts' field, named in a check's data",
    "data": "the recipe's data volume, JSON keys",
    "uname": "a pax header's key (a tar entry's owner name) in controller/images/archive.py",
}
# the controller's gatherer: not even those words (every source reached through the registry)
GATHERER = [PKG / "controller" / f for f in ("facts_gather.py", "facts_probes.py", "facts_record.py", "local_host.py")]


def _sources():
    return [p for p in sorted(PKG.rglob("*.py")) if p != HOME]


def test_no_source_name_is_written_outside_the_registry():
    found = [f"{p.relative_to(ROOT)}:{line}: {name!r}"
             for p in _sources() for line, name in name_literals(p.read_text(), NAMES - set(OTHER_MEANINGS))]
    found += [f"{p.relative_to(ROOT)}:{line}: {name!r}"
              for p in GATHERER for line, name in name_literals(p.read_text(), NAMES)]
    assert not found, "name the source by its constant in core/facts/sources.py:\n" + "\n".join(found)


def test_the_other_meanings_are_names_and_still_used_elsewhere():
    assert set(OTHER_MEANINGS) <= NAMES
    used = {name for p in _sources() for _line, name in name_literals(p.read_text(), set(OTHER_MEANINGS))}
    assert used == set(OTHER_MEANINGS), f"no longer used elsewhere, protect them again: {set(OTHER_MEANINGS) - used}"


def test_the_scan_catches_what_it_looks_for():
    src = 'x = out("meminfo")\ny = sections["uname"]\nz = f"{a}meminfo"\n'
    assert name_literals(src, NAMES) == [(1, "meminfo"), (2, "uname")]


def test_every_registry_entry_is_listed_and_named_once():
    kinds = {FactCommand: COMMANDS, FactSource: FACT_SOURCES, ProbeSource: PROBE_SOURCES}
    for kind, listed in kinds.items():
        declared = [v for v in vars(sources).values() if isinstance(v, kind)]
        assert sorted(map(id, declared)) == sorted(map(id, listed)), kind.__name__
    for listed in (COMMANDS, FACT_SOURCES, PROBE_SOURCES):
        assert len({s.name for s in listed}) == len(listed)
    assert {s for s in vars(sources).values() if isinstance(s, ScriptSource)} == {PATHS, DATA}


def test_every_command_is_read_and_every_parse_takes_what_it_is_handed():
    read = {c for s in FACT_SOURCES for c in s.commands}
    assert read == set(COMMANDS), "a command gathered for nothing"
    for i, s in enumerate(FACT_SOURCES):
        assert all(FACT_SOURCES.index(n) < i for n in s.needs), f"{s.name}: needs a source built after it"
        params = inspect.signature(s.parse).parameters
        assert len(params) == len(s.commands) + len(s.needs), s.name


def test_probes_are_the_shipped_programs():
    shipped = sorted(p.stem for p in (PKG / "probes").glob("*.c"))
    assert sorted(p.name for p in PROBE_SOURCES) == shipped


def test_golden_folders_record_only_registered_commands():
    names = {c.name for c in COMMANDS}
    for meta in sorted((ROOT / "tests" / "golden").glob("*/meta.json")):
        recorded = set(json.loads(meta.read_text()).get("sections", {}))
        assert recorded <= names, (meta.parent.name, recorded - names)
