"""Plan data: stages of steps. A step is an argv to run on the host plus a probe that says it is already
done; nothing here touches a host (the executor does)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

STAGES = ("PREFLIGHT", "RUNTIME", "IMAGE", "VOLUMES", "TRAIN", "FOLLOW", "CONVERT", "SERVE")

Action = Literal["run", "put", "put_secret", "fetch", "follow", "fail", "wait_running", "wait_http"]


@dataclass(frozen=True)
class Step:
    id: str                                   # "image.load"
    title: str                                # what a person reads
    action: Action = "run"
    argv: tuple[str, ...] | None = None       # run: the command on the host (argv, never a shell string)
    probe: tuple[str, ...] | None = None      # exit 0 = already satisfied, the step is skipped
    satisfied: bool = False                   # known satisfied at plan time (from the gathered job state)
    why: str = ""                             # why it is satisfied / needed
    local: str | None = None                  # put/fetch: the controller-side path
    remote: str | None = None                 # put/fetch: the host-side path
    optional: bool = False                    # fetch: a missing file is not an error
    fix: str | None = None                    # fail: how to get past it
    timeout: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str | None:
        """The command as a person would type it (each argv item shell-quoted)."""
        if self.argv:
            return " ".join(shlex.quote(a) for a in self.argv)
        return None

    def to_json(self) -> dict:
        d = asdict(self)
        d["command"] = self.command()
        return {k: v for k, v in d.items() if v not in (None, False, "", {}, ())}


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    steps: tuple[Step, ...] = ()
    skipped: str | None = None                # why the whole stage does not run

    def to_json(self) -> dict:
        d = {"name": self.name, "title": self.title, "steps": [s.to_json() for s in self.steps]}
        if self.skipped:
            d["skipped"] = self.skipped
        return d


@dataclass(frozen=True)
class Plan:
    host: str
    recipe: str
    job: str                                  # deterministic container name (recipe name + output dir hash)
    image: str
    variant: str | None
    output_dir: str
    adapter_dir: str
    job_dir: str                              # host folder holding the shipped recipe
    stages: tuple[Stage, ...]
    resume_from: str | None = None
    waived: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    rendered: dict[str, str] = field(default_factory=dict)   # name -> controller path (filled by the executor)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def steps(self):
        for st in self.stages:
            for s in st.steps:
                yield st, s

    def to_json(self) -> dict:
        return {"host": self.host, "recipe": self.recipe, "job": self.job, "image": self.image,
                "variant": self.variant, "output_dir": self.output_dir, "adapter_dir": self.adapter_dir,
                "job_dir": self.job_dir, "resume_from": self.resume_from, "waived": list(self.waived),
                "notes": list(self.notes), "rendered": dict(self.rendered),
                "stages": [s.to_json() for s in self.stages]}
