"""How early a job is warned before it must end (pure): Slurm's ``--signal=B:USR1@N`` and Kubernetes'
``terminationGracePeriodSeconds`` are the same N, in which the trainer must finish the step it is in, save a
checkpoint at that boundary and exit.

    N = 2 x step + 2 x save + 60 s        (at least 120 s, at most Slurm's 65535)

``step``: the measured seconds per step when the recipe gives them (deploy.scheduler.step_seconds), else the
planner's figure at the slow edge of its band (core/sizing/throughput.py, on its reference host), else 600 s. ``save``:
the planner's seconds to write one checkpoint (trainable weights, and their optimizer state unless save_only_model).
Twice each: a step slower than planned, a save on a slow volume. 60 s: the container's exit, the script's requeue,
and Slurm's own granularity (it may signal up to 60 s early, sbatch(1)). deploy.scheduler.signal_seconds overrides.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.document import Recipe

MARGIN_S = 60
MIN_S, MAX_S = 120, 65535
UNKNOWN_STEP_S = 600.0


@dataclass(frozen=True)
class SignalPlan:
    seconds: int
    basis: str
    step_s: float | None = None
    save_s: float | None = None


def warn_seconds(step_s: float, save_s: float) -> int:
    return max(MIN_S, min(MAX_S, math.ceil(2 * step_s + 2 * save_s + MARGIN_S)))


def planner_step(recipe: Recipe) -> tuple[float, float, str] | None:
    """(step seconds at the band's slow edge, one save's seconds, basis) from the planner, None without a model
    config it can read."""
    try:
        from ktdeploy.core.sizing import plan_recipe
        from ktdeploy.core.sizing.setup import setup_from
        from ktdeploy.core.sizing.throughput import (
            REFERENCE_HOST,
            TIME_CONSTANTS,
            Workload,
            save_seconds,
            step_shape,
            throughput,
        )

        gpus = len(recipe.require_deploy().gpus)
        _plan, arch, where = plan_recipe(recipe, gpus=gpus)
        train, acc = dict(recipe.train or {}), dict(recipe.accelerate or {})
        setup = setup_from(train, acc, gpus)
        tp = throughput(setup, arch, train)
        shape = step_shape(setup, arch, REFERENCE_HOST, Workload(), train, TIME_CONSTANTS)
        save = save_seconds(setup, shape, arch, TIME_CONSTANTS)
    except Exception:  # no config.json the planner can read: the caller falls back
        return None
    slow = tp.step_s / max(0.05, 1 - tp.band)
    return slow, save, f"the planner's step time {slow:.1f} s (slow edge of its band; {where.rsplit('/', 1)[-1]})"


def signal_plan(recipe: Recipe) -> SignalPlan:
    sched = recipe.require_deploy().scheduler
    if sched.signal_seconds is not None:
        return SignalPlan(sched.signal_seconds, "deploy.scheduler.signal_seconds")
    planned = planner_step(recipe)
    save = planned[1] if planned else 0.0
    if sched.step_seconds is not None:
        step, basis = sched.step_seconds, f"the measured step time {sched.step_seconds:g} s (deploy.scheduler.step_seconds)"
    elif planned is not None:
        step, basis = planned[0], planned[2]
    else:
        step, basis = UNKNOWN_STEP_S, f"no step time known (no model config for the planner): {UNKNOWN_STEP_S:.0f} s assumed"
    n = warn_seconds(step, save)
    return SignalPlan(n, f"2 x {basis} + 2 x {save:.1f} s to save a checkpoint + {MARGIN_S} s", step, save)


SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_time_seconds(text: str) -> int:
    """Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch(1))."""
    m = SLURM_TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    assert a is not None   # the pattern's second group is not optional
    if days is not None:     # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:        # HH:MM:SS
        return a * 3600 + (b or 0) * 60 + c
    return a * 60 + (b or 0)     # MM[:SS]


def require_room(recipe: Recipe, plan: SignalPlan) -> None:
    """RecipeError when the warning would come before the job has run a step: the time limit is too short."""
    sched = recipe.require_deploy().scheduler
    limit = slurm_time_seconds(sched.time)
    if plan.seconds >= limit:
        raise RecipeError(f"the job is warned {plan.seconds} s before its time limit ({plan.basis}), and the limit "
                          f"deploy.scheduler.time={sched.time} is only {limit} s: it would save and requeue before "
                          "training a step", key="deploy.scheduler.time",
                          fix=f"Give the job more than {plan.seconds} s (deploy.scheduler.time), or set "
                              "deploy.scheduler.step_seconds to the measured step time (or signal_seconds).")
