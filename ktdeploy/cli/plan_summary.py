"""`ktdeploy plan`'s default answer: the few figures that decide a run — host memory, GPU memory, disk, the time
with its band — and a verdict (with `--facts`: doctor's own plan checks against that host; without: what a host
needs). The terms behind each figure: `plan --explain` (cli/plan_cmds.py)."""

from __future__ import annotations

from pathlib import Path

from ktdeploy.cli.output import console, wrap_words
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.sizing.calibration import band, upper_edge
from ktdeploy.core.sizing.estimate import ResourcePlan
from ktdeploy.core.sizing.throughput import REFERENCE_HOST, HostCPU, ThroughputPlan

LABEL = 13


def hms(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def _row(label: str, text: str, style: str = "") -> None:
    from rich.text import Text

    for ln in wrap_words(text, console.width, f"{label:<{LABEL}}", " " * LABEL):
        console.print(Text(ln, style=style), highlight=False, soft_wrap=True)


def _memory(plan: ResourcePlan, resource: str, total: float, what: str) -> str:
    n = plan.setup["num_processes"]
    b = band(resource, n)
    if b is None:
        return f"{total:.1f} GiB {what}"
    return (f"{total:.1f} GiB {what} ± {b * 100:.1f} % (doctor gates on the band's upper edge, "
            f"{upper_edge(total, resource, n):.1f} GiB)")


def time_text(tp: ThroughputPlan) -> str:
    text = f"{tp.tokens_per_s:.1f} tokens/s ± {tp.band * 100:.0f} %, {tp.step_s:.2f} s per step"
    if tp.wall_time_s is not None:
        text += (f"; {tp.steps} steps: {hms(tp.wall_time_s)} ({hms(tp.wall_time_s / (1 + tp.band))}"
                 f"-{hms(tp.wall_time_s / (1 - tp.band))})")
    else:
        text += "; the run's wall time needs its length: --samples N (or train.max_steps in the recipe)"
    if tp.predicted_tokens_per_s is not None:
        text += f"; measured by {tp.measured_by or '`ktdeploy tune`'} (the model predicted {tp.predicted_tokens_per_s:.1f})"
    return text


def print_summary(recipe: Path, plan: ResourcePlan, tp: ThroughputPlan, host: HostCPU,
                  checks: list[CheckResult] | None) -> None:
    """``checks``: doctor's plan.host_memory / plan.gpu_memory / plan.disk against the --facts host, else None."""
    s = plan.setup
    _row("recipe", f"{recipe}: {s['finetuning']}, experts {s['expert_format']}, {s['num_processes']} GPU(s), "
                   f"cutoff {s['cutoff_len']} x batch {s['batch']}")
    _row("host memory", _memory(plan, "host", plan.host_memory_gib, "peak RSS"))
    _row("GPU memory", _memory(plan, "gpu", plan.gpu_memory_gib_per_gpu, "per GPU"))
    _row("disk", f"{plan.disk_gib:.1f} GiB on the output volume")
    _row("time", time_text(tp))
    if host is REFERENCE_HOST:
        _row("", f"on the reference host ({host.source.removeprefix('reference host: ')}); --facts FILE (its "
                 "`ktdeploy doctor --json`) plans for another", style="dim")
    _verdict(recipe, plan, checks)
    notes = len(plan.notes) + len(tp.notes)
    _row("", f"The terms behind each figure{f' and {notes} note(s)' if notes else ''}: "
             f"ktdeploy plan {recipe} --explain", style="dim")


def _verdict(recipe: Path, plan: ResourcePlan, checks: list[CheckResult] | None) -> None:
    n = plan.setup["num_processes"]
    if checks is None:
        _row("verdict", f"needs {upper_edge(plan.host_memory_gib, 'host', n):.1f} GiB of available host memory and "
                        f"{upper_edge(plan.gpu_memory_gib_per_gpu, 'gpu', n):.1f} GiB free on each of {n} GPU(s); "
                        f"does this machine have them? ktdeploy doctor --recipe {recipe} (another host: add --host, or "
                        "plan with --facts from its `ktdeploy doctor --json`)")
        return
    failed = [c for c in checks if c.status == "fail"]
    unknown = [c.name for c in checks if c.status == "skip"]
    if not failed:
        text = "fits this host" + (f" (not known there: {', '.join(unknown)})" if unknown else "")
        _row("verdict", text, style="green")
        return
    _row("verdict", f"does not fit this host: {', '.join(c.name for c in failed)}", style="red")
    for c in failed:
        _row("", f"{c.name}: {c.detail}")
        if c.fix:
            _row("", f"fix: {c.fix}", style="green")
