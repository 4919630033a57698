"""One run in one row (`ktdeploy status --all`): its stage, its age and a one-line reason, from status.json alone.

Pure: a run's status object (core/run_record.RunStatus) and the time now in, text out; nothing asks the host (a
detached run's live state is `ktdeploy status --run ID`'s job)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from ktdeploy.core.run_record import RunStatus

REASON_WIDTH = 120   # a reason longer than this is cut with "…" (the whole text: `ktdeploy status --run ID`)


def age(st: Mapping[str, Any], now: float) -> str:
    """How long ago the run started (status.json's ``created``, else its last change): 45s, 12m, 3h, 2d."""
    t = st.get("created")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        t = st.get("updated")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return "?"
    s = max(0.0, now - float(t))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def stage(st: RunStatus) -> str:
    """The stage a run failed in, else the one it was in (a finished run: the last it reached)."""
    for key in ("failed_stage", "stage", "stops_at"):
        v = st.get(key)
        if isinstance(v, str) and v:
            return v
    return "PREFLIGHT" if st.get("state") in ("planned", "stopped") else ""


def _first_line(text: object) -> str:
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _progress(st: RunStatus) -> str:
    p = st.get("progress")   # the newest trainer-log entry FOLLOW saw (core/trainer_log.LogEntry as JSON)
    if not isinstance(p, dict) or p.get("current_steps") is None:
        return ""
    text = f"step {p.get('current_steps')}/{p.get('total_steps', '?')}"
    loss = p.get("loss")
    return text + (f", loss {loss:.4f}" if isinstance(loss, (int, float)) and not isinstance(loss, bool) else "")


def reason(st: RunStatus) -> str:
    """Why the run is in its state, on one line: a failure's error (the trainer's own exception leads a crash's),
    a detached or stopped run's note, a training run's last step, a finished run's adapter."""
    state = st.get("state")
    if state in ("failed", "crashed") or st.get("error"):
        text = _first_line(st.get("error")) or "no error recorded"
    elif state in ("training", "running"):
        text = _progress(st) or f"in {stage(st) or 'PREFLIGHT'}"
    elif state == "finished":
        text = f"adapter {st['adapter_dir']}" if isinstance(st.get("adapter_dir"), str) else "finished"
        if st.get("down"):
            text += "; containers removed (ktdeploy down)"
    elif state in ("detached", "stopped"):
        text = _first_line(st.get("note"))
        if st.get("down"):
            text = "containers removed (ktdeploy down)" + (f"; {text}" if text else "")
        progress = _progress(st)
        if progress:
            text = f"{text} (last seen: {progress})" if text else f"last seen: {progress}"
    elif state == "planned":
        text = "started; no stage finished yet (or the controller was killed)"
    else:
        text = _first_line(st.get("stop_reason") or st.get("note"))
    return text if len(text) <= REASON_WIDTH else text[:REASON_WIDTH - 1] + "…"


def rerun_command(st: RunStatus, *, resume: bool) -> str:
    """The `ktdeploy up` that goes on with this run, from its record: its host, recipe, name, waivers and profile
    (``resume``: with --resume auto, what every crash's restart is). --set options are not recorded: said apart."""
    argv = ["ktdeploy", "up", "--host", str(st.get("host") or "localhost")]
    recipe = st.get("recipe_path")
    if isinstance(recipe, str) and recipe:
        argv.append(recipe)
    if st.get("name"):
        argv += ["--name", str(st["name"])]
    from ktdeploy.core.checks.gate import CPU_ONLY, CPU_ONLY_WAIVERS

    profile = st.get("profile") == CPU_ONLY
    if profile:
        argv.append("--cpu-only")
    waived = st.get("waived")
    for check in waived if isinstance(waived, list) else []:
        if isinstance(check, str) and not (profile and check in CPU_ONLY_WAIVERS):
            argv += ["--waive", check]
    if resume:
        argv += ["--resume", "auto"]
    return shlex.join(argv)
