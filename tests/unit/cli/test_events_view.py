"""`up`'s one renderer (cli/events_view.py): each event's line(s) as `up` always printed them, every outside value
escaped there, the progress bar instead of the progress lines on a terminal, the 80-column wrapping, the plan."""

from __future__ import annotations

import io

from ktdeploy.cli.events_view import EventView, lines, plain_lines
from ktdeploy.cli.output import SafeConsole
from ktdeploy.core import events as ev
from ktdeploy.core.trainer_log import LogEntry, describe
from tests.unit.core.test_events import CASES


def test_each_event_shows_as_its_line():
    wrong = [f"{type(e).__name__}: {plain_lines(e)} (want {shown})" for e, _kind, _fields, shown in CASES
             if plain_lines(e) != shown]
    assert not wrong, "\n".join(wrong)


def test_outside_values_are_escaped_once_in_the_renderer():
    e = ev.Said(ev.Mark.OK, "fetched [bold]x[/bold] -> /r/[/]", ev.StageName.FOLLOW)
    assert lines(e) == [r"[green]✓[/green] FOLLOW: fetched \[bold]x\[/bold] -> /r/\[/]"]
    assert plain_lines(e) == ["✓ FOLLOW: fetched [bold]x[/bold] -> /r/[/]"]


def test_every_event_is_recorded_or_shown():
    for event, kind, _fields, shown in CASES:
        assert kind or shown or isinstance(event, (ev.PlanText, ev.Following, ev.Waiting)), \
            type(event).__name__


def _console(terminal: bool = False) -> SafeConsole:
    return SafeConsole(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)


def _follow(view: EventView) -> None:
    view(ev.Following("started", container="job"))
    view(ev.Following("status", status="running"))
    for step in (1, 2, 3):
        view(ev.Progress(entry=LogEntry(current_steps=step, total_steps=3, loss=1 / step, remaining_time="0:00:00")))
    view(ev.Following("status", status="exited"))
    view(ev.Following("ended"))
    view(ev.Said(ev.Mark.OK, f"training finished: {describe(LogEntry(current_steps=3, total_steps=3, loss=1 / 3))}"))


def test_without_a_bar_progress_is_lines():
    con = _console()
    _follow(EventView(con))
    assert con.file.getvalue().splitlines() == ["  step 1/3  loss 1.0000  eta 0:00:00", "  step 2/3  loss 0.5000  eta 0:00:00",
                                                "  step 3/3  loss 0.3333  eta 0:00:00",
                                                "✓ training finished: step 3/3  loss 0.3333"]


def test_with_a_bar_progress_is_the_bar():
    con = _console(terminal=True)
    _follow(EventView(con, bar=True))
    out = con.file.getvalue()
    assert "3/3" in out and "loss 0.3333" in out and "exited" in out and "job" in out
    assert "  step 1/3" not in out and out.rstrip().endswith("✓ training finished: step 3/3  loss 0.3333")


def test_long_lines_wrap_at_spaces_with_their_continuation_indented():
    con = _console()
    view = EventView(con)
    view(ev.Said(ev.Mark.DONE, f"adapter {'/out/' + 'a' * 40}; run record {'/r/' + 'b' * 90}", lead="done:"))
    view(ev.PlanText(text="[red]plan[/red] " + "word " * 30))
    *done, plan = con.file.getvalue().splitlines()
    assert done == ["done: adapter /out/" + "a" * 40 + "; run record", "    /r/" + "b" * 90]   # a path stays whole
    assert plan == "[red]plan[/red] " + "word " * 30          # the plan is printed as it is


def test_a_long_uncounted_step_is_a_spinner_on_a_terminal_and_one_line_elsewhere():
    started = ev.Waiting("started", "IMAGE", "checking ktsft:{amx} in a container [/x]")
    buf = io.StringIO()
    view = EventView(SafeConsole(file=buf, width=100, force_terminal=False))
    view(started)
    view(ev.Waiting("ended", "IMAGE"))
    assert buf.getvalue() == "→ IMAGE: checking ktsft:{amx} in a container [/x]\n"
    tty = io.StringIO()
    view = EventView(SafeConsole(file=tty, width=100, force_terminal=True), bar=True)
    view(started)                                  # braces and markup in the text: shown, never read
    assert view._spinner is not None
    view._spinner.refresh()
    view(ev.Waiting("ended", "IMAGE"))
    assert view._spinner is None and "checking ktsft:{amx} in a container [/x]" in tty.getvalue()


def test_a_lead_shows_with_every_mark():
    """`up` printed `plan: 0.23 s per step` (Mark.GO, no lead style) as `[]plan:[/]`: rich's MarkupError, exit 70 at
    the start of FOLLOW on the real path. Every mark with a lead renders."""
    for mark in ev.Mark:
        con = _console()
        EventView(con)(ev.Said(mark, "0.23 s per step, 8857 tokens/s", ev.StageName.FOLLOW, lead="plan:"))
        assert "FOLLOW: plan: 0.23 s per step, 8857 tokens/s" in con.file.getvalue(), (mark, con.file.getvalue())
