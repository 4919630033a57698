#!/usr/bin/env python3
"""Move ktdeploy's modules (the layer folders core / controller / agent / cli, then the renames by role of issue 48)
and rewrite references.

    python tools/relayout.py                 # git mv every file still at an old path, then rewrite references
    python tools/relayout.py --imports-only  # only rewrite references (idempotent; for a tree already moved)
    python tools/relayout.py --dry-run       # print what would change, change nothing

The table below is the one source of truth: OLD module -> NEW module. An entry names a module or a package;
a package entry also covers every module under it, so a file that another branch added under an old package
(``ktdeploy/checks/new.py``) is moved to ``ktdeploy/core/checks/new.py`` by a plain re-run after a merge.

References rewritten, in every tracked text file (Python, tests, ansible/, docker/, Dockerfile, bench/, tools/,
docs, pyproject.toml): dotted names ``ktdeploy.old.mod[.attr]`` anywhere (imports, ``-m`` arguments, strings
such as ``"ktdeploy.agent.lf_entry"``, monkeypatch targets), ``from ktdeploy.pkg import submodule`` imports,
and file paths ``ktdeploy/old/mod.py`` / ``ktdeploy/oldpkg/`` in docs, comments and tests.
A name preceded by a dot or a word character (``io.ktdeploy.lock``) is left alone, and so is anything that is
not a module in the table (docker labels such as ``ktdeploy.output=``). Paths given from a layer
(``core/plan/build.py``, ``controller/slurm.py``, as docs/ and comments write them) are rewritten too.

SYMBOLS names the functions and classes that left a module that was split (``controller/api.py``): a
``from ktdeploy.old import name`` import and a dotted ``ktdeploy.old.name`` go to the name's new module.
A call through the old module object (``api.up(...)``) is not rewritten: the table says where each name went.
Renames OLD -> NEW are applied until nothing changes, so a branch written against the oldest layout lands on the
newest.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "ktdeploy"

# OLD -> NEW (without the leading "ktdeploy."). Order does not matter: the longest matching OLD prefix wins.
TABLE: dict[str, str] = {
    # --- core: pure functions of (recipe, facts); no connector, no subprocess, no rendering
    "errors": "core.errors",
    "hashing": "core.hashing",
    "checkpoints": "core.checkpoints",
    "recipe": "core.recipe",
    "recipe.model": "core.recipe.document",          # was one of three model.py
    "facts": "core.facts",                           # the parsers of command output
    "facts.model": "core.facts.host",                # HostFacts and friends (was one of three model.py)
    "checks": "core.checks",
    "plan": "core.plan",                             # the step plan of `ktdeploy up`
    "plan.model": "core.plan.steps",                 # Plan/Stage/Step (was one of three model.py)
    "planner": "core.sizing",                        # memory/disk sizing and advice (was planner/, beside plan/)
    "planner.doctor": "core.sizing.checks",          # the plan.* doctor checks (was planner/doctor.py)
    # --- controller: touches the world through connectors; drives hosts
    "api": "controller.api",
    "executor": "controller.executor",
    "runs": "controller.runs",
    "follow": "controller.follow",
    "connectors": "controller.connectors",
    "images": "controller.images",
    "checks.doctor": "controller.doctor",            # gathers facts through a connector, then runs the core checks
    "facts.gather": "controller.facts_gather",       # runs the fact script through a connector
    "facts.probes": "controller.facts_probes",       # compiles and runs the C probes
    "facts.record": "controller.facts_record",       # records a golden folder from a host
    "agent.hostfacts": "controller.local_host",      # this host's threads, through the doctor's gathering
    # --- agent: what the image runs (train, serve, convert, tune, monitor, lf_entry)
    "agent": "agent",
    "tune": "agent.tune",
    # --- cli: typer app; parse, call, render
    "cli": "cli",
    "cli.render": "cli.output",                      # was render.py beside recipe/render.py
    "agent.entry": "cli.image_entry",                # the image's ENTRYPOINT: an ISA gate, then the CLI
    # --- issue 48: one name per role (no two modules share a name; docs/architecture.md "Names by role")
    "core.recipe.stack_judge": "core.recipe.stack_judge_payload",   # the payload, BOOTSTRAP, the answer's parser
    "controller.stack_judge": "controller.stack_judge_runner",      # runs BOOTSTRAP through a connector
    "core.plan.build": "core.plan.host_plan",        # build_plan: the plan of `up --host` (one of three build.py)
    "core.sched.plan": "core.sched.slurm_plan",      # build_slurm_plan: the plan of `up-slurm`
    "core.facts.build": "core.facts.assemble",       # build_facts: each fact source handed its answers
    "core.facts.stack": "core.facts.stack_probe",    # the stack probe's argv and parser (checks/stack.py judges)
    "core.facts.data": "core.facts.data_listing",    # the DATA script's listing (checks/data.py judges)
    "controller.connectors.docker": "controller.connectors.docker_exec",   # DockerExecConnector
    "core.sched.render": "core.sched.job_files",     # `render --slurm | --k8s` (core/recipe/render.py: the YAMLs)
    "controller.slurm": "controller.slurm_queries",  # status / logs / down of a Slurm run (beside slurm_jobs.py)
    "controller.images.variants": "controller.images.tags",   # the images' tags, stacks, labels
    "agent.tune.api": "agent.tune.session",          # tune(): the trials, the choice, tune.json
    "core.markup": "core.terminal_text",             # esc, terminal_safe (beside core/markers.py)
}

# Test files renamed after the behaviour they hold (issue 48): OLD path -> NEW path. Moved by a plain run when the
# OLD file is back (a branch added it), and rewritten where a doc or a test names the OLD path. A file that was
# split names the file that kept its history; the docstring of each new file says which findings it holds.
TEST_FILES: dict[str, str] = {
    "tests/unit/adversarial/test_probe3_findings.py": "tests/unit/adversarial/test_batch_files_quote_values.py",
    # ... its other findings: test_run_records_refuse_forgery.py, test_remote_answers_bounded.py,
    # test_recipe_paths_and_images_refused.py, test_job_locks.py, test_sync_refuses_hostile_trees.py,
    # test_serve_cache_chain.py, test_slurm_sigterm.py
    "tests/unit/adversarial/test_probe4_findings.py": "tests/unit/adversarial/test_batch_file_escapes.py",
    "tests/unit/adversarial/test_adversarial.py": "tests/unit/adversarial/test_hostile_cli_inputs.py",
    "tests/unit/core/test_one_policy.py": "tests/unit/core/test_policy_callers_agree.py",
    "tests/unit/core/test_follow.py": "tests/unit/core/test_trainer_log.py",
    "tests/unit/core/plan/test_build.py": "tests/unit/core/plan/test_host_plan.py",
    "tests/unit/core/recipe/test_stack_judge.py": "tests/unit/core/recipe/test_stack_judge_payload.py",
}

# Names that left a split module: OLD module.name -> NEW module (the name stays). controller/api.py was split by role
# (issue 48): host up, scheduler up, run queries, doctor's front door, and what the two ups share. The front doors
# now take one request each (core/command_requests.py): up(UpRequest), up_slurm(SlurmUpRequest), doctor(DoctorRequest);
# a call written against the old keyword arguments is rewritten by hand.
SYMBOLS: dict[str, str] = {
    "controller.api.up": "controller.up_host",               # up(UpRequest, *, on_event=, connector=)
    "controller.api.doctor_phase": "controller.up_host",
    "controller.api.planned_user": "controller.up_host",
    "controller.api.up_slurm": "controller.up_slurm",        # up_slurm(SlurmUpRequest, *, on_event=, connector=)
    "controller.api.slurm_variant": "controller.up_slurm",
    "controller.api.status": "controller.run_queries",
    "controller.api.logs": "controller.run_queries",
    "controller.api.down": "controller.run_queries",
    "controller.api.doctor": "controller.doctor_host",       # doctor(DoctorRequest)
    "controller.api.load_up_recipe": "controller.up_inputs",  # native: a NativePair, not a tuple
    "controller.api.check_run_name": "controller.up_inputs",
    "controller.api.load_facts_file": "controller.up_inputs",
    "controller.api.UpResult": "controller.up_record",
    "controller.api.gather_job_state": "controller.up_phases",
    "controller.api.threading_main": "controller.up_phases",
    "controller.api.run_doctor": "controller.up_host",       # a monkeypatch target: up's facts + doctor phase
    "controller.api.RunRecordError": "core.errors",
    # private names that became the module's own (renamed, so rewritten by hand): _check_up_arguments,
    # _check_image_tar, _check_api_key -> up_inputs.check_*; _new_record, _fail, _current_stage -> up_record.new_record,
    # fail, current_stage; _connect_phase, _apply_phase, _cancel_submitted -> up_phases.connect_phase, apply_phase,
    # cancel_submitted
}

# Reference rewriting looks at tracked files under these roots (and these top-level files).
SCOPES = ("ktdeploy/", "tests/", "ansible/", "docker/", "bench/", "tools/", "docs/", ".ci/")
TOP_FILES = ("Dockerfile", "pyproject.toml", "README.md", "run-tests.sh", ".dockerignore")
SKIP = {"tools/relayout.py"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".txt", ".j2", ".json", ".rst", ""}


def _full(mod: str) -> str:
    return f"{PKG}.{mod}" if mod else PKG


MAP = {_full(k): _full(v) for k, v in TABLE.items()}
SYMBOL_MAP = {_full(k): _full(v) for k, v in SYMBOLS.items()}


def _map_once(dotted: str) -> str:
    if dotted in SYMBOL_MAP or any(dotted.startswith(k + ".") for k in SYMBOL_MAP):
        head = next(k for k in SYMBOL_MAP if dotted == k or dotted.startswith(k + "."))
        return SYMBOL_MAP[head] + "." + head.rsplit(".", 1)[1] + dotted[len(head):]
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        head = ".".join(parts[:n])
        if head in MAP:
            return ".".join([MAP[head]] + parts[n:])
    return dotted


def map_name(dotted: str) -> str:
    """``ktdeploy.old.pkg.mod.attr`` -> its new name (longest OLD prefix, or a moved name of SYMBOLS), applied until
    nothing changes; unchanged when nothing matches."""
    for _ in range(10):
        new = _map_once(dotted)
        if new == dotted:
            return new
        dotted = new
    sys.exit(f"relayout table loops at {dotted}")


def _check_table() -> None:
    # Idempotent: a NEW name must map to itself, or a second run would move things again.
    for new in [*MAP.values(), *SYMBOL_MAP.values()]:
        if map_name(new) != new:
            sys.exit(f"relayout table is not idempotent: {new} -> {map_name(new)}")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def module_of(path: str) -> str | None:
    p = Path(path)
    if p.suffix != ".py" or p.parts[0] != PKG:
        return None
    parts = list(p.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def path_of(module: str, is_package: bool) -> Path:
    parts = module.split(".")
    return Path(*parts, "__init__.py") if is_package else Path(*parts).with_suffix(".py")


# ---------------------------------------------------------------- moving files

def planned_moves() -> list[tuple[str, str]]:
    moves = []
    for path in git("ls-files", PKG).splitlines():
        mod = module_of(path)
        if mod is None:
            continue
        new = map_name(mod)
        if new != mod:
            dest = str(path_of(new, path.endswith("__init__.py")))
            if dest != path:
                moves.append((path, dest))
    return moves


def new_packages() -> list[Path]:
    """Each folder on a NEW path needs an __init__.py."""
    need = set()
    for new in MAP.values():
        parts = new.split(".")
        for n in range(2, len(parts)):
            need.add(Path(*parts[:n], "__init__.py"))
    return sorted(need)


def do_moves(dry: bool) -> None:
    moves = planned_moves()
    targets = [d for _, d in moves]
    if len(set(targets)) != len(targets):
        sys.exit("relayout: two files would land on one path: " + ", ".join(sorted({t for t in targets if targets.count(t) > 1})))
    for src, dst in moves:
        print(f"git mv {src} {dst}")
        if not dry:
            (ROOT / dst).parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / dst).exists():
                sys.exit(f"relayout: {dst} exists already (moving {src}); resolve by hand")
            git("mv", src, dst)
    for src, dst in TEST_FILES.items():
        if (ROOT / src).is_file() and not (ROOT / dst).exists():
            print(f"git mv {src} {dst}")
            if not dry:
                git("mv", src, dst)
        elif (ROOT / src).is_file():
            print(f"relayout: {src} is back beside {dst}: move its tests by hand", file=sys.stderr)
    for init in new_packages():
        if not (ROOT / init).exists() and (ROOT / init.parent).is_dir():
            print(f"create {init}")
            if not dry:
                (ROOT / init).write_text(f'"""The {init.parent.name} layer: see docs/architecture.md."""\n')
                git("add", str(init))
    if not dry:
        # Remove the folders emptied by the moves (untracked __pycache__ included).
        for d in sorted({(ROOT / s).parent for s, _ in moves}, key=lambda p: -len(p.parts)):
            if d.is_dir() and not any(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                subprocess.run(["rm", "-rf", str(d)], check=True)


# ---------------------------------------------------------------- rewriting references

DOTTED = re.compile(r"(?<![\w.])" + PKG + r"(?:\.[A-Za-z_]\w*)+")


def rewrite_dotted(text: str) -> str:
    return DOTTED.sub(lambda m: map_name(m.group(0)), text)


# Paths in docs, comments and tests: ktdeploy/old/mod.py, ktdeploy/oldpkg/ (not /opt/ktdeploy/..., not image names).
SLASHED = re.compile(r"(?<![\w./-])" + PKG + r"((?:/[A-Za-z_]\w*)+)(\.py\b|/)?")


def _map_path(m: re.Match) -> str:
    old = PKG + m.group(1).replace("/", ".")
    new = map_name(old)
    if new == old:
        return m.group(0)
    return new.replace(".", "/") + (m.group(2) or "")


# The same paths given from a layer (core/plan/build.py, controller/slurm.py), as docs/ and comments write them; not
# inside a longer path (tests/unit/core/...).
LAYER_SLASHED = re.compile(r"(?<![\w./-])((?:core|controller|agent|cli)(?:/[A-Za-z_]\w*)+)(\.py\b|/)?")


def _map_layer_path(m: re.Match) -> str:
    old = PKG + "." + m.group(1).replace("/", ".")
    new = map_name(old)
    if new == old:
        return m.group(0)
    return new[len(PKG) + 1:].replace(".", "/") + (m.group(2) or "")


def rewrite_paths(text: str) -> str:
    return LAYER_SLASHED.sub(_map_layer_path, SLASHED.sub(_map_path, text))


def rewrite_from_imports(text: str) -> str:
    """``from ktdeploy.pkg import sub1, sub2 as x`` where sub1/sub2 are moved modules -> per-new-parent imports."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not (node.module == PKG or node.module.startswith(PKG + ".")):
            continue
        if not any(map_name(f"{node.module}.{a.name}") != f"{node.module}.{a.name}" for a in node.names):
            continue
        groups: dict[str, list[str]] = {}
        for a in node.names:
            full = f"{node.module}.{a.name}"
            moved = map_name(full)
            if moved != full and (full in MAP or full in SYMBOL_MAP or moved.rsplit(".", 1)[1] != a.name):
                parent, base = moved.rsplit(".", 1)
            else:
                parent, base = map_name(node.module), a.name
            local = a.asname or a.name
            groups.setdefault(parent, []).append(base if base == local else f"{base} as {local}")
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        new = "".join(f"{indent}from {p} import {', '.join(ns)}\n" for p, ns in groups.items())
        edits.append((node.lineno, node.end_lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        old = "".join(lines[start - 1:end])
        tail = old.rstrip("\n")
        comment = tail[tail.rfind("#"):] if "#" in tail.splitlines()[-1] else ""
        if comment and len(new.splitlines()) == 1:
            new = new.rstrip("\n") + "  " + comment + "\n"
        lines[start - 1:end] = [new]
    return "".join(lines)


def rewrite_test_paths(text: str) -> str:
    for old, new in TEST_FILES.items():
        text = re.sub(r"(?<![\w/])" + re.escape(old) + r"\b", new, text)
        old_mod, new_mod = (x.removesuffix(".py").replace("/", ".") for x in (old, new))
        text = re.sub(r"(?<![\w.])" + re.escape(old_mod) + r"\b", new_mod, text)   # an import of the test module
    return text


def rewrite_text(path: str, text: str) -> str:
    if path.endswith(".py"):
        text = rewrite_from_imports(text)
    return rewrite_test_paths(rewrite_paths(rewrite_dotted(text)))


def reference_files() -> list[str]:
    out = []
    for f in git("ls-files").splitlines():
        if f in SKIP or not (f.startswith(SCOPES) or f in TOP_FILES):
            continue
        if Path(f).suffix not in TEXT_SUFFIXES and Path(f).name not in TOP_FILES:
            continue
        if (ROOT / f).is_file() and not (ROOT / f).is_symlink():
            out.append(f)
    return out


def do_rewrites(dry: bool) -> int:
    changed = 0
    for f in reference_files():
        p = ROOT / f
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_text(f, text)
        if new != text:
            changed += 1
            print(f"rewrite {f}")
            if not dry:
                p.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imports-only", action="store_true", help="only rewrite references (idempotent)")
    ap.add_argument("--dry-run", action="store_true", help="print what would change")
    args = ap.parse_args(argv)
    _check_table()
    if not args.imports_only and not args.dry_run and git("status", "--porcelain", "--untracked-files=no").strip():
        print("relayout: the work tree has uncommitted changes; commit or stash them first "
              "(or use --imports-only)", file=sys.stderr)
        return 2
    if not args.imports_only:
        do_moves(args.dry_run)
    n = do_rewrites(args.dry_run)
    print(f"relayout: {n} file(s) {'would be ' if args.dry_run else ''}rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
