"""The loss curve of a run from LlamaFactory's ``trainer_log.jsonl`` (pure): training loss per step and, where the
trainer evaluated (``eval_loss`` lines, LlamaFactory's LogCallback), the evaluation loss at its steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from ktdeploy.core.safeio import parse_json

LOSS_PNG = "loss.png"   # the run record's artifacts/loss.png


@dataclass
class Curve:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.steps or self.eval_steps)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None


def curve(text: str) -> Curve:
    """Every line with a step and a (training or evaluation) loss; torn and foreign lines are left out. A resumed run
    appends to the same log: a step seen again replaces the earlier point."""
    train: dict[int, float] = {}
    evals: dict[int, float] = {}
    for line in text.splitlines():
        try:
            d = parse_json(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or not isinstance(d.get("current_steps"), int):
            continue
        step = d["current_steps"]
        if (v := _num(d.get("loss"))) is not None:
            train[step] = v
        if (v := _num(d.get("eval_loss"))) is not None:
            evals[step] = v
    c = Curve()
    for s in sorted(train):
        c.steps.append(s)
        c.loss.append(train[s])
    for s in sorted(evals):
        c.eval_steps.append(s)
        c.eval_loss.append(evals[s])
    return c
