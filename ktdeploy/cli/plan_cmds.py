"""`ktdeploy plan`: predicted peak host RSS, GPU memory per GPU and disk, and tokens/s and wall time, from
config.json and the recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, print_json
from ktdeploy.core.errors import UsageError
from ktdeploy.core.terminal_text import esc

_TITLES = {"host": "host memory (peak RSS, rank 0 owns the experts)", "gpu": "GPU memory (peak, per GPU)",
           "disk": "disk (output volume)"}


@app.command("plan")
def plan_cmd(
    recipe: Path = typer.Argument(..., help="Recipe YAML (train/accelerate/deploy sections)."),
    model_config: Optional[Path] = typer.Option(
        None, "--model-config", metavar="FILE|DIR", help="The model's config.json (or its directory). Default: "
        "<model_name_or_path>/config.json, else recipes/models/<basename>.json."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="Plan for N GPUs (num_processes) instead of the recipe's."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a recipe value: SECTION.KEY=VALUE, repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    explain: bool = typer.Option(False, "--explain", help="Every term behind each figure, with its formula and "
                                                          "source (default: the figures and a verdict)."),
    facts: Optional[Path] = typer.Option(None, "--facts", help="doctor's facts (`ktdeploy doctor --json`) of the host "
                                         "that will train: its cores and build set the time plan."),
    tuned: Optional[Path] = typer.Option(None, "--tuned", help="tune.json from `ktdeploy tune` on that host: its "
                                         "measured tokens/s replaces (or scales) the predicted one."),
    from_run: Optional[str] = typer.Option(None, "--from-run", metavar="RUN",
                                           help="A run of `ktdeploy up` on that host (its id, --name or id prefix): "
                                                "its measured step time over its plan scales this plan, on its host "
                                                "(its facts) unless --facts is given."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Dataset samples, for the run's wall time."),
    sample_tokens: Optional[int] = typer.Option(None, "--sample-tokens", min=1,
                                                help="Mean tokens per sample (default: samples fill cutoff_len)."),
    padded_ratio: Optional[float] = typer.Option(None, "--padded-ratio", min=1.0, max=64.0,
                                                 help="Padded over real tokens of a batch, with --sample-tokens "
                                                      "(default: estimated from the batch size)."),
) -> None:
    """Predict peak host RSS, GPU memory per GPU, disk and the time before downloading any weights: the figures
    and a verdict (with --facts: against that host); --explain shows every term behind them."""
    from ktdeploy.cli.plan_time import host_of, print_time_plan, run_scaled, terms_table, time_json, time_plan
    from ktdeploy.core.recipe import load_recipe, require_valid
    from ktdeploy.core.sizing import plan_recipe
    from ktdeploy.core.sizing.calibration import band, setting, upper_edge
    from ktdeploy.core.sizing.throughput import Workload

    if not recipe.is_file():
        raise UsageError(f"recipe {recipe} not found", key="RECIPE", fix="ktdeploy plan recipes/qwen35-397b-bf16-lora.yaml")
    if padded_ratio is not None and sample_tokens is None:
        raise UsageError("given without --sample-tokens: samples that fill cutoff_len have no padding",
                         key="--padded-ratio", fix=f"ktdeploy plan {recipe} --sample-tokens N --padded-ratio R")
    if from_run is not None and tuned is not None:
        raise UsageError("--from-run and --tuned both measure the host: give one", key="--from-run",
                         fix=f"ktdeploy plan {recipe} --from-run RUN (or --tuned tune.json)")
    if from_run is not None and sample_tokens is not None:
        raise UsageError("the run's measured/plan ratio already carries its dataset's sample lengths (its plan "
                         "assumed samples that fill cutoff_len)", key="--sample-tokens",
                         fix=f"ktdeploy plan {recipe} --from-run {from_run} (without --sample-tokens)")
    r = load_recipe(recipe, set_)
    require_valid(r)  # plan figures from a recipe `check` refuses (NaN, negative or absurd sizes) mean nothing
    plan, arch, where = plan_recipe(r, model_config, gpus)
    host = host_of(facts)
    if from_run is not None:
        tp, host = run_scaled(r, arch, gpus, host if facts is not None else None, Workload(samples=samples), from_run)
    else:
        tp = time_plan(r, recipe, arch, gpus, host, Workload(sample_tokens, padded_ratio, samples), tuned)
    if as_json:
        out = plan.to_json()
        n = plan.setup["num_processes"]
        out["error_band"] = {res: {"setting": setting(n), "band": None if (b := band(res, n)) is None else round(b, 4),
                                   "upper_edge_gib": round(upper_edge(v, res, n), 2)}
                             for res, v in (("host", plan.host_memory_gib), ("gpu", plan.gpu_memory_gib_per_gpu))}
        out["model"] = {"config": where, "family": arch.family,
                        "routed_expert_params": arch.routed_expert_params,
                        "non_expert_params": arch.non_expert_params, "total_params": arch.total_params}
        out["throughput"] = time_json(tp, host)
        print_json(out)
        return
    if not explain:
        from ktdeploy.cli.plan_summary import print_summary

        checks = None
        if facts is not None:   # doctor's own plan checks against that host (one source of truth)
            from ktdeploy.controller.up_inputs import load_facts_file
            from ktdeploy.core.checks.resources import gpu_present_check
            from ktdeploy.core.sizing.checks import plan_check_results

            hf = load_facts_file(facts)
            gpu = gpu_present_check(hf)   # no GPU at all: the GPU plan has nothing to be measured against
            checks = plan_check_results(r, hf, planned=(plan, arch, where)) + ([gpu] if gpu.status == "fail" else [])
        print_summary(recipe, plan, tp, host, checks)
        return
    console.print(f"[bold]{esc(recipe)}[/bold]  model config: {esc(where)}  ({esc(arch.family)}, "
                  f"{_count(arch.total_params)} params, {_count(arch.routed_expert_params)} in routed experts)")
    s = plan.setup
    console.print(f"setup: {esc(s['finetuning'])} · experts {esc(s['expert_format'])} · {esc(s['num_processes'])} GPU(s) · "
                  f"cutoff {s['cutoff_len']} x batch {s['batch']} · cache depth {s['cache_depth']} · "
                  f"KT rows {s['kt_max_len']}")
    for resource, total in (("host", plan.host_memory_gib), ("gpu", plan.gpu_memory_gib_per_gpu),
                            ("disk", plan.disk_gib)):
        title = f"{_TITLES[resource]}: {total:.1f} GiB"
        b = band(resource, s["num_processes"])
        if b is not None:
            title += (f" ± {b * 100:.1f} % ({setting(s['num_processes'])} calibration band; "
                      f"upper edge {upper_edge(total, resource, s['num_processes']):.1f} GiB is what doctor gates on)")
        console.print(terms_table(title, "GiB", plan.terms(resource), "{:.2f}"))
    for n in plan.notes:
        console.print(f"[yellow]note[/yellow] {esc(n)}")
    print_time_plan(tp, host)
    console.print("Figures are predicted peaks (GiB = 2^30 B) without a safety margin; "
                  "bench/results/planner-calibration.md compares them with measured runs.")


def _count(n: float) -> str:
    """A parameter count as a person reads it: billions, or millions below one (the tiny model: 33.2 M, not 0.0 B)."""
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
