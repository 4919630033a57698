"""`up`'s terminal output: each event of the run (core/events.py) as its line(s), and a progress bar while training
is followed. The one module that puts the run's values into rich markup: every value from outside (a path, a
host's answer, a check's detail, a trainer log's field) is escaped here (``_fill``, the bar's fields), so a
``[/x]`` in it prints as text, never as a tag; SafeConsole then shows any control character as an escape."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from ktdeploy.core import events as ev
from ktdeploy.core.terminal_text import esc
from ktdeploy.core.trainer_log import LogEntry, describe

OK, NO, GO, NOT = "[green]✓[/green]", "[red]✗[/red]", "[cyan]→[/cyan]", "[yellow]-[/yellow]"
WAIVED, TO_REPAIR = "  [yellow]waived[/yellow]", "  [yellow]to repair[/yellow]"


class _Escaped:
    """An event whose fields read escaped, for ``{e.NAME}`` in a template."""

    def __init__(self, event: ev.Event | None) -> None:
        self._event = event

    def __getattr__(self, name: str) -> str:
        return esc(getattr(self._event, name))


def _fill(template: str, event: ev.Event | None = None, **values: Any) -> str:
    """``template`` (markup) with the event's fields (``{e.NAME}``) and ``values`` put in, each escaped."""
    return template.format(e=_Escaped(event), **{k: esc(v) for k, v in values.items()})


def _amount(files: int, missing: int, missing_bytes: int) -> str:
    return f"{missing} of {files} file(s), {ev.size_text(missing_bytes)}" if missing else \
        f"all {files} file(s) already there"


def lines(e: ev.Event) -> list[str]:
    """The markup lines ``e`` shows as; none for an event that is only recorded (or drawn by the bar)."""
    match e:
        case ev.WaiversRecorded():
            return ([_fill("[bold yellow]CPU-only test profile: the GPU checks are waived here and in the containers, "
                           "which start without GPUs — recorded in {e.status_file}[/]", e)] if e.profile else []) + \
                ([_fill("[bold yellow]WARNING: " + ("also " if e.profile else "") + "waiving checks {checks} — "
                        "recorded in {e.status_file}[/]", e, checks=", ".join(e.also))] if e.also else [])
        case ev.PlanningFromFacts():
            return [_fill(NOT + " PREFLIGHT: not connecting to {e.host}; planning from the facts in {e.path}", e)]
        case ev.Connected():
            return [_fill(OK + " PREFLIGHT: connected to {e.connector}", e)]
        case ev.SyncDeferred():
            return [_fill(NOT + " SYNC: {e.local} -> {e.target} happens at the real run (not connected)", e)]
        case ev.SyncPlanned():
            return [_fill(NOT + " SYNC: would upload {what} from {e.local} to {e.remote} (dry run)", e,
                          what=_amount(e.files, e.missing, e.missing_bytes))]
        case ev.SyncUploading():
            return [_fill(GO + " SYNC: upload {what} from {e.local} to {e.remote} on {e.host}", e,
                          what=_amount(e.files, e.missing, e.missing_bytes))]
        case ev.Synced(dry_run=False):
            return [_fill(OK + " SYNC: {e.remote} holds the {e.files} file(s) of {e.local} ({size}), checked by size "
                          "and SHA-256", e, size=ev.size_text(e.bytes))]
        case ev.DoctorVerdict():
            return [_fill((NO if e.blocking else OK) + " PREFLIGHT: doctor on {e.where}: {e.summary_text}", e)] + \
                [_fill(WAIVED + " {name}: {detail}", name=c.name, detail=c.detail) for c in e.waived] + \
                [_fill(TO_REPAIR + " {name}: {detail} -> the RUNTIME stage installs what is missing", name=c.name,
                       detail=c.detail) for c in e.deferred]
        case ev.SlurmFit():
            return [_fill((NO if e.check.status == "fail" else OK) + " PREFLIGHT: {name}: {detail}",
                          name=e.check.name, detail=e.check.detail)]
        case ev.ResumeNote():
            return [_fill("[yellow]note:[/yellow] {e.note}", e)]
        case ev.StageSkipped():
            return [_fill("[dim]- {e.stage}: skipped ({e.reason})[/dim]", e)]
        case ev.StepSatisfied():
            return [_fill(OK + " {e.stage}: {e.title} [dim](already satisfied: {e.why})[/dim]", e)]
        case ev.StepProbed():
            return [_fill(OK + " {e.stage}: {e.title} [dim](already satisfied)[/dim]", e)]
        case ev.StepRunning():
            return [_fill(GO + " {e.stage}: {e.title}", e)]
        case ev.ImageChecked():
            return [_fill(WAIVED + " {name} ({layer}): {detail}", name=c.name, layer=c.layer, detail=c.detail)
                    for c in e.waived] + ([] if e.failed else [_fill("  image check: {e.summary_text}", e)])
        case ev.FetchRefused():
            return [_fill("[yellow]![/yellow] {e.stage}: not fetched: {e.remote} {e.why}", e)]
        case ev.Fetched():
            return [_fill(OK + " {e.stage}: fetched {e.name} -> {e.dest}", e)]
        case ev.ContainerRunning():
            return [_fill(OK + " {e.stage}: {e.container} is running", e)]
        case ev.StepWaiting():
            return [_fill(GO + " {e.stage}: waiting for {e.title}", e)]
        case ev.EndpointReady():
            return [_fill(OK + " {e.stage}: {e.title}", e)]
        case ev.Progress():
            return [_fill("  {line}", line=describe(e.entry))]
        case ev.TrainingFinished():
            return [_fill(OK + " training finished: {line}", line=describe(e.entry))]
        case ev.SlurmSubmitted():
            return [_fill("  submitted {e.role} job {e.job_id}", e)]
        case ev.SlurmJobState():
            return [_fill("  {line}", line=e.job.describe())]
        case ev.SlurmTrainingFinished():
            return [_fill(OK + " training job {e.job_id} finished on {e.nodes}", e)]
        case ev.SlurmWaiting():
            return [_fill(GO + " {e.stage}: waiting for the {e.role} job", e)]
        case ev.SlurmJobDone():
            return [_fill(OK + " {e.stage}: {e.title} (job {e.job_id})", e)]
        case ev.Detached(terminated=False):
            return [_fill("[yellow]Stopped following; the training container {e.job} keeps running on {e.host}.[/]\n"
                          "  ktdeploy status --host {e.host}   |   ktdeploy logs -f --host {e.host}   |   "
                          "ktdeploy up (same args) to go on", e)]
        case ev.StartedDetached():
            return [_fill("[green]Training started in {e.job} on {e.host}.[/] Follow it: ktdeploy status --host "
                          "{e.host}; ktdeploy logs -f --host {e.host}", e)]
        case ev.Done():
            return [_fill("[green bold]done:[/] adapter {e.adapter_dir}; run record {e.record_path}", e)]
        case ev.Cancelled():
            return [_fill("[yellow]Terminated: cancelled {jobs}.[/]", jobs=", ".join(f"{k}: {v}" for k, v in
                                                                                     e.jobs.items()))]
    return []


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

    def __init__(self, console: Console, *, bar: bool = False) -> None:
        self.console, self.bar_wanted = console, bar
        self._bar: ProgressBar | None = None

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.FollowStarted) and self.bar_wanted:
            self._bar = ProgressBar(e.container, self.console)
        elif isinstance(e, ev.FollowEnded) and self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif isinstance(e, ev.Progress) and self._bar is not None:
            self._bar.show_entry(e.entry)
        elif isinstance(e, ev.ContainerStatus) and self._bar is not None:
            self._bar.show_state(e.status)
        elif isinstance(e, ev.PlanText):
            self.console.print(e.text, highlight=False, markup=False, soft_wrap=True)
        else:
            for line in lines(e):
                print_wrapped(line, self.console)
