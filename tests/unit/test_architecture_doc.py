"""docs/architecture.md states only what the code does: every file, folder, module and name it gives as where
something lives today must exist there, and its figures must match what they count.

The "was in" column of the one-policy table is history (it names code that has moved), so it is not checked; the
few older names the prose mentions on purpose (the relayout table, a moved file) are listed in HISTORY.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "ktdeploy"

# named in the prose as the past (the relayout's OLD names, moved files, removed literals)
HISTORY = {"planner", "plan.model", "facts.model", "recipe.model", "checks.doctor", "cli.render", "agent.entry",
           "core/checks/result.py", "core/safeio.redact_host", "STAGES", "_BACKEND_METHOD", "auto_backend",
           "core/plan/host_plan.py:_resume_target", "agent/train.py:resolve_resume", "agent/train._summarise",
           "core/checks/resources.recipe_requirements", "core/sizing/checks.plan_check_results",
           "agent_runs_base", "adapter_dir_for", "merged_dir_for", "agent/train.write_record",
           "controller/images/build.commit_changes", "cli/image_entry.isa_gate", "controller/api.py"}

_TOKEN = re.compile(r"`([^`]+)`")
_PATHISH = re.compile(r"^(?:ktdeploy/|tests/|tools/|docs/|bench/|docker/|ansible/)?"
                      r"(?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*(?:\.py|/)?(?:[.:][A-Za-z_][A-Za-z0-9_]*)?(?:\(.*\))?$")


def _claims() -> list[str]:
    """Backticked tokens stated as today's code: whole prose lines, and only the last column of table rows whose
    header has a "was in" column."""
    out: list[str] = []
    history_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if "was in" in cells:
                history_table = True
                continue
            text = cells[-1] if history_table else line
        else:
            history_table = False if not line.strip() else history_table
            text = line
        out += _TOKEN.findall(text)
    return out


def _code_refs() -> list[str]:
    refs = []
    for tok in _claims():
        if tok in HISTORY or tok.startswith("artifacts/") or " " in tok or not _PATHISH.match(tok):
            continue
        if "/" not in tok and not re.match(r"^(core|controller|agent|cli)\.", tok):
            continue     # a bare name (a function, a constant): checked where the doc gives its module
        refs.append(tok)
    return sorted(set(refs))


@cache
def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolve(ref: str) -> str | None:
    """None when the reference holds; else what is missing."""
    ref = ref.split("(")[0]
    name = None
    if ":" in ref:
        ref, name = ref.split(":", 1)
    if "/" not in ref:                                   # a dotted module path: core.recipe.document
        ref = ref.replace(".", "/")
    # a path may be given from the package (core/...), or from its layer where the sentence names it (images/,
    # plan/state.py)
    bases = [ROOT, PKG, PKG / "core", PKG / "controller", ROOT / "tests" / "unit"]
    for base in bases:
        p = next((c for c in (base / ref, base / f"{ref}.py") if c.exists()), base / ref)
        if p.exists():
            if name and p.is_file() and name not in _defined(p):
                return f"{p.relative_to(ROOT)} defines no {name}"
            return None
    # dir/module.attr (controller/local_host.local_raw) or a method: dir/module.Class.method
    head, _, attr = ref.rpartition(".")
    if attr and not head.endswith("/"):
        for base in bases:
            for cand in (base / f"{head}.py", base / head / "__init__.py"):
                if cand.is_file():
                    first = attr.split(".")[0]
                    if first in _defined(cand):
                        return None
                    return f"{cand.relative_to(ROOT)} defines no {first}"
            parent, _, cls = head.rpartition(".")   # module.Class.method
            cand = base / f"{parent}.py"
            if parent and cand.is_file() and cls in _defined(cand):
                return None
    return f"{ref} does not exist"


def test_the_doc_names_code_at_all():
    assert len(_code_refs()) >= 60


@pytest.mark.parametrize("ref", _code_refs())
def test_every_place_the_doc_names_exists(ref):
    assert _resolve(ref) is None, f"docs/architecture.md names `{ref}`: {_resolve(ref)}"


# File names that two modules may share: the same role on different layers, each pair said in the doc's "Names by
# role" (none today: every module's name says its role)
SAME_ROLE: set[str] = set()


def test_no_two_modules_share_a_name():
    homes: dict[str, list[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        if p.name != "__init__.py":
            homes.setdefault(p.name, []).append(str(p.relative_to(PKG)))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1 and name not in SAME_ROLE}
    assert not shared, f"name each module by its role (docs/architecture.md, Names by role): {shared}"
    assert all(name in DOC.read_text() for name in SAME_ROLE)


def test_history_names_are_really_gone():
    """A HISTORY entry that names a file is listed because it no longer exists; one that is back is a stale
    reason to skip it."""
    for ref in HISTORY:
        if ref.endswith(".py"):
            assert not (PKG / ref).exists(), f"{ref} exists again: drop it from HISTORY"


def _said(pattern: str) -> int:
    m = re.search(pattern, DOC.read_text())
    assert m, f"docs/architecture.md no longer says {pattern!r}"
    return int(m.group(1))


def test_the_recorded_plan_count_is_the_recorded_files():
    data = next(ROOT.glob("tests/unit/**/data/plans.json"))
    assert _said(r"holds\s+(\d+) plans") == len(json.loads(data.read_text()))


def test_the_any_recipe_count_is_the_code():
    found = sum(len(re.findall(r"\brecipe: Any\b", p.read_text())) for p in PKG.rglob("*.py"))
    if found == 0:
        assert "`Any` still in" not in DOC.read_text(), "the doc still lists `Any` recipe parameters"
    else:
        assert _said(r"`Any` still in (\d+) parameters") == found
