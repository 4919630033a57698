"""Where an image build is and how long it still takes, from its own output lines (pure: lines and times in).

`image build` says each of its stages as ``[stage i/N] NAME: what`` (controller/images/build.py), and docker's
classic builder each instruction as ``Step n/M : INSTRUCTION``. ``BuildClock`` follows both, measures how long
each part took, and estimates what is left from the last build's measurements (``last``: the ``timings()`` a
previous build left, kept by the CLI in $KTDEPLOY_HOME/image-build-times.json). A part the last build did not
have (a changed Dockerfile line) counts as unknown: the ETA is then said to be a lower bound."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STAGE = re.compile(r"^\[stage (\d+)/(\d+)\] ([\w-]+)")
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


def stage_line(i: int, n: int, name: str, what: str) -> str:
    """How the build says a stage begins (the one spelling STAGE reads)."""
    return f"[stage {i}/{n}] {name}: {what}"


@dataclass
class BuildClock:
    last: dict[str, float] = field(default_factory=dict)   # part -> seconds, from the previous build
    stage: str = ""
    stage_i: int = 0
    stages: int = 0
    step: int = 0
    steps: int = 0
    instruction: str = ""
    _part: str = ""
    _since: float = 0.0
    _done: dict[str, float] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)   # the parts of the last build, in its order

    def __post_init__(self) -> None:
        self._order = list(self.last)

    def feed(self, line: str, now: float) -> bool:
        """Read one output line at time ``now``; True when it moved the build to a new stage or step."""
        if (m := STAGE.match(line)):
            self._close(now)
            self.stage_i, self.stages, self.stage = int(m.group(1)), int(m.group(2)), m.group(3)
            self.step = self.steps = 0
            self.instruction = ""
            self._open(self.stage, now)
            return True
        if (m := STEP.match(line)):
            self._close(now)
            self.step, self.steps, self.instruction = int(m.group(1)), int(m.group(2)), m.group(3).strip()
            self._open(f"{self.stage}:{self.instruction}", now)
            return True
        return False

    def finish(self, now: float) -> None:
        self._close(now)

    def _open(self, part: str, now: float) -> None:
        self._part, self._since = part, now

    def _close(self, now: float) -> None:
        if self._part:
            self._done[self._part] = round(self._done.get(self._part, 0.0) + now - self._since, 3)
            self._part = ""

    def timings(self) -> dict[str, float]:
        """What this build measured, part by part (for the next build's ETA)."""
        return dict(self._done)

    def where(self) -> str:
        text = f"stage {self.stage_i}/{self.stages} {self.stage}" if self.stage else "starting"
        if self.steps:
            text += f": step {self.step}/{self.steps}"
        return text

    def remaining(self, now: float) -> tuple[float, bool] | None:
        """(seconds left by the last build's timings, whether every part left is known); None without a last
        build. A stage's own part (its steps aside) counts too: the layer, the verification, the images."""
        if not self.last:
            return None
        left, known = 0.0, True
        current = self._part
        for part in self._order:
            if part in self._done and part != current:
                continue
            spent = now - self._since if part == current else 0.0
            left += max(0.0, self.last[part] - spent)
        if self.stage and current and current not in self.last:
            known = False
        return left, known
