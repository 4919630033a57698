"""The controller does not print: it emits typed events (core/events.py) through controller/emitter.Emitter, which
writes the run record's event and hands the event to the caller's sink. It holds no rich markup, no esc() and no
rich import, and no run-record event is written but by the emitter."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import RunRecord
from tests.unit.core.test_events import CASES

CONTROLLER = Path(__file__).resolve().parents[3] / "ktdeploy" / "controller"
# a rich markup tag: [green], [/yellow], [bold yellow], [dim], [/] ...
TAG = re.compile(r"\[/\]|\[/?(?:bold|dim|italic|underline|reverse|strike|blink|not|on|link|"
                 r"green|yellow|red|cyan|magenta|blue|white|black|bright_\w+)\b[^\]\n]*\]")


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(CONTROLLER.rglob("*.py"))]


def _strings(tree: ast.Module) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_controller_holds_no_markup_no_esc_and_no_rich():
    bad = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.name}: imports {n}" for n in names if n == "rich" or n.startswith(("rich.", "ktdeploy.core.terminal_text"))]
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "esc":
                bad.append(f"{path.name}:{node.lineno}: esc()")
        bad += [f"{path.name}: markup {m.group()!r} in {s[:60]!r}" for s in _strings(tree) for m in TAG.finditer(s)]
    assert not bad, "\n".join(bad)


def test_the_markup_check_sees_what_the_controller_used_to_hold():
    old = ast.parse('from ktdeploy.core.terminal_text import esc\nsay(f"[green]✓[/green] {esc(x)} [dim](y)[/dim]")\n'
                    'say(f"[bold yellow]WARNING: z[/]")')
    assert [m.group() for s in _strings(old) for m in TAG.finditer(s)] == ["[green]", "[/green]", "[dim]", "[/dim]",
                                                                         "[bold yellow]", "[/]"]
    assert not [m for s in ('a list[str]', 'checks [] waived', 'x[i]', 'parts[0]') for m in TAG.finditer(s)]


def test_only_the_emitter_writes_run_record_events():
    """RunRecord.event (its body formats with core.run_record's ``rr.event``) is called by the emitter alone."""
    calls = [f"{p.name}:{n.lineno}" for p, tree in _sources() if p.name != "emitter.py" for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "event"
             and getattr(n.func.value, "id", None) != "rr"]
    assert not calls, calls


def test_the_emitter_records_then_hands_every_event_to_the_sink(tmp_path):
    record = RunRecord.create("r", root=tmp_path)
    got: list = []
    events = Emitter(record, got.append)
    for e, *_ in CASES:
        events.emit(e)
    assert got == [e for e, *_ in CASES]
    assert [{k: v for k, v in x.items() if k != "ts"} for x in record.events()] == \
        [{"event": e.KIND, **e.record()} for e, *_ in CASES if e.KIND]
    Emitter(record).emit(CASES[0][0])     # no sink: recorded, shown to no one
    assert len(record.events()) == 1 + sum(1 for e, *_ in CASES if e.KIND)
