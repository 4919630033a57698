"""This host's CPU facts for the agent commands, through the doctor's own fact gathering (one source of truth)."""

from __future__ import annotations

from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.controller.doctor import doctor
from ktdeploy.controller.facts_gather import gather_facts
from ktdeploy.core.checks.threads import kt_threads


def local_threads(recipe) -> tuple[int, int, bool]:
    """(kt threads, threadpools, AMX proven usable) for ``recipe`` on this host."""
    facts = gather_facts(LocalConnector())
    reserve = recipe.deploy.reserve_cores if recipe.deploy is not None else 2
    threads, pools = kt_threads(recipe.train, facts, reserve)   # what `ktdeploy train` used on this host
    amx = bool(facts.probes.amx.tile_exec and facts.probes.amx.correct)
    return threads, pools, amx


def local_facts(probes: bool = True):
    """This host's facts (``ktdeploy tune`` hands them to the agent)."""
    return gather_facts(LocalConnector(), probes=probes)


def local_doctor(recipe):
    """The doctor's report for ``recipe`` on this host (``ktdeploy train`` hands it to the agent)."""
    return doctor(LocalConnector(), recipe)
