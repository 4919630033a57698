"""Read a recipe (or the two native YAML files) into plain dicts plus a table of line numbers.

YAML is parsed by ruamel.yaml's round-trip loader, which keeps each key's line and rejects duplicate
keys. The *values* of the `train` and `accelerate` sections are then taken exactly as their readers take
them: LlamaFactory reads its YAML with OmegaConf.load (llamafactory/extras/arguments.py read_args), which
is PyYAML's SafeLoader (YAML 1.1: `off`/`no` are false, `on`/`yes` true, `0777` octal) with two changes
from omegaconf/_utils.py get_yaml_loader: floats without a dot (`1e-4`) are floats, and timestamps stay
strings. Accelerate reads its YAML with yaml.safe_load (YAML 1.1). So `packing: off` means false here as
it does there (docs/stack-rules.md). The `deploy` section is ktdeploy's own and stays YAML 1.2.
Overrides (`--set train.cutoff_len=4096`) are applied on the parsed tree, read the same way.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.safeio import read_bytes

SECTIONS = ("train", "accelerate", "deploy")
MAX_BYTES = 64 << 10  # a recipe is a few KB; refuse anything larger before parsing (ruamel parses ~25 KB per CPU second)


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


class LFLoader(pyyaml.SafeLoader):
    """OmegaConf's YAML loader (omegaconf/_utils.py get_yaml_loader), which LlamaFactory uses."""


LFLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)
LFLoader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in LFLoader.yaml_implicit_resolvers.items()
}

YAML11_SECTIONS = ("train", "accelerate")


def lf_load(text: str, file: str = "<override>") -> Any:
    """A YAML document read the way LlamaFactory (OmegaConf) reads it, as plain Python values. PyYAML builds an
    alias as a shared reference (cheap); the copy into plain values is what expands it, so that copy is bounded
    by MAX_NODES like ruamel's reading."""
    return _plain_py(pyyaml.load(text, Loader=LFLoader), file, [MAX_NODES])  # noqa: S506 - a SafeLoader subclass


def _plain_py(v: Any, file: str, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _alias_bomb(file)
    if isinstance(v, dict):
        return {str(k): _plain_py(x, file, budget) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_py(x, file, budget) for x in v]
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    return str(v)


def _alias_bomb(file: str) -> RecipeError:
    return RecipeError(f"{file}: more than {MAX_NODES} values once YAML aliases are expanded (an alias bomb?)",
                       fix="write the recipe without anchors/aliases (&name / *name)")


def _yaml11_sections(text: str, doc: Any, sections: tuple[str, ...] = YAML11_SECTIONS) -> Any:
    """Replace the values of the YAML 1.1 sections by their LlamaFactory/Accelerate reading."""
    if not isinstance(doc, dict):
        return doc
    try:
        lf = lf_load(text, "<recipe>")
    except (pyyaml.YAMLError, RecursionError, ValueError, OverflowError):
        return doc  # ruamel accepted it; keep its reading (rules still run)
    if isinstance(lf, dict):
        for sec in sections:
            if sec in doc and sec in lf:
                doc[sec] = lf[sec]
    return doc

MAX_NODES = 100_000  # a recipe has a few hundred values; aliases may not expand it beyond this (billion laughs)
MAX_NUMBER_DIGITS = 60  # no recipe value needs more; a 400-digit integer is refused, not computed with


def _plain(node: Any, prefix: str, file: str, locs: dict[str, tuple[str, int]], budget: list[int] | None = None) -> Any:
    """CommentedMap/Seq -> dict/list, recording each key's 1-based line under its dotted path. ``budget`` bounds
    the number of nodes produced, so a YAML alias bomb (a few hundred bytes naming 9^9 nodes) stops at once."""
    if budget is None:
        budget = [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise _alias_bomb(file)
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
            out[k] = _plain(value, path, file, locs, budget)
        return out
    if isinstance(node, CommentedSeq):
        return [_plain(v, f"{prefix}[{i}]", file, locs, budget) for i, v in enumerate(node)]
    if isinstance(node, str):
        return str(node)
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        if node.bit_length() > MAX_NUMBER_DIGITS * 4:
            raise RecipeError(f"{file}: {prefix or '(document)'}: an integer with more than {MAX_NUMBER_DIGITS} digits",
                              key=prefix or None, fix="use a plausible number")
        return int(node)
    if isinstance(node, float):
        return float(node)
    if node is None:
        return None
    # dates, binary and other YAML types have no meaning in a recipe: keep their text
    return str(node)


MAX_DEPTH = 64  # a recipe nests 3-5 levels; the YAML parser recurses (and slows down) per level


def nesting_depth(text: str) -> int:
    """A cheap upper bound of the YAML nesting depth, read before parsing: flow brackets, leading '- '/'? '
    markers and indentation (brackets inside quotes or comments count too: it errs on the side of refusing)."""
    worst = flow = 0
    for line in text.splitlines():
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        lead = 0
        while body[:2] in ("- ", "? ") or body in ("-", "?"):
            lead += 1
            body = body[2:].lstrip(" ")
        worst = max(worst, indent // 2 + lead + flow)
        for ch in body:
            if ch in "[{":
                flow += 1
                worst = max(worst, indent // 2 + lead + flow)
            elif ch in "]}":
                flow = max(0, flow - 1)
    return worst


def _parse_text(text: str, file: str, prefix: str, locs: dict[str, tuple[str, int]]) -> Any:
    if nesting_depth(text) > MAX_DEPTH:
        raise RecipeError(f"{file}: nested more than {MAX_DEPTH} levels deep", fix="write plain YAML mappings and scalars")
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
    except (RecursionError, ValueError, OverflowError, MemoryError) as err:
        raise RecipeError(f"{file}: cannot be parsed: {type(err).__name__}",
                          fix="write plain YAML mappings and scalars") from None
    try:
        return _plain(data, prefix, file, locs)
    except RecursionError:
        raise RecipeError(f"{file}: nested too deeply (or a recursive alias)",
                          fix="write plain YAML mappings and scalars") from None


def _read(path: Path) -> str:
    """Bounded, regular files only (a FIFO or /dev/zero is refused before a byte is read)."""
    data = read_bytes(path, MAX_BYTES, "recipe YAML file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text", fix="save the recipe as UTF-8") from None


def parse_recipe_text(text: str, file: str = "<recipe>") -> RawRecipe:
    locs: dict[str, tuple[str, int]] = {}
    doc = _parse_text(text, file, "", locs)
    if doc is None:
        doc = {}
    doc = _yaml11_sections(text, doc)
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


def read_native(train_path: str | Path, accelerate_path: str | Path | None,
                deploy_path: str | Path | None = None) -> RawRecipe:
    """The two native files (LlamaFactory training YAML + Accelerate YAML), optionally a deploy YAML."""
    locs: dict[str, tuple[str, int]] = {}
    doc: dict[str, Any] = {}
    for section, p in (("train", train_path), ("accelerate", accelerate_path), ("deploy", deploy_path)):
        if p is None:
            continue
        p = Path(p)
        text = _read(p)
        data = _parse_text(text, str(p), section, locs)
        if section in YAML11_SECTIONS and data is not None:
            try:
                data = lf_load(text, str(p))  # the whole file is the section: read it as its reader does
            except (pyyaml.YAMLError, RecursionError, ValueError, OverflowError):
                pass
        locs.setdefault(section, (str(p), 1))
        doc[section] = {} if data is None else data
    return RawRecipe(doc=doc, source=Source(locs, str(train_path)), path=Path(train_path), native=True)


def _scalar(text: str, section: str = "deploy") -> Any:
    if nesting_depth(text) > MAX_DEPTH:
        raise UsageError(f"--set value nested more than {MAX_DEPTH} levels deep", fix="give a plain value")
    if section in YAML11_SECTIONS:
        try:
            return lf_load(text)
        except (pyyaml.YAMLError, RecursionError, ValueError, OverflowError):
            return text
    try:
        value = _yaml().load(StringIO(text))
    except (YAMLError, RecursionError, ValueError, OverflowError):
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
        node[parts[-1]] = _scalar(value, parts[0])
        locs[".".join(parts)] = ("--set", 0)
    return RawRecipe(doc=doc, source=Source(locs, raw.source.default_file), path=raw.path, native=raw.native)
