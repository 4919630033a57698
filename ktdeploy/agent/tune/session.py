"""tune(): candidates from the host facts, trials in two stages within the budget, the choice, the record."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ktdeploy.agent.tune.candidates import Candidate, stage_one, stage_two
from ktdeploy.agent.tune.runner import TrialSpec, run_trial, trial_out_dir, trial_sets
from ktdeploy.agent.tune.select import Trial, choose
from ktdeploy.core.errors import StepError, UsageError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe import load_recipe, require_valid
from ktdeploy.core.recipe.rules_base import inside

GIB = 1024 ** 3


@dataclass
class TuneResult:
    recipe: str
    host: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)
    chosen: Trial | None = None
    baseline: Trial | None = None       # the cookbook's setting: all physical cores, one pool per NUMA node
    budget_s: float = 0.0
    spent_s: float = 0.0

    def chosen_values(self) -> dict[str, Any]:
        if not self.chosen:
            return {}
        return {k: v for k, v in self.chosen.candidate.to_json().items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        speedup = None
        if self.chosen and self.baseline and self.baseline.tokens_per_s and self.chosen.tokens_per_s:
            speedup = round(self.chosen.tokens_per_s / self.baseline.tokens_per_s, 3)
        return {"recipe": self.recipe, "host": self.host, "budget_s": self.budget_s, "spent_s": round(self.spent_s, 1),
                "chosen": self.chosen_values(), "chosen_tokens_per_s": self.chosen.tokens_per_s if self.chosen else None,
                "baseline": self.baseline.to_json() if self.baseline else None, "speedup_vs_all_cores": speedup,
                "trials": [t.to_json() for t in self.trials]}


def tune(recipe_path: str, overrides: Sequence[str] = (), *, budget_minutes: float = 20.0, workdir: str | None = None,
         warmup_steps: int = 3, measure_steps: int = 6, facts: HostFacts | None = None,
         on_event: Callable[[str, Trial | None], None] | None = None) -> TuneResult:
    recipe = load_recipe(recipe_path, list(overrides))
    require_valid(recipe)
    if facts is None:  # the CLI gathers this host's facts and hands them in (the agent never imports the controller)
        raise ValueError("tune() needs facts= (this host's HostFacts)")
    cores = facts.cpu.physical_cores or facts.cpu.logical_cpus
    if not cores:
        raise UsageError("the number of physical cores could not be read", fix="run `ktdeploy doctor` to see the CPU facts")
    nodes = max(1, len(facts.cpu.numa_nodes))
    host_limit = facts.memory.available_bytes / GIB * 0.9 if facts.memory.available_bytes else None
    gpu_limit = min((g.memory_total_mib / 1024 for g in facts.gpu.gpus if g.memory_total_mib), default=None)
    if recipe.deploy is None:  # a valid recipe file has a deploy section; say so rather than crash if not
        raise UsageError("the recipe has no deploy section", fix="add `deploy:` with volumes.model, volumes.data and "
                         "volumes.output")
    vol_out = Path(recipe.deploy.volumes.output)
    on_volume = vol_out / ".ktdeploy-tune" / recipe.name
    wd = Path(workdir) if workdir else on_volume
    # trial outputs obey train's rule (output_dir inside deploy.volumes.output) wherever --workdir points
    trials_root = wd if inside(os.path.abspath(wd), str(vol_out)) else on_volume
    spec = TrialSpec(str(recipe_path), list(overrides), wd, warmup_steps, measure_steps, trials_root=trials_root)
    first_trial = stage_one(cores, nodes)[0]
    # every trial is the recipe plus a few keys: check that once here, so a bad recipe starts no trial
    require_valid(load_recipe(recipe_path, trial_sets(spec, first_trial, trial_out_dir(spec, 0))))
    wd.mkdir(parents=True, exist_ok=True)
    trials_root.mkdir(parents=True, exist_ok=True)
    result = TuneResult(str(recipe_path), {"physical_cores": cores, "numa_nodes": nodes,
                                           "host_memory_limit_gib": host_limit, "gpu_memory_limit_gib": gpu_limit},
                        budget_s=budget_minutes * 60)
    start = time.monotonic()
    last_cost = 0.0

    def run(cands: list[Candidate]) -> None:
        nonlocal last_cost
        for cand in cands:
            spent = time.monotonic() - start
            if spent + last_cost > result.budget_s:
                t = Trial(cand, status="skipped-budget", note=f"{spent:.0f} s spent, last trial took {last_cost:.0f} s")
                result.trials.append(t)
                if on_event:
                    on_event("skipped", t)
                continue
            best = max((t.tokens_per_s for t in result.trials if t.status == "ok" and t.tokens_per_s), default=None)
            if on_event:
                on_event("start", Trial(cand))
            t = run_trial(spec, cand, len(result.trials), best,
                          on_tick=(lambda msg: on_event(msg, None)) if on_event else None)
            last_cost = t.seconds
            result.trials.append(t)
            if on_event:
                on_event("done", t)

    run(stage_one(cores, nodes))
    result.baseline = result.trials[0] if result.trials and result.trials[0].status == "ok" else None
    first = choose(result.trials, host_limit, gpu_limit)
    if first is None:
        result.spent_s = time.monotonic() - start
        notes = "; ".join(f"{t.candidate.label()}: {t.status} {t.note}" for t in result.trials)
        raise StepError(f"no tuning trial completed: {notes}", step="tune",
                        fix=f"look at the trial logs in {wd}; run `ktdeploy train --dry-run` to check the recipe")
    gc = recipe.keys.disable_gradient_checkpointing is not True
    retain_fits = (host_limit is None or first.peak_host_rss_gib is None or first.peak_host_rss_gib * 1.3 < host_limit)
    run(stage_two(first.candidate, cores, nodes, cache_depth=recipe.kt_config.get("kt_max_cache_depth"),
                  retain_fits=retain_fits and recipe.keys.kt_cpu_activation != "retain", gradient_checkpointing=gc))
    result.chosen = choose(result.trials, host_limit, gpu_limit)
    result.spent_s = time.monotonic() - start
    from ktdeploy.core.safeio import write_file

    write_file(wd, "tune.json", json.dumps(result.to_json(), indent=2), overwrite=True)
    return result


def _read_record(tune_json: str | Path) -> dict[str, Any]:
    from ktdeploy.core.safeio import parse_json, read_bytes

    try:
        data = parse_json(read_bytes(tune_json, 1 << 20, "tune record"))  # bounded, regular files only
    except ValueError as err:  # bad JSON, too deep, a 5,000-digit integer: all ValueError from parse_json
        raise UsageError(f"{tune_json}: not a tune record ({err})", fix="give the tune.json written by `ktdeploy tune`") from None
    if not isinstance(data, dict) or not data.get("chosen"):
        raise UsageError(f"{tune_json}: the tune record holds no choice", fix="run `ktdeploy tune` again")
    _check_choice(tune_json, data)
    return data


# what a tune record's "chosen" may hold: Candidate's fields, as `ktdeploy tune` writes them (None left out)
_COUNTS = ("kt_num_threads", "kt_threadpool_count")
_ACTIVATIONS = ("retain", "recompute")     # LlamaFactory's Literal for kt_cpu_activation


def _check_choice(tune_json: str | Path, data: dict) -> None:
    """The choice applied to the training YAML is exactly Candidate's keys with their types: a key with junk
    around it (``"kt_num_threads "``, ``"kt_num_threads.x"``) would land on another key, a list where a count
    belongs would reach the trainer. Refused (exit 2), naming the key."""
    from dataclasses import fields

    from ktdeploy.core.safeio import printable

    def bad(what: str) -> UsageError:
        return UsageError(f"{tune_json}: {what}; not what `ktdeploy tune` writes", key="--tuned",
                          fix="give the tune.json `ktdeploy tune` wrote (run it again if it was edited)")

    chosen = data["chosen"]
    if not isinstance(chosen, dict):
        raise bad(f"'chosen' is a {type(chosen).__name__}, not a mapping of settings")
    known = [f.name for f in fields(Candidate)]
    for key, value in chosen.items():
        if key not in known:
            raise bad(f"'chosen' has the key {printable(key, 80)}, which is none of {', '.join(known)}")
        ok = (value is None and key not in _COUNTS) or (
            value in _ACTIVATIONS if key == "kt_cpu_activation" else
            isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1 << 20)
        if not ok:
            raise bad(f"chosen.{key} is {printable(json.dumps(value)[:80], 100)}, not "
                      + (f"one of {', '.join(_ACTIVATIONS)}" if key == "kt_cpu_activation" else "a whole number >= 1"))
    for key in _COUNTS:
        if key not in chosen:
            raise bad(f"'chosen' has no {key}")
    for key in ("chosen_tokens_per_s", "speedup_vs_all_cores"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise bad(f"{key} is {printable(json.dumps(v)[:80], 100)}, not a number")


def tuned_choice(tune_json: str | Path) -> dict[str, Any]:
    """What a training run records about the tune choice it applies (its run record's tuned.json)."""
    data = _read_record(tune_json)
    return {"source": str(Path(tune_json).resolve()), "chosen": data["chosen"],
            "chosen_tokens_per_s": data.get("chosen_tokens_per_s"),
            "speedup_vs_all_cores": data.get("speedup_vs_all_cores"), "host": data.get("host")}


def tuned_overrides(tune_json: str | Path) -> list[str]:
    """`--set` overrides that apply a tune record's choice to the run's rendered training YAML."""
    chosen = _read_record(tune_json)["chosen"]
    out = []
    for key, value in sorted(chosen.items()):
        if value is None:
            continue
        path = f"train.{key}" if key == "kt_cpu_activation" else f"train.kt_config.{key}"
        out.append(f"{path}={json.dumps(value)}")
    return out
