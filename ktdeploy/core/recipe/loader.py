"""Read a recipe (or the two native YAML files) into plain dicts plus a table of line numbers.

YAML is parsed by ruamel.yaml's round-trip loader, which keeps each key's line; nothing here
interprets values. Overrides (`--set train.cutoff_len=4096`) are applied on the parsed tree.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.recipe.finding import Finding

SECTIONS = ("train", "accelerate", "deploy")
MAX_BYTES = 1 << 20  # a recipe is a small text file; refuse anything larger before parsing


@dataclass
class Source:
    """Where each key path came from: (file, line) by dotted path."""

    locations: dict[str, tuple[str, int]] = field(default_factory=dict)
    default_file: str | None = None  # a key missing everywhere is reported at line 1 of the main file

    def where(self, path: str) -> tuple[str | None, int | None]:
        # Walk up to the nearest located ancestor (a missing key is reported at its parent).
        p = path
        while p:
            if p in self.locations:
                return self.locations[p]
            p = p.rpartition(".")[0]
        return (self.default_file, 1) if self.default_file else (None, None)


@dataclass
class RawRecipe:
    """The recipe as parsed: three plain sections and where each key came from."""

    doc: dict[str, Any]
    source: Source
    path: Path | None
    native: bool = False  # built from --train/--accelerate files (no deploy section expected)


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    return y


def _plain(node: Any, prefix: str, file: str, locs: dict[str, tuple[str, int]]) -> Any:
    """CommentedMap/Seq -> dict/list, recording each key's 1-based line under its dotted path."""
    if isinstance(node, CommentedMap):
        out = {}
        for key, value in node.items():
            k = str(key)
            path = f"{prefix}.{k}" if prefix else k
            try:
                line = node.lc.key(key)[0] + 1
            except (KeyError, TypeError, AttributeError):
                line = None
            if line:
                locs[path] = (file, line)
            out[k] = _plain(value, path, file, locs)
        return out
    if isinstance(node, CommentedSeq):
        return [_plain(v, f"{prefix}[{i}]", file, locs) for i, v in enumerate(node)]
    if isinstance(node, str):
        return str(node)
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if node is None:
        return None
    # dates, binary and other YAML types have no meaning in a recipe: keep their text
    return str(node)


def _parse_text(text: str, file: str, prefix: str, locs: dict[str, tuple[str, int]]) -> Any:
    try:
        data = _yaml().load(text)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        problem = (err.problem or err.context or "invalid YAML").strip()
        raise RecipeError(
            f"{file}: not valid YAML: {problem}",
            findings=[Finding("error", prefix or "(document)", f"not valid YAML: {problem}",
                              "fix the YAML syntax at that line (indentation, a missing ':' or quote, a duplicate key)",
                              "yaml.syntax", file, line)],
            fix="fix the YAML syntax at the line shown",
        ) from None
    except YAMLError as err:
        raise RecipeError(f"{file}: not valid YAML: {err}", fix="fix the YAML syntax") from None
    except (RecursionError, ValueError, OverflowError) as err:
        raise RecipeError(f"{file}: cannot be parsed: {type(err).__name__}",
                          fix="write plain YAML mappings and scalars") from None
    return _plain(data, prefix, file, locs)


def _read(path: Path) -> str:
    if not path.exists():
        raise UsageError(f"{path}: no such file", fix="give the path of a recipe YAML file (see recipes/)")
    if not path.is_file():
        raise UsageError(f"{path}: not a file", fix="give the path of a recipe YAML file")
    if path.stat().st_size > MAX_BYTES:
        raise RecipeError(f"{path}: {path.stat().st_size} bytes is too large for a recipe",
                          fix="a recipe is a small YAML file; check the path")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text", fix="save the recipe as UTF-8") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot be read: {err.strerror}", fix="check the path and its permissions") from None


def parse_recipe_text(text: str, file: str = "<recipe>") -> RawRecipe:
    locs: dict[str, tuple[str, int]] = {}
    doc = _parse_text(text, file, "", locs)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise RecipeError(
            f"{file}: a recipe is a mapping with the sections {', '.join(SECTIONS)}; found a {type(doc).__name__}",
            findings=[Finding("error", "(document)", f"the document is a {type(doc).__name__}, not a mapping",
                              "start the file with `train:`, `accelerate:` and `deploy:` sections", "structure.mapping",
                              file, 1)],
            fix="start the file with `train:`, `accelerate:` and `deploy:` sections")
    return RawRecipe(doc=doc, source=Source(locs, file), path=Path(file) if file != "<recipe>" else None)


def read_recipe(path: str | Path) -> RawRecipe:
    path = Path(path)
    return parse_recipe_text(_read(path), str(path))


def read_native(train_path: str | Path, accelerate_path: str | Path,
                deploy_path: str | Path | None = None) -> RawRecipe:
    """The two native files (LlamaFactory training YAML + Accelerate YAML), optionally a deploy YAML."""
    locs: dict[str, tuple[str, int]] = {}
    doc: dict[str, Any] = {}
    for section, p in (("train", train_path), ("accelerate", accelerate_path), ("deploy", deploy_path)):
        if p is None:
            continue
        p = Path(p)
        data = _parse_text(_read(p), str(p), section, locs)
        locs.setdefault(section, (str(p), 1))
        doc[section] = {} if data is None else data
    return RawRecipe(doc=doc, source=Source(locs, str(train_path)), path=Path(train_path), native=True)


def _scalar(text: str) -> Any:
    try:
        value = _yaml().load(StringIO(text))
    except YAMLError:
        return text
    return _plain(value, "", "<override>", {})


def apply_overrides(raw: RawRecipe, overrides: list[str] | tuple[str, ...]) -> RawRecipe:
    """Apply `section.key.sub=value` overrides (values parsed as YAML scalars) to a copy."""
    if not overrides:
        return raw
    doc = copy.deepcopy(raw.doc)
    locs = dict(raw.source.locations)
    for item in overrides:
        key, sep, value = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not sep or len(parts) < 2 or parts[0] not in SECTIONS:
            raise UsageError(f"--set {item!r}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(SECTIONS)}",
                             fix="e.g. --set train.cutoff_len=4096 or --set deploy.gpus=[0,1]")
        node = doc
        for p in parts[:-1]:
            nxt = node.get(p) if isinstance(node, dict) else None
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = _scalar(value)
        locs[".".join(parts)] = ("--set", 0)
    return RawRecipe(doc=doc, source=Source(locs, raw.source.default_file), path=raw.path, native=raw.native)
