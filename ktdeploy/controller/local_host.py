"""This host's facts for the agent commands, through the doctor's own fact gathering (one source of truth).

Facts are gathered once per process (so once per container start): the image's entrypoint gathers them for its
ISA gate (``local_raw``), and ``train``'s doctor, ``serve``'s thread count and ``tune`` reuse them."""

from __future__ import annotations

from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.controller.doctor import DoctorReport, doctor
from ktdeploy.controller.facts_gather import add_probes, gather_raw
from ktdeploy.core.checks.threads import derive_threads
from ktdeploy.core.facts.assemble import RawFacts, build_facts
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe.document import Recipe

_RAW: dict[str, RawFacts] = {}     # this process's host facts: "host" (sections), "probed" once the probes ran


def local_raw(probes: bool = True) -> RawFacts:
    """This host's raw facts, gathered at most once per process (the probes added the first time they are asked
    for)."""
    if "host" not in _RAW:
        _RAW["host"] = gather_raw(LocalConnector(), probes=probes)
        if probes:
            _RAW["probed"] = _RAW["host"]
    elif probes and "probed" not in _RAW:
        _RAW["probed"] = _RAW["host"] = add_probes(LocalConnector(), _RAW["host"])
    return _RAW["host"]


def local_facts(probes: bool = True) -> HostFacts:
    """This host's facts, from ``local_raw`` (the agent commands: the ISA gate, ``tune``, ``train --skip-doctor``)."""
    return build_facts(local_raw(probes))


def local_threads(reserve_cores: int) -> tuple[int, int]:
    """(kt threads, threadpools) derived from this host's topology (what ``ktdeploy train`` derives here; ``ktdeploy
    serve`` asks only when the flags and the recipe leave a count open)."""
    return derive_threads(local_facts(), reserve_cores)


def local_doctor(recipe: Recipe) -> DoctorReport:
    """The doctor's report for ``recipe`` on this host (``ktdeploy train`` hands it to the agent)."""
    return doctor(LocalConnector(), recipe, host_raw=local_raw(probes=True))
