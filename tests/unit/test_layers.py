"""The package's layers import only downward (docs/architecture.md).

core < controller, agent < cli: core imports only core; controller and agent import core and themselves
(not each other); cli imports anything. Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ktdeploy"

ALLOWED = {
    "core": {"core"},
    "controller": {"core", "controller"},
    "agent": {"core", "agent"},
    "cli": {"core", "controller", "agent", "cli"},
}

# Upward or sideways imports not fixed yet: (importing module, imported module) -> reason.
# This list may only shrink. Each entry names what would remove it.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def imports_of(path: Path) -> set[str]:
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source: str, me: str, is_package: bool) -> set[str]:
    """Every ktdeploy module (or name) this source imports, at any depth (inside functions too)."""
    tree = ast.parse(source)
    package = me if is_package else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from ktdeploy import api` imports a module
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                found.add(str(arg.values[0].value).rstrip("."))
    return {m for m in found if m == "ktdeploy" or m.startswith("ktdeploy.")}


def violations() -> dict[tuple[str, str], str]:
    bad = {}
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        mine = layer_of(me)
        for target in imports_of(path):
            theirs = layer_of(target)
            if theirs is None:
                # ktdeploy itself, ktdeploy.probes (data) or a name re-exported by ktdeploy/__init__.
                continue
            if mine is None:
                # ktdeploy/__init__.py is imported by every module, so it may import only core;
                # ktdeploy/__main__.py is `python -m ktdeploy`, the CLI.
                ok = theirs == "core" or me == "ktdeploy.__main__"
            else:
                ok = theirs in ALLOWED[mine]
            if not ok:
                top = ".".join(target.split(".")[:3])
                bad[(me, _module_prefix(target) or top)] = f"{mine or me} -> {theirs}"
    return bad


def _module_prefix(target: str) -> str | None:
    """The longest prefix of ``target`` that is a module file in the package."""
    parts = target.split(".")
    for n in range(len(parts), 1, -1):
        rel = Path(*parts[1:n])
        if (PKG / rel).with_suffix(".py").exists() or (PKG / rel / "__init__.py").exists():
            return ".".join(parts[:n])
    return None


def test_layers_import_only_downward():
    bad = {k: v for k, v in violations().items() if k not in KNOWN_EXCEPTIONS}
    assert not bad, "imports that climb a layer (see docs/architecture.md):\n" + "\n".join(
        f"  {a} imports {b} ({why})" for (a, b), why in sorted(bad.items()))


def test_exception_list_only_names_live_violations():
    """An exception that no longer happens must leave the list, so the list can only shrink."""
    stale = set(KNOWN_EXCEPTIONS) - set(violations())
    assert not stale, f"fixed, remove from KNOWN_EXCEPTIONS: {sorted(stale)}"


def test_every_module_is_in_a_layer():
    loose = [module_name(p) for p in PKG.rglob("*.py")
             if layer_of(module_name(p)) is None
             and module_name(p) not in {"ktdeploy", "ktdeploy.__main__", "ktdeploy.probes"}]
    assert not loose, f"modules outside core/controller/agent/cli: {loose}"


def test_the_checker_sees_lazy_relative_and_dynamic_imports():
    """The checker is not blind: imports inside functions, relative and importlib ones are all found."""
    src = ("def f():\n    from ktdeploy.cli.output import console\n"
           "    import ktdeploy.controller.up_host\n"
           "    from ..agent import train\n"
           "    importlib.import_module(f'ktdeploy.controller.{name}')\n")
    found = imports_in(src, "ktdeploy.core.x", is_package=False)
    assert {"ktdeploy.cli.output", "ktdeploy.controller.up_host", "ktdeploy.agent.train",
            "ktdeploy.controller"} <= found
    assert {layer_of(m) for m in found} == {"cli", "controller", "agent"}
