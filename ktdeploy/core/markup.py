"""User text inside rich markup: ``f"[green]✓[/green] {esc(path)}"`` prints a path holding ``[/x]`` as text,
never as a tag (an unescaped one made rich raise MarkupError after the work was done)."""

from __future__ import annotations

from typing import Any


def esc(value: Any) -> str:
    from rich.markup import escape

    return escape(str(value))
