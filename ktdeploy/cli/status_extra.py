"""What `status` adds after a run's state: its evaluation (deploy.eval / `ktdeploy eval`) and its loss curve (the
PNG's path; ``--plot`` draws it in the terminal with plotext)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ktdeploy.cli.output import console
from ktdeploy.core import run_record as rr
from ktdeploy.core.checkpoints import TRAINER_LOG
from ktdeploy.core.errors import UsageError
from ktdeploy.core.loss_curve import LOSS_PNG, Curve, curve
from ktdeploy.core.safeio import read_text

PLOT_FIX = "pip install 'ktdeploy[plot]' (matplotlib, plotext)"


def _scores(side: Any) -> str:
    metrics = side.get("metrics", {}) if isinstance(side, dict) else {}
    return " ".join(f"{k} {v:.1f}" for k, v in metrics.items() if isinstance(v, int | float)) or "no score"


def print_eval_and_curve(st: rr.RunStatus, line: Callable[..., None], *, plot: bool) -> None:
    e = st.get("eval")
    if isinstance(e, dict):
        if e.get("failed"):
            line(f"evaluation did not finish: {e['failed']} (the server keeps running)", style="yellow")
        else:
            text = f"evaluation: tuned {_scores(e.get('tuned'))}"
            if isinstance(e.get("base"), dict):
                text += f"; base {_scores(e['base'])}"
            line(text, style="red" if e.get("below") else "")
            if e.get("below"):
                line(str(e["below"]), style="red")
            line(f"evaluation result: {e.get('summary_file', '?')} (every answer: {e.get('samples_file', '?')})")
    record = Path(str(st.get("record", "")))
    artifacts = record / rr.ARTIFACTS
    log = artifacts / TRAINER_LOG
    if (artifacts / LOSS_PNG).is_file():
        line(f"loss curve: {artifacts / LOSS_PNG}")
    elif log.is_file():
        line(f"loss curve: not drawn ({PLOT_FIX})")
    if plot:
        if not os.path.isfile(log):
            raise UsageError(f"run {st.get('id', '?')} has no trainer_log.jsonl in its record (training not followed "
                             "to its end yet)", key="--plot", fix="Run `ktdeploy up` (same arguments) to follow it.")
        draw(curve(read_text(log, 64 << 20, TRAINER_LOG)), str(st.get("id", "")))


def draw(c: Curve, title: str, width: int | None = None, height: int = 18) -> None:
    if not c:
        console.print("no loss in the trainer log yet", highlight=False)
        return
    try:
        import plotext as plt
    except ImportError:
        raise UsageError("`status --plot` draws with plotext, which is not installed", key="--plot",
                         fix=PLOT_FIX) from None
    plt.clf()
    plt.plotsize(width or min(console.width, 100), height)
    plt.theme("clear")
    if c.steps:
        plt.plot(c.steps, c.loss, label="training loss", marker="braille")
    if c.eval_steps:
        plt.scatter(c.eval_steps, c.eval_loss, label="eval loss", marker="x")
    plt.title(f"loss {title}")
    plt.xlabel("step")
    console.print(plt.build(), markup=False, highlight=False, soft_wrap=True)
