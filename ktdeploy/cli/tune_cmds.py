"""`ktdeploy tune`: short real trials of the CPU-expert settings; the best that fits memory wins."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from ktdeploy.cli import app
from ktdeploy.cli.help import IN_IMAGE
from ktdeploy.cli.output import console, err_console, print_json
from ktdeploy.cli.recipe_cmds import SET_HELP
from ktdeploy.core.terminal_text import esc

if TYPE_CHECKING:   # the CLI imports the agent lazily (a fast --help)
    from ktdeploy.agent.tune.select import Trial


@app.command(rich_help_panel=IN_IMAGE)
def tune(
    recipe: Path = typer.Argument(..., help="Recipe YAML (its model, data and output volumes must exist on this host)."),
    budget_minutes: float = typer.Option(20.0, "--budget-minutes", min=1, help="Stop starting trials after this."),
    warmup_steps: int = typer.Option(3, "--warmup-steps", min=1, help="Steps left out of the measurement."),
    measure_steps: int = typer.Option(6, "--measure-steps", min=2, help="Steps measured per trial."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", metavar="DIR", help="Trial logs and tune.json (default: <deploy.volumes.output>/.ktdeploy-tune/<name>; trial outputs always stay on the output volume)."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the tune record as JSON."),
) -> None:
    """Measure the CPU-expert settings with short real trials; write tune.json.

    kt_num_threads / kt_threadpool_count / kt_max_cache_depth / kt_cpu_activation; apply the choice with
    `ktdeploy train --tuned tune.json` (the recipe file is never rewritten)."""
    from ktdeploy.agent.tune.session import tune as run_tune
    from ktdeploy.controller.local_host import local_facts

    def event(kind: str, trial: Trial | None) -> None:
        if kind == "done" and trial is not None:
            rate = f"{trial.tokens_per_s:.0f} tok/s" if trial.tokens_per_s else "-"
            err_console.print(f"  {trial.candidate.label():40s} {trial.status:14s} {rate:>12s}  ({trial.seconds:.0f} s)")
        elif kind == "start" and trial is not None:
            err_console.print(f"trial {esc(trial.candidate.label())} …")

    result = run_tune(str(recipe), set_, budget_minutes=budget_minutes, workdir=str(workdir) if workdir else None,
                      warmup_steps=warmup_steps, measure_steps=measure_steps, on_event=event,
                      facts=local_facts(probes=False))
    data = result.to_json()
    if as_json:
        print_json(data)
        return
    table = Table(title=f"ktdeploy tune — {esc(recipe.name)}")
    for col in ("setting", "status", "tokens/s", "peak host RSS GiB", "peak GPU GiB", "seconds"):
        table.add_column(col)
    for t in result.trials:
        mark = "[bold green]▶ " if t is result.chosen else ""
        table.add_row(mark + esc(t.candidate.label()), esc(t.status), f"{t.tokens_per_s:.0f}" if t.tokens_per_s else "-",
                      f"{t.peak_host_rss_gib:.2f}" if t.peak_host_rss_gib else "-",
                      f"{t.peak_gpu_gib:.2f}" if t.peak_gpu_gib else "-", f"{t.seconds:.0f}")
    console.print(table)
    if data["speedup_vs_all_cores"] and result.chosen is not None:
        console.print(f"chosen {esc(result.chosen.candidate.label())}: {data['speedup_vs_all_cores']:.2f}× the all-cores setting")
