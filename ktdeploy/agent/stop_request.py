"""Save-and-stop on request: the one contract between what receives a scheduler's warning and the trainer.

Whoever is told the job must end soon writes the request file (``JobLayout.stop_request``): the Slurm batch
script's USR1 trap before the time limit (``--signal=B:USR1@N``), the Kubernetes pod's TERM trap (preemption,
eviction, drain). The trainer's callback (``lf_entry.SaveOnStopRequest``; the test double does the same) looks
for it at every step boundary, saves a checkpoint there, writes ``JobLayout.stopped_marker`` naming it and exits
with ``EXIT_SAVED`` before LlamaFactory's final save (which would make the run look finished). The batch script
then requeues the job and ``train --resume auto`` starts from exactly that checkpoint.

A file, not a signal to the trainer: a signal would have to cross tini, accelerate's launcher and torchrun, and
the launcher dies on SIGUSR1 (Python's default action) while torchrun kills its workers 30 s after a SIGTERM.

Stdlib only (the test double's image imports it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ktdeploy.core import run_record as rr
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.safeio import write_path
from ktdeploy.core.sched.supervise import SUPERVISED_ENV  # set by a supervising shell, which owns the request

EXIT_SAVED = rr.EXIT_SAVED_ON_REQUEST   # 75, EX_TEMPFAIL: saved on request and stopped; start again with --resume auto
REQUEST_ENV = "KTDEPLOY_STOP_REQUEST"
STOPPED_ENV = "KTDEPLOY_STOPPED"
MAX_REASON = 200


class StoppedAfterSave(Exception):
    """Raised by the callback once the requested checkpoint is on disk: ends the training function before
    LlamaFactory saves the final model and its results (the finished-run markers)."""

    def __init__(self, step: int, checkpoint: str):
        super().__init__(f"stopped on request after saving {checkpoint} (step {step})")
        self.step = step
        self.checkpoint = checkpoint


@dataclass(frozen=True)
class StopRequest:
    request: str
    stopped: str

    @classmethod
    def for_output(cls, output_dir: str) -> StopRequest:
        layout = JobLayout(output_dir)
        return cls(layout.stop_request, layout.stopped_marker)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StopRequest | None:
        if env.get(REQUEST_ENV) and env.get(STOPPED_ENV):
            return cls(env[REQUEST_ENV], env[STOPPED_ENV])
        return None

    def env(self) -> dict[str, str]:
        return {REQUEST_ENV: self.request, STOPPED_ENV: self.stopped}

    def clear(self, env: Mapping[str, str] | None = None) -> None:
        """Forget an earlier run's request and answer (before a trainer starts) — unless a supervising shell started
        this trainer: it cleared them before the start, and a request it wrote since is this run's."""
        if (os.environ if env is None else env).get(SUPERVISED_ENV) == "1":
            return
        for p in (self.request, self.stopped):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def requested(self) -> bool:
        return os.path.lexists(self.request)

    def reason(self) -> str:
        try:
            fd = os.open(self.request, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        try:
            text = os.read(fd, MAX_REASON).decode("utf-8", "replace")
        finally:
            os.close(fd)
        return " ".join(text.split())

    def mark_saved(self, step: int, checkpoint: str) -> None:
        write_path(self.stopped, json.dumps({"step": step, "checkpoint": checkpoint, "reason": self.reason()}) + "\n",
                   overwrite=True)
