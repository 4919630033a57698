"""`up`'s terminal output: each event of the run (core/events.py) as its line(s), and a progress bar while training
is followed. The one module that puts the run's values into rich markup: every value from outside (a path, a
host's answer, a check's detail, a trainer log's field) is escaped here (``_fill``, the bar's fields), so a
``[/x]`` in it prints as text, never as a tag; SafeConsole then shows any control character as an escape."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.text import Text

from ktdeploy.core import events as ev
from ktdeploy.core.checks.gate import REPAIRED_BY
from ktdeploy.core.terminal_text import esc
from ktdeploy.core.trainer_log import LogEntry, describe

OK, NO, GO, NOT = "[green]✓[/green]", "[red]✗[/red]", "[cyan]→[/cyan]", "[yellow]-[/yellow]"
WAIVED, TO_REPAIR = "  [yellow]waived[/yellow]", "  [yellow]to repair[/yellow]"
# a Said line's look: its mark's sign, and the style of its lead
SIGN = {ev.Mark.OK: OK, ev.Mark.GO: GO, ev.Mark.NOT: NOT, ev.Mark.DONE: "", ev.Mark.STARTED: ""}
LEAD_STYLE = {ev.Mark.DONE: "green bold", ev.Mark.STARTED: "green"}


class _Escaped:
    """An event whose fields read escaped, for ``{e.NAME}`` in a template."""

    def __init__(self, event: ev.Event | None) -> None:
        self._event = event

    def __getattr__(self, name: str) -> str:
        return esc(getattr(self._event, name))


def _fill(template: str, event: ev.Event | None = None, **values: Any) -> str:
    """``template`` (markup) with the event's fields (``{e.NAME}``) and ``values`` put in, each escaped."""
    return template.format(e=_Escaped(event), **{k: esc(v) for k, v in values.items()})


def _said(e: ev.Said) -> list[str]:
    sign = SIGN[e.mark]
    head = (sign + " " if sign else "") + (f"{e.stage}: " if e.stage else "")
    style = LEAD_STYLE.get(e.mark)
    lead = (f"[{style}]{esc(e.lead)}[/] " if style else f"{esc(e.lead)} ") if e.lead else ""
    return [head + lead + esc(e.text)]


def _waivers(e: ev.WaiversRecorded) -> list[str]:
    profile = [_fill("[bold yellow]CPU-only test profile: the GPU checks are waived here and in the containers, "
                     "which start without GPUs — recorded in {e.status_file}[/]", e)] if e.profile else []
    also = [_fill("[bold yellow]WARNING: " + ("also " if e.profile else "") + "waiving checks {checks} — "
                  "recorded in {e.status_file}[/]", e, checks=", ".join(e.also))] if e.also else []
    return profile + also


def _doctor(e: ev.DoctorVerdict) -> list[str]:
    return [_fill((NO if e.blocking else OK) + " PREFLIGHT: doctor on {e.where}: {e.summary_text}", e)] + \
        [_fill(WAIVED + " {name}: {detail}", name=c.name, detail=c.detail) for c in e.waived] + \
        [_fill(TO_REPAIR + " {name}: {detail} -> the {stage} stage " + ("converts them" if stage == "WEIGHTS" else
               "installs what is missing"), name=c.name, detail=c.detail, stage=stage)
         for c in e.deferred for stage in (REPAIRED_BY.get(c.name, "RUNTIME"),)]


def _image_checked(e: ev.ImageChecked) -> list[str]:
    return [_fill(WAIVED + " {name} ({layer}): {detail}", name=c.name, layer=c.layer, detail=c.detail)
            for c in e.waived] + ([] if e.failed else [_fill("  image check: {e.summary_text}", e)])


def _synced(e: ev.Synced) -> list[str]:
    if e.dry_run:
        return []
    return [_fill(OK + " SYNC: {e.remote} holds the {e.files} file(s) of {e.local} ({size}), checked by size and "
                  "SHA-256", e, size=ev.size_text(e.bytes))]


def _detached(e: ev.Detached) -> list[str]:
    if e.terminated:
        return []
    return [_fill("[yellow]Stopped following; the training container {e.job} keeps running on {e.host}.[/]\n"
                  "  ktdeploy status --host {e.host}   |   ktdeploy logs -f --host {e.host}   |   "
                  "{again} to go on", e, again=e.again or "ktdeploy up (same args)")]


def _scores(metrics: Any) -> str:
    return " ".join(f"{k} {v:.1f}" for k, v in metrics.items()) or "no score"


def _eval_started(e: ev.EvalStarted) -> list[str]:
    return [_fill(GO + " EVAL: {e.samples} sample(s) from {e.source} against {e.url} (tuned {e.tuned}"
                  + (", base {e.base})" if e.base else "; no base: {e.base_why})"), e)]


def _eval_progressed(e: ev.EvalProgressed) -> list[str]:
    eta = f", eta {e.eta_s:.0f} s" if e.eta_s is not None else ""
    return [_fill("  eval {e.done}/{e.total}{eta}{failed}", e, eta=eta, failed=f", {e.failed} failed" if e.failed else "")]


def _eval_finished(e: ev.EvalFinished) -> list[str]:
    head = _fill((NO if e.below else OK) + " EVAL: tuned {tuned}" + ("; base {base}" if e.base else "")
                 + "{failed} -> {path}", e, tuned=_scores(e.tuned), path=e.summary_file, base=_scores(e.base or {}),
                 failed=f" ({e.failed} failed)" if e.failed else "")
    return [head] + ([_fill("[red]{e.below}[/red]; the server keeps running", e)] if e.below else [])


def _template(markup: str) -> Callable[[Any], list[str]]:
    return lambda e: [_fill(markup, e)]


# each shown event's line(s): a function of the event, or a template of its fields
RENDER: dict[type[ev.Event], Callable[[Any], list[str]]] = {
    ev.Said: _said,
    ev.WaiversRecorded: _waivers,
    ev.DoctorVerdict: _doctor,
    ev.ImageChecked: _image_checked,
    ev.Synced: _synced,
    ev.Detached: _detached,
    ev.PlanningFromFacts: _template(NOT + " PREFLIGHT: not connecting to {e.host}; planning from the facts in {e.path}"),
    ev.Connected: _template(OK + " PREFLIGHT: connected to {e.connector}"),
    ev.SlurmFit: lambda e: [_fill((NO if e.check.status == "fail" else OK) + " PREFLIGHT: {name}: {detail}",
                                  name=e.check.name, detail=e.check.detail)],
    ev.SlurmCheck: lambda e: [_fill({"fail": NO, "warn": "[yellow]![/yellow]"}.get(e.check.status, OK)
                                    + " PREFLIGHT: {name}: {detail}", name=e.check.name, detail=e.check.detail)]
                             + ([_fill("  fix: {fix}", fix=e.check.fix)] if e.check.status != "pass" and e.check.fix
                                else []),
    ev.ResumeNote: _template("[yellow]note:[/yellow] {e.note}"),
    ev.StageSkipped: _template("[dim]- {e.stage}: skipped ({e.reason})[/dim]"),
    ev.StepSatisfied: _template(OK + " {e.stage}: {e.title} [dim](already satisfied: {e.why})[/dim]"),
    ev.StepProbed: _template(OK + " {e.stage}: {e.title} [dim](already satisfied)[/dim]"),
    ev.FetchRefused: _template("[yellow]![/yellow] {e.stage}: not fetched: {e.remote} {e.why}"),
    ev.Progress: lambda e: [_fill("  {line}", line=describe(e.entry))],
    ev.SlurmSubmitted: _template("  submitted {e.role} job {e.job_id}"),
    ev.SlurmJobState: lambda e: [_fill("  {line}", line=e.job.describe())],
    ev.Cancelled: lambda e: [_fill("[yellow]Terminated: cancelled {jobs}.[/]",
                                   jobs=", ".join(f"{k}: {v}" for k, v in e.jobs.items()))],
    ev.EvalStarted: _eval_started,
    ev.EvalProgressed: _eval_progressed,
    ev.EvalFinished: _eval_finished,
    ev.EvalNotRun: lambda e: [_fill("[yellow]![/yellow] EVAL did not finish: {e.why} (the server keeps running)", e),
                              _fill("  fix: {e.fix}", e)],
}


def lines(e: ev.Event) -> list[str]:
    """The markup lines ``e`` shows as; none for an event that is only recorded (or drawn by the bar)."""
    render = RENDER.get(type(e))
    return render(e) if render is not None else []


def plain_lines(e: ev.Event) -> list[str]:
    """The lines ``e`` shows as, without their styles (a Python caller's log, tests)."""
    return [Text.from_markup(line).plain for line in lines(e)]


def _breaks(plain: str, first: int, rest: int) -> list[int]:
    """Offsets where a line of ``plain`` breaks: before a word that would pass the width (``first`` for the first
    line, ``rest`` after), never inside a word."""
    import re

    out, start, width = [], 0, first
    for m in re.finditer(r"\S+", plain):
        if m.end() - start > width and m.start() > start and plain[start:m.start()].strip():
            out.append(m.start())
            start, width = m.start(), rest
    return out


def print_wrapped(markup: str, stream: Console, indent: int = 4) -> None:
    """One line of `up` (rich markup): wrapped at spaces to the terminal, continuation lines indented, so a
    wrapped line never reads as a new one at 80 columns; a path or an id longer than a line stays whole."""
    for block in markup.split("\n"):
        text = Text.from_markup(block)
        lead = len(text.plain) - len(text.plain.lstrip(" "))
        pad = " " * (lead + indent)
        width = max(stream.width, 40)
        for j, line in enumerate(text.divide(_breaks(text.plain, width, width - len(pad)))):
            line.rstrip()
            stream.print(Text(pad) + line if j else line, highlight=False, soft_wrap=True)


class ProgressBar:
    """Step/total, loss, tokens/s, ETA and the container's status of the followed training."""

    def __init__(self, title: str, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("[magenta]{task.fields[tps]}"),
            TextColumn("eta [green]{task.fields[eta]}"), TextColumn("[dim]{task.fields[state]}"),
            console=console, transient=False, refresh_per_second=4)
        self._task = self._progress.add_task(esc(title), total=None, loss="-", tps="- tok/s", eta="-",
                                             state="starting")
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    def show_entry(self, entry: LogEntry) -> None:
        self._progress.update(self._task, completed=entry.current_steps, total=entry.total_steps or None,
                              loss=f"{entry.loss:.4f}" if entry.loss is not None else "-",
                              tps=f"{entry.throughput:.0f} tok/s" if entry.throughput is not None else "- tok/s",
                              eta=esc(entry.remaining_time or "-"))

    def show_state(self, state: str) -> None:
        self._progress.update(self._task, state=esc(state))


class EventView:
    """The CLI's sink for `up`'s events: their lines, and (``bar``: a terminal, no --no-progress) a progress bar
    instead of the progress lines while training is followed."""

    def __init__(self, console: Console, *, bar: bool = False, again: str = "") -> None:
        """``again``: the command that goes on after a detach (the CLI's own command line), shown instead of a
        placeholder."""
        self.console, self.bar_wanted, self.again = console, bar, again
        self._bar: ProgressBar | None = None
        self._spinner: Any = None

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.Detached) and self.again and not e.again:
            e = dataclasses.replace(e, again=self.again)
        if isinstance(e, ev.Following):
            self._follow(e)
        elif isinstance(e, ev.Waiting):
            self._wait(e)
        elif isinstance(e, ev.Progress) and self._bar is not None:
            self._bar.show_entry(e.entry)
        elif isinstance(e, ev.PlanText):
            self.console.print(e.text, highlight=False, markup=False, soft_wrap=True)
        else:
            for line in lines(e):
                print_wrapped(line, self.console)

    def _wait(self, e: ev.Waiting) -> None:
        """A spinner with the time so far while a long uncounted step runs (a terminal); else its line, once."""
        if e.phase == "started":
            line = _fill(GO + " {e.stage}: {e.what}", e)
            if self.bar_wanted:
                from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

                text = line.replace("{", "{{").replace("}", "}}")   # a column's text is a format string
                self._spinner = Progress(SpinnerColumn(), TextColumn(text), TimeElapsedColumn(),
                                         console=self.console, transient=True)
                self._spinner.add_task("wait", total=None)
                self._spinner.start()
            else:
                print_wrapped(line, self.console)
        elif self._spinner is not None:
            self._spinner.stop()
            self._spinner = None

    def _follow(self, e: ev.Following) -> None:
        """The bar: made when following starts (on a terminal, without --no-progress), its status shown, ended."""
        if e.phase == "started" and self.bar_wanted:
            self._bar = ProgressBar(e.container, self.console)
        elif self._bar is None:
            return
        elif e.phase == "status":
            self._bar.show_state(e.status)
        elif e.phase == "ended":
            self._bar.stop()
            self._bar = None
