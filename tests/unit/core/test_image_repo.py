"""core/variants.py is the one home of the images' repository name (IMAGE_REPO, REDUCED_IMAGE_REPO): no module of
ktdeploy/ writes it as a value — a default (typer's --repo, deploy.image_repo, an image label) or an image
reference built from it (f"ktsft:{build}"). Help and fix texts that show the name to a person (`ktsft:<build>`)
may keep it."""

from __future__ import annotations

import ast
from pathlib import Path

from ktdeploy.core import variants as V

ROOT = Path(__file__).resolve().parents[3]
NAMES = {V.IMAGE_REPO, V.REDUCED_IMAGE_REPO}
HOME = "ktdeploy/core/variants.py"


def _names_repo(text: object) -> bool:
    return isinstance(text, str) and any(text.endswith(f"{n}:") for n in NAMES)


def repo_literals(root: Path = ROOT / "ktdeploy") -> list[str]:
    found = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root.parent).as_posix()
        if rel == HOME:
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Constant) and n.value in NAMES:
                found.append(f"{rel}:{n.lineno}")
            elif isinstance(n, ast.JoinedStr):   # f"ktsft:{build}": a reference in the default repository
                parts = n.values
                if any(isinstance(a, ast.Constant) and _names_repo(a.value) and isinstance(b, ast.FormattedValue)
                       for a, b in zip(parts, parts[1:], strict=False)):
                    found.append(f"{rel}:{n.lineno}")
            elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.left, ast.Constant) \
                    and _names_repo(n.left.value):
                found.append(f"{rel}:{n.lineno}")
    return found


def test_the_repository_name_has_one_home():
    assert repo_literals() == []


def test_the_scan_can_fail(tmp_path):
    (tmp_path / "m.py").write_text('A = "ktsft"\nB = f"ktsft:{b}"\nC = "ktsft:" + b\nD = "ktsft-reduced"\n'
                                   'E = "use ktsft:<build>"\n"""the ktsft images"""\n')
    assert repo_literals(tmp_path) == [f"{tmp_path.name}/m.py:{i}" for i in (1, 2, 3, 4)]


def test_the_defaults_are_the_home():
    from ktdeploy.controller.images.tags import DEFAULT_REPO
    from ktdeploy.core.recipe.schema import Deploy

    assert DEFAULT_REPO == {"full": "ktsft", "reduced": "ktsft-reduced"}
    assert Deploy.model_fields["image_repo"].default == V.IMAGE_REPO == "ktsft"
    assert V.image("amx") == "ktsft:amx"
