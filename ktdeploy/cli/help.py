"""--help that reads at 80 columns: upper-case metavars that say what goes there (FILE, HOST, CHECK, KEY=VALUE),
none on a flag, no Python type names (typer shows `<bool>`, `<list[str]>`, `<path>` by default), and an
argument shown by its name alone. Every command of the CLI is made with ``Command`` (``App.command``); options
name their panel (``rich_help_panel``) so a long command reads in groups. tests/unit/cli/test_cli_help.py holds every
command to it: each option described, no line past 80 columns, no `<type>` left."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

F = TypeVar("F", bound=Callable[..., Any])

# the commands the image runs (`docker run ktsft:amx COMMAND`), listed apart from the controller's in `ktdeploy --help`
IN_IMAGE = "Run inside the image (docker run ktsft:BUILD COMMAND …)"


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:   # the metavar (RECIPE) already says it
        return None


def _default_metavar(param: TyperOption) -> str:
    if param.is_flag or param.count:
        return ""
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    name = (param.name or "value").upper().replace("-", "_").strip("_")
    if name.endswith(("DIR", "ROOT")):   # a folder, whatever its type: never FILE
        return "DIR"
    if ann is Path:
        return "FILE"
    if ann is int:
        return "N"
    if ann is float:
        return "NUMBER"
    return name


def tidy(params: list[Any]) -> None:
    for i, p in enumerate(params):
        if isinstance(p, TyperArgument) and not isinstance(p, _Argument):
            p.__class__ = _Argument
            if p.metavar is None:
                p.metavar = (p.name or "arg").upper()
        elif isinstance(p, TyperOption) and p.metavar is None:
            p.metavar = _default_metavar(p)
        params[i] = p


def one_line(help_text: str | None) -> str | None:
    """A command's line in `ktdeploy --help`: its docstring's first paragraph as one text (rich keeps the source's
    line breaks, which cut the line short where the docstring's source line ended)."""
    if not help_text:
        return None
    return " ".join(help_text.split("\n\n", 1)[0].split()) or None


class Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy(self.params)
        if self.short_help is None:
            self.short_help = one_line(self.help)

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt


class Group(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt


class App(typer.Typer):
    """typer.Typer whose commands are ``Command`` and whose groups are ``Group``."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[F], F]:
        kwargs.setdefault("cls", Command)
        decorate: Callable[[F], F] = super().command(*args, **kwargs)
        return decorate
