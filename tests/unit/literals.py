"""The fact-source registry test's scan: where a name that has a single home is written as a string literal elsewhere."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Container


def name_literals(source: str, names: Container[str]) -> list[tuple[int, str]]:
    """(line, name) of every plain string literal of ``source`` that is one of ``names`` (f-strings are not
    literals: the tests that care read their parts from the AST)."""
    out = []
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.STRING:
            try:
                value = ast.literal_eval(t.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str) and value in names:
                out.append((t.start[0], value))
    return out
