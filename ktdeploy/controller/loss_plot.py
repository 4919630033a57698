"""The run record's loss curve as a PNG (``artifacts/loss.png``), drawn with matplotlib as LlamaFactory draws its
own ``training_loss.png``; evaluation losses are marked. matplotlib is the optional ``plot`` extra (the controller
installs light): without it no PNG is drawn and ``status`` says how to get one."""

from __future__ import annotations

import io
from pathlib import Path

from ktdeploy.core.loss_curve import LOSS_PNG, Curve
from ktdeploy.core.safeio import write_file


def render_png(c: Curve, title: str) -> bytes | None:
    """The PNG bytes of the curve, or None when matplotlib is missing or there is nothing to draw."""
    if not c:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    if c.steps:
        ax.plot(c.steps, c.loss, color="#1f77b4", linewidth=1.2, label="training loss")
    if c.eval_steps:
        ax.plot(c.eval_steps, c.eval_loss, "o--", color="#d62728", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_loss_png(artifacts: Path, c: Curve, title: str) -> Path | None:
    data = render_png(c, title)
    if data is None:
        return None
    return write_file(artifacts, LOSS_PNG, data, overwrite=True)
