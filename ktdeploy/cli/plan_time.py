"""`ktdeploy plan`'s time section: the host from `--facts`, the measurement from `--tuned`, and the rendering."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from ktdeploy.cli.output import console
from ktdeploy.core.errors import UsageError
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.safeio import load_json
from ktdeploy.core.sizing.model_config import MoEArchitecture
from ktdeploy.core.sizing.setup import setup_from
from ktdeploy.core.sizing.terms import Term
from ktdeploy.core.sizing.throughput import (
    CALIBRATION,
    REFERENCE_HOST,
    HostCPU,
    ThroughputPlan,
    Workload,
    host_from_facts,
    run_step_times,
    throughput,
    tuned_rate,
)
from ktdeploy.core.terminal_text import esc


def host_of(facts: Path | None) -> HostCPU:
    if facts is None:
        return REFERENCE_HOST
    data = load_json(facts, what="doctor facts file (`ktdeploy doctor --json`)")
    if not isinstance(data, dict):
        raise UsageError(f"{facts}: not a facts object", key="--facts", fix="give `ktdeploy doctor --json`'s output")
    try:
        return host_from_facts(data)
    except (ValueError, TypeError, AttributeError) as err:
        raise UsageError(f"{facts}: {err}", key="--facts", fix="give `ktdeploy doctor --json`'s output") from None


def _same_recipe(a: str, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def time_plan(recipe: Recipe, recipe_path: Path, arch: MoEArchitecture, gpus: int | None, host: HostCPU,
              work: Workload, tuned: Path | None) -> ThroughputPlan:
    """The time plan; after `ktdeploy tune`, its measured tokens/s: directly when tune measured this recipe (with
    the chosen threads), else as this host's speed over the model's for tune's recipe, applied to this one."""
    train = dict(recipe.train or {})
    s = setup_from(train, dict(recipe.accelerate or {}), gpus)
    if tuned is None:
        return throughput(s, arch, train, host, work)
    data = load_json(tuned, what="tune record (tune.json)")
    got = tuned_rate(data) if isinstance(data, dict) else None
    if got is None:
        raise UsageError(f"{tuned}: no measured tokens/s (chosen_tokens_per_s)", key="--tuned",
                         fix="give the tune.json `ktdeploy tune` wrote after a trial that succeeded")
    rate, chosen = got
    kt = dict(train.get("kt_config") or {})
    kt.update({k: v for k, v in chosen.items() if v is not None})
    train["kt_config"] = kt
    tune_recipe = str(data.get("recipe") or "")
    if _same_recipe(tune_recipe, recipe_path):
        return throughput(s, arch, train, host, Workload(None, 1.0, work.samples), measured_tokens_per_s=rate)
    # another recipe: this host's measured / predicted speed on it scales this recipe's prediction
    from ktdeploy.core.recipe import load_recipe
    from ktdeploy.core.sizing.model_config import resolve_model_config
    try:
        other = load_recipe(tune_recipe)
        oarch, _ = resolve_model_config(other.train)
    except (UsageError, OSError, ValueError) as err:
        raise UsageError(f"{tuned}: its recipe {tune_recipe!r} cannot be planned here ({str(err)[:120]})",
                         key="--tuned", fix="run `ktdeploy tune` on this recipe, or plan without --tuned") from None
    otrain = dict(other.train or {})
    okt = dict(otrain.get("kt_config") or {})
    okt.update({k: v for k, v in chosen.items() if v is not None})
    otrain["kt_config"] = okt
    opred = throughput(setup_from(otrain, dict(other.accelerate or {})), oarch, otrain, host).tokens_per_s
    mine = throughput(s, arch, train, host, work)
    scaled = throughput(s, arch, train, host, work, measured_tokens_per_s=mine.tokens_per_s * rate / opred)
    scaled.notes[0] = (f"this host measured {rate:.1f} tokens/s on {tune_recipe} (`ktdeploy tune`), the model "
                       f"predicted {opred:.1f} there: this recipe's {mine.tokens_per_s:.1f} scaled by "
                       f"{rate / opred:.2f}")
    return scaled


def _hms(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def terms_table(title: str, unit: str, terms: Sequence[Term], fmt: str) -> Table:
    """A plan's terms as a table: name, value in ``unit``, the formula with its figures and sources."""
    t = Table(title=title, title_justify="left", expand=False)
    t.add_column("term", style="bold", no_wrap=True)
    t.add_column(unit, justify="right", no_wrap=True)
    t.add_column("why", overflow="fold")
    for term in terms:
        t.add_row(esc(term.name), fmt.format(term.value), esc(term.explanation))
    return t


def run_scaled(recipe: Recipe, arch: MoEArchitecture, gpus: int | None, host: HostCPU | None, work: Workload,
               run: str) -> tuple[ThroughputPlan, HostCPU]:
    """This recipe's time plan scaled by a finished run's measured / planned step time (its record's eta.json), on
    ``host`` (--facts), else on the run's own host (the record's facts, what its plan was made for)."""
    from ktdeploy.controller.runs import latest_run
    from ktdeploy.core import run_record as rr
    from ktdeploy.core.errors import RunRecordError

    try:
        rec = latest_run(run_id=run)
    except UsageError as err:     # the id's own check names --run: here the flag is --from-run
        raise UsageError(err.message.replace("--run ", "", 1), key="--from-run", fix=err.fix) from None
    if not os.path.lexists(rec.path / "eta.json"):
        raise UsageError(f"run {rec.id} has no eta.json: it never reached training", key="--from-run",
                         fix="give a run that trained (`ktdeploy status --all` lists them), or use `ktdeploy tune`")
    try:
        eta = rec.read_json("eta.json")
    except RunRecordError as err:
        raise RunRecordError(err.message, key="--from-run", fix=err.fix) from None
    if not isinstance(eta, dict):
        raise UsageError(f"run {rec.id}: its eta.json is not an object", key="--from-run",
                         fix=f"inspect {rec.path}, or give another run (`ktdeploy status --all`)")
    try:
        planned, measured = run_step_times(eta)
    except ValueError as err:
        raise UsageError(f"run {rec.id}: {err}", key="--from-run",
                         fix="give a run this ktdeploy planned and that trained two steps or more, or use "
                             "`ktdeploy tune` on the host") from None
    if host is None:
        try:
            host = host_from_facts(rec.read_json(rr.FACTS))
        except (RunRecordError, ValueError, AttributeError, TypeError) as err:
            raise UsageError(f"run {rec.id}: its host facts cannot be read ({str(err)[:120]})", key="--from-run",
                             fix="pass that host's facts with --facts (`ktdeploy doctor --json`)") from None
        host = HostCPU(host.cores, host.numa_nodes, host.build, f"run {rec.id}'s host facts: {host.cores} cores, "
                       f"{host.build} build")
    train = dict(recipe.train or {})
    s = setup_from(train, dict(recipe.accelerate or {}), gpus)
    mine = throughput(s, arch, train, host, work)
    scaled = throughput(s, arch, train, host, work, measured_tokens_per_s=mine.tokens_per_s * planned / measured,
                        measured_by=f"run {rec.id}")
    scaled.notes[0] = (f"run {rec.id} on this host measured {measured:.3g} s per step where its plan said "
                       f"{planned:.3g} (measured/plan {measured / planned:.2f}): this recipe's {mine.tokens_per_s:.1f} "
                       f"tokens/s scaled by {planned / measured:.2f}")
    # its plan assumed samples that fill cutoff_len and its steps ran on its own dataset: the ratio carries that
    scaled.notes = [n for n in scaled.notes if not n.startswith("tokens/s assumes samples")] + [
        f"the step time is the run's, on its own dataset; tokens/s counts samples that fill cutoff_len "
        f"({s.cutoff_len}), so with shorter samples it overstates the real tokens while the step and wall times hold"]
    return scaled, host


def print_time_plan(tp: ThroughputPlan, host: HostCPU) -> None:
    band = f"± {tp.band * 100:.0f} %"
    title = f"time: {tp.tokens_per_s:.1f} tokens/s {band}, {tp.step_s:.2f} s per step"
    if tp.wall_time_s is not None:
        title += (f", {tp.steps} steps: {_hms(tp.wall_time_s)} ({_hms(tp.wall_time_s / (1 + tp.band))}"
                  f"-{_hms(tp.wall_time_s / (1 - tp.band))})")
    console.print(terms_table(title, "s", tp.terms, "{:.3g}"))
    console.print(f"host: {esc(host.source)}; band: calibration in {CALIBRATION}")
    if tp.predicted_tokens_per_s is not None:
        console.print(f"predicted {tp.predicted_tokens_per_s:.1f} tokens/s by the model, measured "
                      f"{tp.tokens_per_s:.1f} on this host")
    for n in tp.notes:
        console.print(f"[yellow]note[/yellow] {esc(n)}")


def time_json(tp: ThroughputPlan, host: HostCPU) -> dict[str, Any]:
    out = tp.to_json()
    out["host"] = {"cores": host.cores, "numa_nodes": host.numa_nodes, "build": host.build, "source": host.source}
    return out
