"""Rendering helpers shared by every command: errors, findings, JSON.

Everything the CLI prints goes through ``console``/``err_console`` (SafeConsole): every text segment passes
``core.terminal_text.terminal_safe`` on its way to the terminal, so a control character that came from a recipe, a
host, a tensor file or a record is shown as an escape, never acted on. rich's own styling is added after that,
so colours stay. ``print_json`` escapes them itself (JSON's \u001b)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.segment import Segment
from rich.text import Text

if TYPE_CHECKING:
    from ktdeploy.controller.doctor import DoctorReport
    from ktdeploy.core.check_result import CheckResult
    from ktdeploy.core.errors import KtdeployError
    from ktdeploy.core.recipe.finding import Finding
    from ktdeploy.core.recipe.stack_judge_payload import JudgeResult


MIN_WIDTH = 40   # COLUMNS=0 (or 1) made rich print nothing at all; a narrower terminal folds the lines itself


class SafeConsole(Console):
    """A rich Console whose every printed text segment is sanitized (``terminal_safe``): rich's own control
    segments (cursor moves of a live progress bar) and styles pass; text from outside never carries one. Its width
    is at least MIN_WIDTH, whatever COLUMNS says."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        return dims if dims.width >= MIN_WIDTH else ConsoleDimensions(MIN_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterator[Segment]:
        from ktdeploy.core.terminal_text import terminal_safe

        for seg in super().render(renderable, options):
            if seg.control or not seg.text:
                yield seg
            else:
                text = terminal_safe(seg.text)
                yield seg if text is seg.text else Segment(text, seg.style, seg.control)


console = SafeConsole()
err_console = SafeConsole(stderr=True)


def _redact(text: str) -> str:
    from ktdeploy.core.safeio import redact

    return redact(text)


def print_json(data: Any) -> None:
    """Every --json output: passwords in URLs dropped (a recipe or record value may hold one)."""
    sys.stdout.write(json.dumps(_redact(data), indent=2, sort_keys=False, default=str) + "\n")


MAX_FINDINGS = 50        # one screen: a recipe with 60,000 unknown keys gets the first ones and a count
MAX_FINDING_TEXT = 600   # a value echoed in a message (a 900 KB template) is cut, with its length
MAX_ERROR_TEXT = 1500    # an error quoting a YAML line or a host's stderr stays one screen


def _clip(text: str, limit: int = MAX_FINDING_TEXT) -> str:
    text = _redact(str(text))
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _flat(stream: Console, head: str, label_style: str, parts: list[tuple[str, str]]) -> None:
    """One flat block: ``head`` (red, e.g. 'CheckFailed:') then each (label, text) wrapped at spaces to the
    terminal, continuation lines indented. No panel: at 80 columns (or in a log, or inside another report) a
    bordered box folds every line and splits words with its borders."""
    width = max(stream.width, 40)
    first = True
    for label, text in parts:
        if not text:
            continue
        lead = f"{head} " if first else f"  {label}"
        rest = " " * (2 if first else len(lead))
        lines = wrap_words(text, width, lead, rest)
        for i, line in enumerate(lines):
            t = Text(line)
            if i == 0:
                t.stylize(label_style, 0, len(lead.rstrip()))
            stream.print(t, soft_wrap=True, highlight=False)
        first = False


def print_error(err: KtdeployError) -> None:
    """One screen, flat: what went wrong, the key or check it concerns, and the fix."""
    message = _clip(err.message, MAX_ERROR_TEXT)
    if err.key:
        message = f"{_clip(err.key, 200)}: {message}"
    _flat(err_console, f"{type(err).__name__}:", "bold red",
          [("", message), ("fix: ", _clip(err.fix, MAX_ERROR_TEXT) if err.fix else "")])
    findings = getattr(err, "findings", None)
    if findings:
        print_findings(findings, stream=err_console)
    results = getattr(err, "results", None)
    if results:
        from ktdeploy.cli.output import print_checks

        print_checks([r for r in results if r.status == "fail"], stream=err_console)


def print_system_error(err: BaseException) -> None:
    """An OSError/MemoryError outside a path that names its own fix: what the system said, no traceback."""
    from ktdeploy.core.safeio import redact

    what = getattr(err, "strerror", None) or str(err) or type(err).__name__
    where = getattr(err, "filename", None)
    _flat(err_console, "system error:", "bold red",
          [("", redact(f"{type(err).__name__}: {what}" + (f" ({where})" if where else ""))),
           ("fix: ", "check the path, its permissions and free space/memory, then retry")])


def print_internal_error(err: BaseException) -> None:
    _flat(err_console, "internal error:", "bold red",
          [("", f"{type(err).__name__}: {_redact(str(err))}"),
           ("", "This is a bug in ktdeploy. Re-run with KTDEPLOY_DEBUG=1 for the traceback and report it.")])


def print_findings(findings: Iterable[Finding], stream: Console | None = None) -> None:
    """One block per finding: severity, key path and location, then the problem and the fix."""
    stream = stream or console
    findings = list(findings)
    for f in findings[:MAX_FINDINGS]:
        mark = "[red]error[/red]" if f.severity == "error" else "[yellow]warn [/yellow]"
        loc = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "")
        where = f" [dim]({escape(_clip(loc, 200))})[/dim]" if loc else ""
        stream.print(f"{mark} [bold]{escape(_clip(f.path, 200))}[/bold]{where}", highlight=False)
        stream.print(Text("      " + _clip(f.message)), highlight=False)
        if f.fix:
            stream.print(Text("      fix: " + _clip(f.fix), style="green"), highlight=False)
    if len(findings) > MAX_FINDINGS:
        errors = sum(1 for f in findings[MAX_FINDINGS:] if f.severity == "error")
        stream.print(Text(f"... and {len(findings) - MAX_FINDINGS} more ({errors} errors); `--json` lists them all"),
                      highlight=False)


def print_judgement(result: JudgeResult, where: str, stream: Console | None = None) -> None:
    """One line per stage of the stack's judgement (``check --stack``), and what it did not run."""
    stream = stream or console
    secs = f" in {result.seconds:.1f} s" if result.seconds is not None else ""
    stream.print(Text(f"stack judge ({_clip(where, 200)}{secs}): " + ", ".join(
        f"{k} {v}" for k, v in result.stages.items())), highlight=False)
    sk = result.skeleton
    if sk.get("status") == "accepted":
        steps = "; ".join(f"{k}: {v}" for k, v in (sk.get("steps") or {}).items())
        stream.print(Text(f"      model skeleton from {_clip(str(sk.get('source', '')), 200)} "
                          f"({sk.get('modules', '?')} modules, {sk.get('seconds', 0):.1f} s): {_clip(steps)}"),
                     highlight=False)
    for b in result.bypassed:
        stream.print(Text("      not run: " + _clip(b), style="dim"), highlight=False)


_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def wrap_words(text: str, width: int, first: str, rest: str) -> list[str]:
    """Wrap at spaces only: a path, key or URL longer than the line stays whole (it runs past the edge rather
    than being cut mid-token)."""
    import textwrap

    out: list[str] = []
    for i, para in enumerate((text or "").splitlines() or [""]):
        out += textwrap.wrap(para, width=max(width, len(first) + 20), initial_indent=first if i == 0 else rest,
                             subsequent_indent=rest, break_long_words=False, break_on_hyphens=False) or \
            [first if i == 0 else rest]
    return out


def print_checks(results: Iterable[CheckResult], stream: Console | None = None, title: str | None = None) -> None:
    """One line per check (status, name, detail wrapped at spaces); a failing or warning check's fix on its own
    line(s) below it. No table: a narrow terminal (80 columns, `docker run` without -t) never splits a path or a
    key mid-token."""
    stream = stream or console
    width = stream.width
    if title:
        stream.print(Text(title, style="bold"), soft_wrap=True)
    namew = min(max([len(r.name) for r in results] + [5]), 30)
    for r in results:
        head = f"  {r.status:<4}  {r.name:<{namew}}  "
        if width - len(head) < 30:  # too narrow for a detail column: the detail goes below the name
            lines = [head.rstrip()] + wrap_words(r.detail or "", width, " " * 8, " " * 8)
        else:
            lines = wrap_words(r.detail or "", width, head, " " * len(head))
        for i, line in enumerate(lines):
            t = Text(line)
            if i == 0:
                t.stylize(_STATUS_STYLE.get(r.status, ""), 2, 2 + len(r.status))
                t.stylize("bold", 8, 8 + len(r.name))
            stream.print(t, soft_wrap=True, highlight=False)
        if r.fix and r.status in ("fail", "warn"):
            for line in wrap_words(r.fix, width, " " * 8 + "fix: ", " " * 13):
                stream.print(Text(line, style="green"), soft_wrap=True, highlight=False)


def print_doctor(report: DoctorReport, stream: Console | None = None, every: bool = False) -> None:
    """doctor's report, failures first: each failing check with its fix, then the warnings with theirs, then
    the passes and skips by name only (``every``: one line per check, in doctor's order, as before)."""
    stream = stream or console
    checks = list(report.checks)
    if every:
        print_checks(checks, stream=stream, title=f"ktdeploy doctor: {report.facts.host}")
        return
    waived = {c.name for c in report.waived_failures}
    groups = [("fail", [c for c in checks if c.status == "fail" and c.name not in waived]),
              ("WAIVED", [c for c in checks if c.status == "fail" and c.name in waived]),
              ("warn", [c for c in checks if c.status == "warn"])]
    for label, group in groups:
        if group:
            stream.print(Text(f"{label} ({len(group)}):", style="bold " + _STATUS_STYLE.get(label, "yellow")),
                         highlight=False)
            print_checks(group, stream=stream)
    for label in ("pass", "skip"):
        names = [c.name + (f" ({c.layer})" if c.layer and c.layer != report.facts.layer else "") for c in checks
                 if c.status == label]
        if names:
            for line in wrap_words(", ".join(names), stream.width, f"{label} ({len(names)}): ", "  "):
                stream.print(Text(line, style=_STATUS_STYLE[label] if label == "skip" else ""), soft_wrap=True,
                             highlight=False)
    stream.print(Text("details of every check: ktdeploy doctor --all (or --json)", style="dim"), highlight=False)
