"""Rendering helpers shared by every command: errors, findings, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.markup import escape
from rich.text import Text

console = Console()
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_error(err) -> None:
    """One screen: what went wrong, the key or check it concerns, and the fix."""
    body = Text()
    if getattr(err, "key", None):
        body.append(f"{err.key}: ", style="bold")
    body.append(err.message)
    if getattr(err, "fix", None):
        body.append("\nfix: ", style="bold green")
        body.append(err.fix)
    err_console.print(Panel(body, title=f"[red]{type(err).__name__}", border_style="red", expand=False))
    findings = getattr(err, "findings", None)
    if findings:
        print_findings(findings, stream=err_console)
    results = getattr(err, "results", None)
    if results:
        from ktdeploy.cli.output import print_checks

        print_checks([r for r in results if r.status == "fail"], stream=err_console)


def print_internal_error(err: BaseException) -> None:
    err_console.print(Panel(
        Text(f"{type(err).__name__}: {err}\n"
             "This is a bug in ktdeploy. Re-run with KTDEPLOY_DEBUG=1 for the traceback and report it."),
        title="[red]internal error", border_style="red", expand=False))


def print_findings(findings, stream: Console | None = None) -> None:
    """One block per finding: severity, key path and location, then the problem and the fix."""
    stream = stream or console
    for f in findings:
        mark = "[red]error[/red]" if f.severity == "error" else "[yellow]warn [/yellow]"
        loc = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "")
        where = f" [dim]({escape(loc)})[/dim]" if loc else ""
        stream.print(f"{mark} [bold]{escape(f.path)}[/bold]{where}", highlight=False)
        stream.print(Text("      " + f.message), highlight=False)
        if f.fix:
            stream.print(Text("      fix: " + f.fix, style="green"), highlight=False)


_STATUS_STYLE = {"pass": "[green]pass", "warn": "[yellow]warn", "fail": "[red]fail", "skip": "[dim]skip"}


def print_checks(results, stream: Console | None = None, title: str | None = None) -> None:
    stream = stream or console
    table = Table(title=title, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("detail", overflow="fold")
    table.add_column("fix", style="green", overflow="fold")
    for r in results:
        table.add_row(_STATUS_STYLE.get(r.status, r.status), r.name, r.detail or "", r.fix or "")
    stream.print(table)
