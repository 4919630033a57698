"""Run tuning trials on this host: each trial is a short real `ktdeploy train` of the recipe with one candidate
setting, measured after warm-up, stopped early when clearly worse, within a time budget.

Each trial reloads the model: LlamaFactory builds the KT expert wrappers (thread pools included) once at model
load, so the thread settings cannot change inside one loaded model. The cost of every trial is measured and
reported, and no trial starts when the budget left is below the last trial's cost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ktdeploy.agent.monitor import tree_rss_bytes
from ktdeploy.agent.tune.candidates import Candidate
from ktdeploy.agent.tune.measure import failure_reason, parse_log
from ktdeploy.agent.tune.select import Trial, should_stop_early
from ktdeploy.core.safeio import creating
from ktdeploy.core.trainer_log import peak_vram_gib, steady_tokens_per_s

GIB = 1024 ** 3


@dataclass
class TrialSpec:
    recipe: str
    overrides: list[str]        # the user's --set values, applied to every trial
    workdir: Path               # trial logs and run records
    warmup_steps: int = 3
    measure_steps: int = 6
    trial_timeout_s: float = 300.0
    # the trainer command; tests swap in a LlamaFactory test double (it receives the same arguments)
    command: tuple[str, ...] = (sys.executable, "-m", "ktdeploy", "train")
    # trial output dirs; must lie on the recipe's output volume (train's rule), never the recipe's output_dir
    trials_root: Path | None = None


def trial_out_dir(spec: TrialSpec, index: int) -> Path:
    return (spec.trials_root or spec.workdir) / f"trial-{index:02d}"


def trial_sets(spec: TrialSpec, cand: Candidate, out_dir: Path) -> list[str]:
    """The --set overrides of one trial: the user's, the candidate's, and a short unsaved run into out_dir."""
    sets = list(spec.overrides)
    for key, value in cand.overrides().items():
        sets.append(f"train.{key}={json.dumps(value)}")
    total = spec.warmup_steps + spec.measure_steps
    sets += [f"train.output_dir={out_dir}", f"train.max_steps={total}", "train.logging_steps=1",
             "train.save_strategy='no'", "train.plot_loss=false", "train.include_num_input_tokens_seen=non_padding",
             "train.resume_from_checkpoint=null"]
    return sets


def trial_argv(spec: TrialSpec, cand: Candidate, out_dir: Path) -> list[str]:
    argv = [*spec.command, spec.recipe, "--skip-doctor",
            "--run-root", str(spec.workdir / (out_dir.name + "-record"))]
    for s in trial_sets(spec, cand, out_dir):
        argv += ["--set", s]
    return argv


def run_trial(spec: TrialSpec, cand: Candidate, index: int, best_rate: float | None,
              on_tick: Callable[[str], None] | None = None) -> Trial:
    out_dir = trial_out_dir(spec, index)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    log_path = spec.workdir / f"trial-{index:02d}.log"
    trial = Trial(cand)
    env = dict(os.environ, RECORD_VRAM="1", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    peak_rss = 0
    with creating(log_path.parent, log_path.name, overwrite=True, binary=False) as log:  # never through a link
        proc = subprocess.Popen(trial_argv(spec, cand, out_dir), stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                peak_rss = max(peak_rss, tree_rss_bytes(proc.pid))
                samples = parse_log(_read(out_dir / "trainer_log.jsonl"))
                rate = steady_tokens_per_s(samples, spec.warmup_steps)
                trial.steps = samples[-1].current_steps if samples else 0
                if on_tick:
                    on_tick(f"{cand.label()}: step {trial.steps}/{spec.warmup_steps + spec.measure_steps}")
                # judge only after at least two measured steps, so one slow step does not condemn a candidate
                if trial.steps >= spec.warmup_steps + 2 and should_stop_early(rate, best_rate):
                    _kill(proc)
                    trial.status, trial.note = "stopped-early", f"{rate:.0f} tok/s < 0.6 × best {best_rate:.0f}"
                    trial.tokens_per_s = rate
                    break
                if time.monotonic() - started > spec.trial_timeout_s:
                    _kill(proc)
                    trial.status, trial.note = "failed", f"timed out after {spec.trial_timeout_s:.0f} s"
                    break
        except KeyboardInterrupt:
            _kill(proc)
            raise
    trial.seconds = time.monotonic() - started
    trial.peak_host_rss_gib = round(peak_rss / GIB, 3) if peak_rss else None
    samples = parse_log(_read(out_dir / "trainer_log.jsonl"))
    trial.peak_gpu_gib = peak_vram_gib(samples)
    if trial.status == "pending":
        rate = steady_tokens_per_s(samples, spec.warmup_steps)
        if proc.returncode == 0 and rate:
            trial.status, trial.tokens_per_s = "ok", round(rate, 1)
        else:
            trial.status = "failed"
            trial.note = f"exit {proc.returncode}: {failure_reason(_read(log_path))} (log: {log_path})"
    trial.steps = samples[-1].current_steps if samples else trial.steps
    return trial


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


def _kill(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
