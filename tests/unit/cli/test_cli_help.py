"""--help of every command reads at 80 columns (cli/help.py): each option described, upper-case metavars that say
what goes there, no Python type names, no line past 80 columns; `up --help` in named groups and one screen and a
half at most."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from ktdeploy.cli import app

TYPE_NAMES = re.compile(r"<(bool|str|int|float|path|list\[|float range|int range)[^>]*>")


def _commands():
    root = typer.main.get_command(app)
    out = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, [*path, name])
        else:
            out.append((path, cmd))

    walk(root, [])
    return [([], root), *out]


COMMANDS = _commands()


def help_text(path: list[str]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, color=False)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "ktdeploy" for p, _ in COMMANDS])
def test_help_reads_at_80_columns(path, cmd):
    text = help_text(path)
    wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not wide, wide
    assert not TYPE_NAMES.search(text), TYPE_NAMES.search(text)
    undescribed = [p.opts[0] for p in cmd.params if getattr(p, "param_type_name", "") == "option"
                   and not (p.help or "").strip() and p.opts[0] != "--help"]
    assert not undescribed, f"{' '.join(path)}: options without a description: {undescribed}"
    args = [p for p in cmd.params if getattr(p, "param_type_name", "") == "argument"]
    for a in args:   # RECIPE, never <path> or a lower-case recipe
        assert a.metavar and a.metavar == a.metavar.upper(), (path, a.name, a.metavar)


def test_up_help_is_grouped_and_short():
    text = help_text(["up"])
    lines = text.splitlines()
    assert len(lines) <= 60, len(lines)
    for panel in ("Checks", "Data", "SSH"):
        assert re.search(rf"╭─ {panel} ", text), panel
    # the description column is readable: no option's help is squeezed below 40 columns
    assert "--host" in text and "HOST" in text and "--dry-run" in text


IN_IMAGE_COMMANDS = {"train", "convert", "merge", "serve", "tiny-model", "tune", "prepare-weights"}


def _panel(text: str, title_start: str) -> set[str]:
    """The command names listed in the --help panel whose title starts with ``title_start``."""
    names, inside = set(), False
    for line in text.splitlines():
        if line.startswith("╭"):
            inside = line.lstrip("╭─ ").startswith(title_start)
        elif inside and (m := re.match(r"│ ([a-z][a-z-]*)\s", line)):
            names.add(m.group(1))
    return names


def test_the_commands_the_image_runs_are_listed_apart():
    text = help_text([])
    assert _panel(text, "Run inside the image") == IN_IMAGE_COMMANDS
    assert not _panel(text, "Commands") & IN_IMAGE_COMMANDS
    assert {"up", "status", "check", "doctor"} <= _panel(text, "Commands")


FOLDER_WORDS = re.compile(r"\b(directory|folder|output_dir)\b")


def test_directory_options_say_dir():
    """An option or argument that takes a folder shows a DIR (DIR, MODEL_DIR, FILE|DIR: a file or its folder),
    never FILE, PATH or the parameter's Python name (OUT_TEXT, RUN_ROOT); no metavar is a Python name (SET_)."""
    bad = []
    for path, cmd in COMMANDS:
        for p in cmd.params:
            if getattr(p, "is_flag", False) or p.name == "help":
                continue
            text, mv = (getattr(p, "help", None) or ""), p.metavar or ""
            opt = p.opts[0] if p.opts else p.name
            takes_folder = (FOLDER_WORDS.search(text.split(".")[0]) and not re.search(r"\b(file|YAML|tarball)\b",
                                                                                   text.split(".")[0], re.I)) \
                or (p.name or "").rstrip("_").endswith(("dir", "root"))
            if takes_folder and "DIR" not in mv:
                bad.append(f"{' '.join(path)} {opt} {mv}: {text[:60]}")
            if mv.endswith(("_", "_TEXT")):
                bad.append(f"{' '.join(path)} {opt}: metavar {mv} is a Python name")
    assert not bad, bad
    for cmd, shown in ((["tiny-model"], "--data-dir DIR"), (["render"], "--out -o DIR"), (["convert"], "--out -o DIR"),
                       (["train"], "--run-root DIR"), (["plan"], "--model-config FILE|DIR"),
                       (["check"], "--set KEY=VALUE")):
        assert shown in " ".join(help_text(cmd).replace("│", " ").split()), (cmd, shown)


@pytest.mark.parametrize("path", [["render"], ["image", "load"]])
def test_build_lists_are_the_real_ladder(path):
    from ktdeploy.core import variants

    text = " ".join(help_text(path).replace("│", " ").split())
    assert "(amx, avx512, avx2)" not in text
    assert ", ".join(variants.NAMES) in text


def test_a_commands_line_in_the_list_is_its_first_paragraph_as_one_text():
    """`ktdeploy --help` broke a command's line where its docstring's source line ended ("Exit 0 valid, 2 invalid"
    then "(--stack: …" below, with room left): the list shows the first paragraph re-wrapped to the terminal."""
    root = typer.main.get_command(app)
    for path, cmd in _commands():
        short = cmd.short_help or ""
        assert "\n" not in short.strip(), (path, short)
    wide = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}, terminal_width=200).output
    assert "Exit 0 valid, 2 invalid (--stack: 7" in wide, wide
    assert root is not None
