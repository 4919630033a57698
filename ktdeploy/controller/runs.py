"""Run records on the controller, ansible-runner style: one folder per ``ktdeploy up``.

    $KTDEPLOY_HOME/runs/<id>/            (default ~/.local/share/ktdeploy/runs/<id>/)
      recipe.yaml     the recipe as given (after --set overrides)
      plan.json       the plan that was applied
      facts.json      the host facts it was built from
      doctor.json     doctor's report
      events.jsonl    one JSON object per stage/step event, appended as they happen
      status.json     {"state": ..., "host": ..., "container": ..., ...}, rewritten on each change
      rendered/       train.yaml, accelerate.yaml, launch.sh, the shipped recipe
      artifacts/      files fetched back (training_loss.png, all_results.json, logs)

``status``, ``logs``, ``down`` and ``up --resume`` read them back. The format is core/run_record.py's (shared with
the agent's in-image training record); this module does the file I/O.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.core import run_record as rr
from ktdeploy.core.errors import ConnectError, RunRecordError, UsageError
from ktdeploy.core.safeio import MAX_JSON, append_line, parse_json, printable, read_bytes, redact, run_lock, write_file

STATES = rr.RUN_STATES   # the format (file names, states, keys, schema version) is core/run_record.py's


def home() -> Path:
    base = os.environ.get("KTDEPLOY_HOME")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(xdg) / "ktdeploy"


def runs_dir() -> Path:
    return home() / "runs"


def target_key(host: str | None) -> str:
    """The place ``host`` names, however spelled (core/host_target.py: ``HostTarget.lock_key``); the user ssh
    logs in as when none is given is this machine's, as paramiko's."""
    import getpass

    from ktdeploy.core.host_target import parse_host

    return parse_host(host or "").lock_key(getpass.getuser())


def same_target(a: object, b: object) -> bool:
    """Whether two recorded/given hosts name one place (``target_key``); a value that is no host equals only
    itself."""
    if a == b:
        return True
    try:
        return isinstance(a, str) and isinstance(b, str) and target_key(a) == target_key(b)
    except UsageError:
        return False


def lock_key(host: str | None, job: str) -> str:
    """What one run's lock is keyed on (``status`` shows it): the target, however spelled, and the job."""
    return f"{target_key(host)} {job}"


def job_lock(host: str | None, job: str) -> AbstractContextManager[None]:
    """One run, one lock: `up` (not a dry run) and `down` hold it for the job ``job`` on the place ``host`` names
    (every spelling of it: ``lock_key``) while they act, so a second `up`, or a `down` racing an `up`, gets one
    clear refusal instead of removing the other's containers. flock: a killed process frees it."""
    return run_lock(home() / "locks", lock_key(host, job), what=f"the job {job} on {target_key(host)}")


def output_lock(conn: Connector, host: str | None, output_dir: str) -> AbstractContextManager[None]:
    """The second lock of one run: the output folder as the host resolves it (``realpath -m``: links, '..'), so two
    spellings of one folder — a link to it, '//srv/o', 'a/./b' — are one job, whatever their container names.
    A host without GNU realpath: the folder's normalized spelling (core: ``output_dir_of``)."""
    resolved = output_dir
    try:
        r = conn.run(["realpath", "-m", "--", output_dir], timeout=30)
        text = r.stdout.strip() if r.rc == 0 else ""
        if text.startswith("/") and "\n" not in text and "\0" not in text:
            resolved = text
    except ConnectError:
        pass
    return run_lock(home() / "locks", f"{target_key(host)}\noutput\n{resolved}",
                    what=f"the output folder {printable(resolved)} on {target_key(host)}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:40] or "run"


def new_run_id(recipe_name: str, now: float | None = None) -> str:
    t = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{t}-{_slug(recipe_name)}-{secrets.token_hex(3)}"


def _dump(path: Path, data: Any) -> None:
    write_file(path.parent, path.name, json.dumps(redact(data), indent=2, sort_keys=False, default=str) + "\n",
               overwrite=True)


@dataclass
class RunRecord:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    # -- writing --------------------------------------------------------------------------------
    @classmethod
    def create(cls, recipe_name: str, root: Path | None = None) -> RunRecord:
        root = root or runs_dir()
        root.mkdir(parents=True, exist_ok=True)
        rid = new_run_id(recipe_name)
        p = root / rid
        p.mkdir()
        (p / rr.RENDERED).mkdir()
        (p / rr.ARTIFACTS).mkdir()
        return cls(p)

    def write_text(self, name: str, text: str) -> Path:
        p = self.path / name

        return write_file(p.parent, p.name, redact(text), overwrite=True)

    def write_json(self, name: str, data: Any) -> Path:
        p = self.path / name
        _dump(p, data)
        return p

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        ev = rr.event(kind, time.time(), **data)
        append_line(self.path / rr.EVENTS, json.dumps(redact(ev), default=str))
        return ev

    def set_status(self, state: str, **data: Any) -> dict[str, Any]:
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        old: Mapping[str, Any] = self.status() if (self.path / rr.STATUS_JSON).exists() else {}
        cur = rr.status_update(old, state, self.id, time.time(), **data)
        _dump(self.path / rr.STATUS_JSON, cur)
        return cur

    # -- reading --------------------------------------------------------------------------------
    def _read(self, name: str) -> bytes:
        """A record file's bytes through safeio (a FIFO, device or folder in its place is refused, not waited on;
        at most MAX_JSON bytes)."""
        p = self.path / name
        if not os.path.lexists(p):
            raise RunRecordError(f"run record {self.id} has no {name}", fix=f"Look inside {self.path}.")
        # the file and, through a link, what it points at: another user wrote neither, or its host, containers,
        # job ids are not ours to act on
        try:
            owner = next((u for u in (os.lstat(p).st_uid, os.stat(p).st_uid) if u not in (0, os.getuid())),
                         os.getuid())
        except OSError as e:
            raise RunRecordError(f"run record {self.id}: {name} cannot be read ({e.strerror})",
                                 fix=f"Inspect or remove {self.path}.") from None
        if owner not in (0, os.getuid()):
            raise RunRecordError(f"run record {self.id}: {name} belongs to uid {owner}, not to you",
                                 fix=f"Inspect {self.path}; ktdeploy acts only on records you (or root) wrote.")
        try:
            return read_bytes(p, MAX_JSON, f"run record's {name}")
        except UsageError as e:
            raise RunRecordError(f"run record {self.id}: {e.message}", fix=f"Inspect or remove {self.path}.") from None

    def read_json(self, name: str) -> Any:
        raw = self._read(name)
        try:
            return rr.parse_status_json(raw) if name == rr.STATUS_JSON else parse_json(raw)
        except ValueError as e:
            raise RunRecordError(f"run record {self.id}: {name} is not valid ({printable(e)})",
                                 fix=f"Inspect or remove {self.path}.") from None

    def status(self) -> rr.RunStatus:
        raw = self._read(rr.STATUS_JSON)
        try:
            return rr.parse_status_json(raw)
        except ValueError as e:
            raise RunRecordError(f"run record {self.id}: {rr.STATUS_JSON} is not valid ({printable(e)})",
                                 fix=f"Inspect or remove {self.path}.") from None

    def status_text(self, key: str, status: Mapping[str, object] | None = None, *, empty_ok: bool = False) -> str:
        """A key the commands act on (host, container, output_dir, ...) of ``status`` (read when not given): text,
        or a RunRecordError naming it."""
        value = (self.status() if status is None else status).get(key)
        if not isinstance(value, str) or not (value or empty_ok):
            raise RunRecordError(f"run record {self.id}: status.json has no {key!r}",
                                 fix=f"Inspect or remove {self.path}; `ktdeploy status --all` lists the others.")
        return value

    def events(self) -> list[dict[str, Any]]:
        if not os.path.lexists(self.path / rr.EVENTS):
            return []
        # a torn last line from a killed controller: left out
        return rr.parse_events(self._read(rr.EVENTS).decode("utf-8", errors="replace"))


def all_runs(root: Path | None = None) -> list[RunRecord]:
    """Every run record with a status, oldest first."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    recs = []
    for p in root.iterdir():
        if not p.is_dir() or not (p / rr.STATUS_JSON).exists():
            continue
        r = RunRecord(p)
        try:
            created = r.status().get("created", 0)
        except (RunRecordError, AttributeError):
            continue  # one corrupt record must not hide the others (`status --all` lists the readable ones)
        recs.append((created if isinstance(created, (int, float)) else 0, r.id, r))
    return [r for *_, r in sorted(recs, key=lambda t: (t[0], t[1]))]


def find_runs(host: str | None = None, *, container: str | None = None, include_dry: bool = False,
              root: Path | None = None) -> list[RunRecord]:
    out = []
    for r in all_runs(root):
        st = r.status()
        # a dry run never becomes "the latest run", however it ended (a plan printed, a failing doctor, an
        # unreachable host, a killed controller): it started nothing that status/logs/down could act on
        if not include_dry and (st.get("state") == "dry-run" or st.get("dry_run")):
            continue
        if host is not None and not same_target(st.get("host"), host):   # any spelling of the place
            continue
        if container is not None and st.get("container") != container:
            continue
        out.append(r)
    return out


def latest_run(host: str | None = None, *, run_id: str | None = None, root: Path | None = None) -> RunRecord:
    """The run named by ``run_id`` (an id, a run's --name — its newest run —, or a unique id prefix), else the
    newest run (on ``host``)."""
    root = root or runs_dir()
    if run_id is not None:
        from ktdeploy.core.safeio import run_id_name

        run_id_name(run_id)  # a name, never a path: '../../x' is refused before any file is looked at
        exact = root / run_id
        if (exact / rr.STATUS_JSON).exists():
            return RunRecord(exact)
        named = [r for r in all_runs(root) if r.status().get("name") == run_id]
        if named:
            return named[-1]
        matches = [r for r in all_runs(root) if r.id.startswith(run_id)]
        if len(matches) == 1:
            return matches[0]
        what = f"{len(matches)} run records start with" if matches else "no run record matches"
        raise RunRecordError(f"{what} {run_id!r} in {root}",
                             fix="List the runs with `ktdeploy status --all` and give a longer part of one id.")
    runs = find_runs(host, root=root)
    if not runs:
        where = f" for host {host!r}" if host else ""
        raise RunRecordError(f"no ktdeploy run recorded{where} in {root}",
                             fix="Start one: `ktdeploy up` (the shipped tiny recipe on this machine), or `ktdeploy "
                                 "up --host gpu01 recipes/tiny-moe-lora.yaml --dry-run` to see the plan first (records "
                                 "are read from $KTDEPLOY_HOME/runs when it is set).")
    return runs[-1]
