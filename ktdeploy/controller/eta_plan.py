"""The planned step time of a recipe on the host `up` trains on (its doctor facts), for the run's ETA."""

from __future__ import annotations

from ktdeploy.core.eta import Eta
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sizing.throughput import REFERENCE_HOST, HostCPU, host_from_facts


def host_cpu(facts: HostFacts | None) -> HostCPU:
    """The host the plan is for, read as `plan --facts` and `plan --from-run` read a facts file (one reading, so a
    run's measured/plan ratio means the same host everywhere); the reference host without usable facts."""
    if facts is None:
        return REFERENCE_HOST
    try:
        return host_from_facts(facts.model_dump(mode="json"))
    except ValueError:
        return REFERENCE_HOST


def planned_eta(recipe: Recipe | None, facts: HostFacts | None, gpus: int | None = None) -> Eta:
    """An Eta with the plan's step time; without one (no recipe, no config.json for the planner) it waits for the
    measured step time."""
    if recipe is None:
        return Eta(None)
    try:
        from ktdeploy.core.sizing import plan_recipe
        from ktdeploy.core.sizing.setup import setup_from
        from ktdeploy.core.sizing.throughput import throughput, time_model_id

        _plan, arch, _where = plan_recipe(recipe, gpus=gpus)
        train = dict(recipe.train or {})
        tp = throughput(setup_from(train, dict(recipe.accelerate or {}), gpus), arch, train, host_cpu(facts))
    except Exception:  # the planner needs the model's config.json; the ETA then comes from measured steps only
        return Eta(None)
    return Eta(tp.step_s, tp.tokens_per_s, time_model=time_model_id())
