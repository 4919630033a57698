"""The run-record formats, in one place (pure: names, states, serialize / parse; no file I/O).

Two records, one schema version, written and read only through this module:

- the **controller's record**, one folder per ``ktdeploy up`` under ``$KTDEPLOY_HOME/runs/<id>/``
  (``controller/runs.RunRecord`` writes and reads it; ``status``, ``logs``, ``down``, ``up --resume`` read it):
  ``status.json`` (a JSON object, rewritten on each change: ``state`` one of ``RUN_STATES``, ``id``,
  ``updated``, ``schema``, host/container/...), ``events.jsonl`` (one ``{"ts", "event", ...}`` per line,
  appended), ``recipe.yaml``, ``plan.json``, ``facts.json``, ``doctor.json``, ``job_state.json``,
  ``rendered/``, ``artifacts/``;
- the **agent's record**, one folder per ``ktdeploy train`` (in the image, beside the output dir:
  ``<dirname(output_dir)>/.ktdeploy-runs/<basename(output_dir)>/<UTC time>/``; ``agent/train.py`` writes it,
  ``agent/lf_entry.py`` adds ``ranks.jsonl`` / ``metrics.jsonl`` and, on rank 0, the final files):
  ``status`` (one line: one of ``AGENT_STATES``), ``rc`` (one line: the exit status), ``summary.json``
  (a JSON object with ``schema`` and ``SUMMARY_KEYS``), ``launch_mode`` (``exec`` when ``--exec`` launched it),
  ``ranks.jsonl`` (``{"rank", "rc", "hwm_bytes"}`` per finished rank), ``metrics.jsonl`` (per step),
  ``command.json``, ``tuned.json``, ``doctor.json``, ``train.yaml``, ``accelerate.yaml``, ``launch.sh``,
  ``stdout.log``. ``read_agent_record`` reads it back from the files' texts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ktdeploy.core.safeio import parse_json

SCHEMA_VERSION = 1

# -- the controller's record ---------------------------------------------------------------------------------------
RUN_STATES = ("planned", "running", "training", "detached", "finished", "failed", "crashed", "stopped", "dry-run")
STATUS_JSON = "status.json"
EVENTS = "events.jsonl"
RECIPE = "recipe.yaml"
PLAN = "plan.json"
FACTS = "facts.json"
DOCTOR = "doctor.json"
JOB_STATE = "job_state.json"
RENDERED = "rendered"
ARTIFACTS = "artifacts"
TRAIN_LOG = "container.log"   # artifacts/: the training container's whole log, kept when FOLLOW ends
# artifacts/: the output of a stage's one-shot container (`docker run --rm`: gone once it ends), kept by the executor
STEP_LOGS = {"weights.prepare": "prepare-weights.log", "convert.adapter": "convert.log", "convert.merge": "merge.log"}


class LiveStatus(TypedDict, total=False):
    """What `ktdeploy status` reads from the host (or the cluster) now, never from the record; ``error`` when the
    host could not be asked."""

    error: str
    container: dict[str, Any] | None     # the training container's state (core/plan/state.ContainerState)
    progress: dict[str, Any] | None      # the trainer log's newest entry (core/trainer_log.LogEntry)
    serve: dict[str, Any] | None         # the serving container's state
    jobs: dict[str, dict[str, Any]]      # an up-slurm run: role -> its job's state


class RunStatus(TypedDict, total=False):
    """status.json as `parse_status_json` hands it on (the controller -> `status`, `logs`, `down`, the CLI): the
    keys it checks are typed as checked (text, a map of text, a list of text); the others are what the file
    holds (``object``: a record may be old or forged). `status` adds ``record`` (its folder) and ``live``."""

    id: str
    name: str | None
    state: str
    host: str
    recipe: str
    container: str
    serve_container: str
    output_dir: str
    error: str | None
    fix: str | None
    failed_stage: str | None
    stage: str | None
    stops_at: str | None
    stop_reason: str | None
    scheduler: str | None
    job_dir: str | None
    down: dict[str, str]
    failed_checks: list[str]
    recipe_path: object
    created: object
    updated: object
    schema: object
    waived: object
    dry_run: object
    profile: object
    facts_file: object
    error_type: object
    exit_code: object
    down_at: object
    note: object
    image: object
    adapter_dir: object
    resume_from: object
    slurm_jobs: object
    slurm_request: object
    eval: object   # the EVAL stage's summary (controller/eval_stage.py)
    lock: str      # the job lock's key (controller/runs.lock_key): one run of a job on a place, however spelled
    eta: object    # planned and measured step time of the training (core/eta.py)
    progress: object   # the newest trainer-log entry FOLLOW saw (core/trainer_log.LogEntry.to_json)
    record: str
    live: LiveStatus


def status_update(current: Mapping[str, Any], state: str, run_id: str, now: float, **data: Any) -> dict[str, Any]:
    """The next status.json object: ``current`` updated with ``data``, then state / updated / id / schema."""
    if state not in RUN_STATES:
        raise ValueError(f"unknown run state {state!r}")
    cur = dict(current)
    cur.update(data)
    cur.update(state=state, updated=round(now, 3), id=run_id, schema=SCHEMA_VERSION)
    return cur


STATUS_TEXT_KEYS = ("id", "state", "host", "recipe", "container", "serve_container", "output_dir")
STATUS_OPTIONAL_TEXT = ("name", "error", "fix", "failed_stage", "stage", "stops_at", "stop_reason", "scheduler",
                        "job_dir", "lock")


def parse_status_json(text: str | bytes) -> RunStatus:
    """status.json -> its object, passwords dropped from its strings (a record written before they were
    redacted on write still never shows one); ValueError when it is not a JSON object or a key the commands
    act on (``STATUS_TEXT_KEYS``) holds something other than text."""
    from ktdeploy.core.safeio import redact

    try:
        data = parse_json(text)  # ValueError for bad JSON, too deep or a too-long integer
    except ValueError:
        raise
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for key in STATUS_TEXT_KEYS + STATUS_OPTIONAL_TEXT:
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"{key!r} is {type(data[key]).__name__}, not text")
    if "state" in data and data["state"] not in RUN_STATES:
        raise ValueError(f"'state' is {str(data['state'])[:40]!r}, not one of {', '.join(RUN_STATES)}")
    down = data.get("down")
    if down is not None and not (isinstance(down, dict) and all(isinstance(v, str) for v in down.values())):
        raise ValueError("'down' is not a map of container -> what down did")
    checks = data.get("failed_checks")
    if checks is not None and not (isinstance(checks, list) and all(isinstance(c, str) for c in checks)):
        raise ValueError("'failed_checks' is not a list of check names")
    data.pop("live", None)   # computed by `status` from the host, never taken from the file
    status: RunStatus = redact(data)
    return status


def event(kind: str, now: float, **data: Any) -> dict[str, Any]:
    return {"ts": round(now, 3), "event": kind, **data}


def parse_events(text: str) -> list[dict[str, Any]]:
    """events.jsonl -> its events; a torn or unreadable line (a controller killed mid-write) is left out."""
    out = []
    for line in text.splitlines():
        try:
            ev = parse_json(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


# -- the agent's record --------------------------------------------------------------------------------------------
STATUS = "status"
RC = "rc"
SUMMARY = "summary.json"
LAUNCH_MODE = "launch_mode"
RANKS = "ranks.jsonl"
METRICS = "metrics.jsonl"
COMMAND = "command.json"
TUNED = "tuned.json"
STDOUT_LOG = "stdout.log"
TRAIN_YAML = "train.yaml"
ACCELERATE_YAML = "accelerate.yaml"
LAUNCH_SH = "launch.sh"
AGENT_DOCTOR = DOCTOR

AGENT_STATES = ("starting", "running", "interrupted", "succeeded", "failed")
LAUNCH_EXEC = "exec"
SUMMARY_KEYS = ("rc", "wall_s", "peak_host_rss_gib", "peak_host_rss_hwm_gib", "peak_gpu_mem_gib",
                "steady_tokens_per_s", "loss_first", "loss_last", "steps", "train_results", "artifacts")


def status_text(state: str) -> str:
    if state not in AGENT_STATES:
        raise ValueError(f"unknown training state {state!r}")
    return state + "\n"


EXIT_SAVED_ON_REQUEST = 75   # agent/stop_request.EXIT_SAVED: a checkpoint saved on a scheduler's request, then stopped


def final_state(rc: int) -> str:
    if rc == EXIT_SAVED_ON_REQUEST:
        return "stopped"   # resumable: `train --resume auto` starts from the checkpoint it saved
    return "succeeded" if rc == 0 else "failed"


def rc_text(rc: int) -> str:
    return f"{rc}\n"


def summary_text(summary: Mapping[str, Any]) -> str:
    return json.dumps({"schema": SCHEMA_VERSION, **summary}, indent=2) + "\n"


def rank_line(rank: int, rc: int, hwm_bytes: int) -> str:
    return json.dumps({"rank": rank, "rc": rc, "hwm_bytes": hwm_bytes}) + "\n"


def parse_ranks(text: str) -> list[dict[str, Any]]:
    """ranks.jsonl -> one {"rank", "rc", "hwm_bytes"} per finished rank (torn lines left out)."""
    return [r for r in parse_events(text) if "rank" in r]


def metrics_line(row: Mapping[str, Any]) -> str:
    return json.dumps(dict(row)) + "\n"


def parse_metrics(text: str) -> list[dict[str, Any]]:
    """metrics.jsonl -> its rows (torn lines left out)."""
    return parse_events(text)


@dataclass
class AgentRecord:
    """An agent record as read back: ``state`` None when there is no (readable) status file."""

    state: str | None = None
    rc: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    launch_mode: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed")


def read_agent_record(files: Mapping[str, str | None]) -> AgentRecord:
    """An agent record from its files' texts ({file name: text, None or absent when missing}). A record whose
    trainer was killed outright (OOM killer, SIGKILL) reads as state ``running`` with no rc."""
    rec = AgentRecord()
    st = (files.get(STATUS) or "").strip()
    rec.state = st if st in AGENT_STATES else None
    rc = (files.get(RC) or "").strip()
    rec.rc = int(rc) if rc.lstrip("-").isdigit() and len(rc) <= 12 else None
    try:
        summary = parse_json(files.get(SUMMARY) or "{}")
    except ValueError:
        summary = {}
    rec.summary = summary if isinstance(summary, dict) else {}
    rec.launch_mode = (files.get(LAUNCH_MODE) or "").strip() or None
    rec.ranks = parse_ranks(files.get(RANKS) or "")
    return rec


AGENT_FILES = (STATUS, RC, SUMMARY, LAUNCH_MODE, RANKS)   # what read_agent_record reads
