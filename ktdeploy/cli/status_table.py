"""`ktdeploy status --all`: every recorded run in one table — run, target, stage, state, age and a one-line reason
(core/run_summary.py) — read from the records alone; none recorded yet is a line that says how to start one."""

from __future__ import annotations

import time

from ktdeploy.cli.output import console, wrap_words
from ktdeploy.core import run_summary
from ktdeploy.core.run_record import RunStatus
from ktdeploy.core.terminal_text import esc, terminal_safe

COLUMNS = ("run", "target", "stage", "state", "age", "reason")
MIN_REASON = 24   # narrower than this, each run's reason goes on the line below its row
# narrower than the row itself (a long target): one block per run


def no_runs_line(where: str, host: str | None) -> str:
    """What `status` says when no run is recorded (exit 0: nothing is wrong, nothing has run yet)."""
    on = f" for host {host}" if host else ""
    return (f"no run recorded{on} yet (records live in {where}). Start one: `ktdeploy up` (the shipped tiny recipe "
            "on this machine), or `ktdeploy up --host gpu01 recipes/tiny-moe-lora.yaml --dry-run` to see the plan "
            "first")


def rows(statuses: list[RunStatus], now: float | None = None) -> list[tuple[str, ...]]:
    now = time.time() if now is None else now
    out = []
    for st in statuses:
        cells = (st.get("id") or "?", st.get("host") or "localhost", run_summary.stage(st), st.get("state") or "?",
                 run_summary.age(st, now), run_summary.reason(st))
        out.append(tuple(" ".join(terminal_safe(c).split()) for c in cells))   # one line each, controls shown
    return out


def print_all(statuses: list[RunStatus], where: str, host: str | None) -> None:
    from rich.text import Text

    if not statuses:
        console.print(esc(no_runs_line(where, host)), highlight=False, soft_wrap=True)
        return
    table = rows(statuses)
    # run ids (what --run takes) and targets are printed whole, never folded or cut; the reason takes what is left
    # of the line (cut with "…"); narrower than MIN_REASON, the reason goes below its row; narrower than the row, one block per run
    widths = [max([len(r[i]) for r in table] + [len(c)]) for i, c in enumerate(COLUMNS[:-1])]
    fixed = sum(widths) + 2 * len(widths)
    if fixed + MIN_REASON > console.width >= fixed - 2:
        # still a table: one row per run, its reason on the line below (cut to the width)
        def row(cells: tuple[str, ...], style: str = "") -> None:
            text = "".join(f"{c:<{w}}  " for c, w in zip(cells, widths, strict=False)).rstrip()
            console.print(Text(text, style=style), highlight=False, crop=False, overflow="ignore")

        row(COLUMNS[:-1], style="bold")
        room = console.width - 4
        for r in table:
            row(r[:-1])
            if r[-1]:
                reason = r[-1] if len(r[-1]) <= room else r[-1][:room - 1] + "…"
                console.print(Text("    " + reason, style="dim"), highlight=False, crop=False, overflow="ignore")
        return
    if fixed + MIN_REASON > console.width:
        for r in table:
            console.print(r[0], style="bold", markup=False, highlight=False, crop=False, overflow="ignore")
            for k, v in zip(COLUMNS[1:], r[1:], strict=True):
                for ln in wrap_words(v, console.width, f"  {k:<7} ", " " * 10):
                    console.print(Text(ln), highlight=False, crop=False, overflow="ignore")
        return
    room = console.width - fixed - 1

    def line(cells: tuple[str, ...], style: str = "") -> None:
        reason = cells[-1] if len(cells[-1]) <= room else cells[-1][:room - 1] + "…"
        text = "".join(f"{c:<{w}}  " for c, w in zip(cells, widths, strict=False)) + reason
        console.print(Text(text.rstrip(), style=style), highlight=False, crop=False, overflow="ignore")

    line(COLUMNS, style="bold")
    for r in table:
        line(r)
