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

``status``, ``logs``, ``down`` and ``up --resume`` read them back.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ktdeploy.core.errors import RunRecordError

STATES = ("planned", "running", "training", "detached", "finished", "failed", "crashed", "stopped", "dry-run")


def home() -> Path:
    base = os.environ.get("KTDEPLOY_HOME")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(xdg) / "ktdeploy"


def runs_dir() -> Path:
    return home() / "runs"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:40] or "run"


def new_run_id(recipe_name: str, now: float | None = None) -> str:
    t = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{t}-{_slug(recipe_name)}-{secrets.token_hex(3)}"


def _dump(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class RunRecord:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    # -- writing --------------------------------------------------------------------------------
    @classmethod
    def create(cls, recipe_name: str, root: Path | None = None) -> "RunRecord":
        root = root or runs_dir()
        root.mkdir(parents=True, exist_ok=True)
        rid = new_run_id(recipe_name)
        p = root / rid
        p.mkdir()
        (p / "rendered").mkdir()
        (p / "artifacts").mkdir()
        return cls(p)

    def write_text(self, name: str, text: str) -> Path:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        return p

    def write_json(self, name: str, data: Any) -> Path:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        _dump(p, data)
        return p

    def event(self, kind: str, **data: Any) -> dict:
        ev = {"ts": round(time.time(), 3), "event": kind, **data}
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(ev, default=str) + "\n")
        return ev

    def set_status(self, state: str, **data: Any) -> dict:
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        cur = self.status() if (self.path / "status.json").exists() else {}
        cur.update(data)
        cur.update(state=state, updated=round(time.time(), 3), id=self.id)
        _dump(self.path / "status.json", cur)
        return cur

    # -- reading --------------------------------------------------------------------------------
    def read_json(self, name: str) -> Any:
        p = self.path / name
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunRecordError(f"run record {self.id} has no {name}", fix=f"Look inside {self.path}.") from None
        except ValueError as e:
            raise RunRecordError(f"run record {self.id}: {name} is not valid JSON ({e})",
                                 fix=f"Inspect or remove {self.path}.") from None

    def status(self) -> dict:
        return self.read_json("status.json")

    def events(self) -> list[dict]:
        p = self.path / "events.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line from a killed controller
        return out


def all_runs(root: Path | None = None) -> list[RunRecord]:
    """Every run record with a status, oldest first."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    recs = [RunRecord(p) for p in root.iterdir() if p.is_dir() and (p / "status.json").exists()]
    return sorted(recs, key=lambda r: (r.status().get("created", 0), r.id))


def find_runs(host: str | None = None, *, container: str | None = None, include_dry: bool = False,
              root: Path | None = None) -> list[RunRecord]:
    out = []
    for r in all_runs(root):
        st = r.status()
        if not include_dry and st.get("state") == "dry-run":
            continue
        if host is not None and st.get("host") != host:
            continue
        if container is not None and st.get("container") != container:
            continue
        out.append(r)
    return out


def latest_run(host: str | None = None, *, run_id: str | None = None, root: Path | None = None) -> RunRecord:
    """The run named by ``run_id`` (an id or a unique prefix), else the newest run (on ``host``)."""
    root = root or runs_dir()
    if run_id:
        exact = root / run_id
        if (exact / "status.json").exists():
            return RunRecord(exact)
        matches = [r for r in all_runs(root) if r.id.startswith(run_id)]
        if len(matches) == 1:
            return matches[0]
        raise RunRecordError(f"no single run record matches {run_id!r} in {root}",
                             fix="List the runs with `ktdeploy status --all`.")
    runs = find_runs(host, root=root)
    if not runs:
        where = f" for host {host!r}" if host else ""
        raise RunRecordError(f"no ktdeploy run recorded{where} in {root}",
                             fix="Start one with `ktdeploy up --host HOST RECIPE` (or set KTDEPLOY_HOME).")
    return runs[-1]
