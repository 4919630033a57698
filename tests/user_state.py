"""The test session runs apart from the user's own state, and fails when it writes into it anyway.

Loaded by tests/unit/conftest.py and tests/integration/conftest.py (not by tests/infra, which a person runs
against real hosts with their own SSH settings).

At the session's start every place a ktdeploy process (or a tool the suite runs: ansible, docker, pip) reads
"the user's state" from points into the session's temporary folder:

- ``HOME`` is a fresh folder seeded like a user's home: one run record of "theirs" under
  ``~/.local/share/ktdeploy/runs/``, a probe cache under ``~/.cache/ktdeploy/``, a ``~/.local/state/`` — what a
  test that forgets its isolation would act on ("the latest run") or write into;
- ``KTDEPLOY_HOME`` (run records), ``XDG_DATA_HOME``, ``XDG_CACHE_HOME`` (probe and manifest caches),
  ``XDG_STATE_HOME``, ``XDG_CONFIG_HOME``, ``TMPDIR``, ``ANSIBLE_HOME`` (and the ssh plugin's
  ``ANSIBLE_SSH_CONTROL_PATH_DIR``), ``DOCKER_CONFIG`` point at the session's
  own folders (the real docker config is copied, so registry settings still apply); installed toolchains the
  suite only runs (``RUSTUP_HOME``, ``CARGO_HOME``, ``PYENV_ROOT``) keep pointing at the user's installation.

At the end the seeded home must be byte for byte what it was (every entry: kind, size, mode, mtime); otherwise
the session fails (exit status 1) with a list of what changed. What was added to /srv/ktdeploy (the shipped
recipes' volumes, where a test running a recipe as it is would write) and new ``ktdeploy*`` / ``ktd-gather-*``
entries left in /tmp are reported too, but not failed on: other processes on a shared machine write there.
A test asks for its own, stricter isolation (``monkeypatch.setenv("KTDEPLOY_HOME", ...)``) as before; this is
the floor under all of them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

REAL_HOME_VAR = "KTDEPLOY_TEST_USER_HOME"      # the seeded home, for the guard's own test
USER_RUN = "20200101-000000-users-own-run-000000"
TMP_PATTERNS = ("ktdeploy", "ktd-gather-")    # what ktdeploy itself names in /tmp (never a test's own folder)
SHIPPED_VOLUMES = Path("/srv/ktdeploy")       # the shipped recipes' volumes: a test that runs one as it is lands here
TOOL_HOMES = {"RUSTUP_HOME": ".rustup", "CARGO_HOME": ".cargo", "PYENV_ROOT": ".pyenv"}
_STATE: dict = {}


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (not following links): kind, size, mode, mtime of files, link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            reg = stat.S_ISREG(st.st_mode)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size if reg else 0, st.st_mode,
                                             st.st_mtime_ns if reg else 0,
                                             os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out


def tmp_entries(tmp: Path = Path("/tmp")) -> set[str]:
    try:
        return {n for n in os.listdir(tmp) if n.startswith(TMP_PATTERNS)}
    except OSError:
        return set()


def _volumes() -> dict[str, tuple]:
    out = snapshot(SHIPPED_VOLUMES) if SHIPPED_VOLUMES.is_dir() else {}
    if SHIPPED_VOLUMES.exists():
        out["."] = ("exists",)
    return out


def seed_home(home: Path) -> None:
    """A user's home as ktdeploy leaves it: one finished run of theirs, a probe cache, a state folder."""
    run = home / ".local/share/ktdeploy/runs" / USER_RUN
    (run / "artifacts").mkdir(parents=True)
    (run / "rendered").mkdir()
    (run / "status.json").write_text(json.dumps({
        "id": USER_RUN, "state": "finished", "host": "users-own-gpu-host", "recipe": "users-recipe",
        "container": "ktd-users-recipe-00000000", "serve_container": "ktd-users-recipe-00000000-serve",
        "output_dir": "/srv/users/output", "created": 1577836800.0, "schema": 1}) + "\n")
    (run / "events.jsonl").write_text('{"ts": 1577836800.0, "event": "finished"}\n')
    (home / ".cache/ktdeploy/probes").mkdir(parents=True)
    (home / ".local/state").mkdir(parents=True)
    (home / ".config").mkdir(parents=True)


def _isolate(root: Path) -> dict[str, str | None]:
    """Point every user-state variable into ``root``; returns the previous values."""
    home = root / "home"
    seed_home(home)
    folders = {"KTDEPLOY_HOME": root / "ktdeploy-home", "XDG_DATA_HOME": root / "xdg-data",
               "XDG_CACHE_HOME": root / "xdg-cache", "XDG_STATE_HOME": root / "xdg-state",
               "XDG_CONFIG_HOME": root / "xdg-config", "TMPDIR": root / "tmp", "ANSIBLE_HOME": root / "ansible",
               "DOCKER_CONFIG": root / "docker-config",
               # ansible's ssh plugin keeps its ControlPath sockets in ~/.ansible/cp whatever ANSIBLE_HOME says
               "ANSIBLE_SSH_CONTROL_PATH_DIR": root / "ansible" / "cp"}
    for p in folders.values():
        p.mkdir(parents=True, exist_ok=True)
    real_docker = Path(os.environ.get("DOCKER_CONFIG") or Path(os.path.expanduser("~")) / ".docker") / "config.json"
    if real_docker.is_file():
        shutil.copy(real_docker, folders["DOCKER_CONFIG"] / "config.json")
    # toolchains the suite only runs keep their installation (rustup's proxies, pyenv's shims find it through HOME)
    real = Path(os.path.expanduser("~"))
    tools = {var: str(real / sub) for var, sub in TOOL_HOMES.items() if not os.environ.get(var) and (real / sub).is_dir()}
    new = {"HOME": str(home), REAL_HOME_VAR: str(home), **{k: str(v) for k, v in folders.items()}, **tools}
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    tempfile.tempdir = None   # tempfile caches its folder: the next call reads TMPDIR again
    return old


def pytest_sessionstart(session: pytest.Session) -> None:
    if _STATE:
        return   # loaded twice (both tiers in one run): one isolation
    root = Path(tempfile.mkdtemp(prefix="ktdtest-session-"))
    _STATE["root"] = root
    atexit.register(shutil.rmtree, root, True)   # after pytest's own clean-up of its folders inside it
    _STATE["tmp_before"] = tmp_entries()
    _STATE["old"] = _isolate(root)
    _STATE["home"] = Path(os.environ["HOME"])
    _STATE["before"] = snapshot(_STATE["home"])
    _STATE["volumes"] = _volumes()


def changes(before: dict, after: dict) -> list[str]:
    out = [f"added    ~/{p}" for p in sorted(set(after) - set(before))]
    out += [f"removed  ~/{p}" for p in sorted(set(before) - set(after))]
    out += [f"modified ~/{p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "home" not in _STATE or _STATE.get("done"):
        return
    _STATE["done"] = True
    problems = changes(_STATE["before"], snapshot(_STATE["home"]))
    # shared places: another process on this machine may write there meanwhile, so they are reported, not failed on
    shared = [p.replace("~/", f"{SHIPPED_VOLUMES}/", 1) for p in changes(_STATE["volumes"], _volumes())
              if not p.startswith("removed")]
    shared += [f"left     /tmp/{n}" for n in sorted(tmp_entries() - _STATE["tmp_before"])]
    for k, v in _STATE["old"].items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    tempfile.tempdir = None
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if shared and tr is not None:
        tr.write_sep("=", "shared places changed during the session", yellow=True)
        tr.write_line("(this session's, or another process's on this machine):\n  " + "\n  ".join(shared[:50]))
    if problems:
        text = ("the test session wrote into the user's state (it must write only into its temporary folders):\n  "
                + "\n  ".join(problems[:50]) + (f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""))
        if tr is not None:
            tr.write_sep("=", "user state changed", red=True)
            tr.write_line(text)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
