"""No function of ktdeploy/ outside the CLI takes more than MAX parameters (issue 48): what travels together is
one typed value — a request (core/command_requests.py: UpRequest, SlurmUpRequest, DoctorRequest), what is served
(core/served.Served), what the agent may ask of its host (agent/train.ThisHost). A typer command's parameters are
its options, so cli/ is not counted."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ktdeploy"
MAX = 10


def parameter_counts(source: str) -> list[tuple[int, str, int]]:
    """(line, function, parameters) of every function of ``source``; self/cls not counted, *args and **kw are."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
            out.append((node.lineno, node.name, len(names) + bool(a.vararg) + bool(a.kwarg)))
    return out


def test_no_function_outside_the_cli_takes_more_than_ten_parameters():
    over = [f"{p.relative_to(PKG.parent)}:{line} {name}: {n}" for p in sorted(PKG.rglob("*.py"))
            if "cli" not in p.relative_to(PKG).parts[:1]
            for line, name, n in parameter_counts(p.read_text()) if n > MAX]
    assert not over, "group what travels together into one typed value:\n" + "\n".join(over)


def test_the_count_sees_every_kind_of_parameter():
    src = "class C:\n    def m(self, a, /, b, *c, d, **e): ...\ndef f(x, y=1, *, z): ...\n"
    assert sorted(parameter_counts(src)) == [(2, "m", 5), (3, "f", 3)]
