"""Render a recipe into LlamaFactory's training YAML, Accelerate's YAML and the exact launch line.

Pure and deterministic: the same recipe (and the same derived values) gives byte-identical files.
"""

from __future__ import annotations

import copy
import os
import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.representer import SafeRepresenter
from ruamel.yaml.resolver import VersionedResolver

from ktdeploy.core.errors import OverwriteRefused
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.safeio import printable, write_file

# YAML and sh both end a comment at any of these; user text in a header comment must not contain them.
_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def one_line(text: str) -> str:
    """A header comment line: every character that a YAML or sh reader could take as a line break, and every other
    non-printable one, escaped."""
    text = text.translate(_BREAKS)
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)[:300]

TRAIN_FILE = "train.yaml"
ACCELERATE_FILE = "accelerate.yaml"
LAUNCH_FILE = "launch.sh"


_STR = "tag:yaml.org,2002:str"
_YAML11 = VersionedResolver(version=(1, 1))


class _Representer(SafeRepresenter):
    """Quotes every string a YAML 1.1 reader would turn into something else. LlamaFactory (OmegaConf) and
    Accelerate read with PyYAML (YAML 1.1), where a plain `save_strategy: no` is the boolean false."""


# YAML's own line breaks besides \n and \r (NEL, LS, PS): written raw inside a plain or single-quoted scalar, a
# reader folds them to a space, so the container would run another value than the one check accepted
_BREAKS_IN_SCALAR = ("\x85", "\u2028", "\u2029")


def _represent_str(rep: SafeRepresenter, value: str) -> ScalarNode:
    if any(b in value for b in _BREAKS_IN_SCALAR) or not all(c.isprintable() or c in "\n\t" for c in value):
        return rep.represent_scalar(_STR, value, style='"')   # double-quoted: the emitter escapes them (\N, \L, \P)
    if _YAML11.resolve(ScalarNode, value, (True, False)) != _STR:
        return rep.represent_scalar(_STR, value, style="'")
    return SafeRepresenter.represent_str(rep, value)


_Representer.add_representer(str, _represent_str)


def dump_yaml(data: dict[str, Any]) -> str:
    """YAML that YAML 1.1 (PyYAML) and YAML 1.2 (ruamel) readers both load back to ``data``."""
    y = YAML(typ="safe", pure=True)
    y.Representer = _Representer
    y.default_flow_style = False
    y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # ruamel types this attribute as None
    y.width = 4096
    buf = StringIO()
    y.dump(data, buf)
    return buf.getvalue()


@dataclass(frozen=True)
class Rendered:
    train: dict[str, Any]
    accelerate: dict[str, Any]
    train_yaml: str
    accelerate_yaml: str
    launch_sh: str
    launch_argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    env_defaults: tuple[tuple[str, str], ...] = ()   # set unless the environment already sets them

    def write(self, directory: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
        """Write the three files with ktdeploy.core.safeio.write_file: never through a link, never over an existing
        file unless ``overwrite`` (all three are checked before the first is written)."""
        files = ((TRAIN_FILE, self.train_yaml, 0o644), (ACCELERATE_FILE, self.accelerate_yaml, 0o644),
                 (LAUNCH_FILE, self.launch_sh, 0o755))
        d = Path(directory) if str(directory) else None
        if d is not None and not overwrite:
            there = [n for n, _, _ in files if os.path.lexists(d / n)]
            if there:
                raise OverwriteRefused(f"{d} already holds {', '.join(there)}; ktdeploy does not overwrite files",
                                       fix="choose an empty folder, or pass --force to replace them")
        return {name: write_file(directory, name, text, mode=mode, overwrite=overwrite) for name, text, mode in files}


# PyTorch's caching allocator with expandable segments: with the default allocator, batches of varying padded
# length leave freed blocks of the wrong size behind and the reserve grows step after step (measured on the GPU
# machine, Qwen vocabulary, 512 x 4 on a variable-length dataset: nvidia-smi 11.69 GiB default vs 7.40 GiB with
# expandable segments, torch's allocated peak 5.34 vs 5.33; batches of one shape: the same either way;
# bench/results/gpu/vocab_scale). The planner's GPU figures assume it. A PYTORCH_CUDA_ALLOC_CONF already in the
# environment is the user's choice and is kept.
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def launch_argv(train_file: str = TRAIN_FILE, accelerate_file: str = ACCELERATE_FILE) -> tuple[str, ...]:
    """cookbook §2.5: accelerate launch with port 0 and the FSDP2 config; LlamaFactory's launcher module as the script."""
    return ("accelerate", "launch", "--main_process_port", "0", "--config_file", accelerate_file,
            "-m", "llamafactory.launcher", train_file)


def render(recipe: Recipe, derived: dict[str, Any] | None = None, header: str | None = None) -> Rendered:
    """``derived``: values ktdeploy filled from host facts (e.g. kt_config.kt_num_threads), applied only where the
    recipe leaves the key unset; dotted keys relative to the training YAML."""
    train = copy.deepcopy(recipe.train)
    for dotted, value in sorted((derived or {}).items()):
        node = train
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node.setdefault(last, value)
    accelerate = copy.deepcopy(recipe.accelerate)
    env: list[tuple[str, str]] = []
    if recipe.deploy is not None:
        env.append(("CUDA_VISIBLE_DEVICES", recipe.deploy.cuda_visible_devices))
    argv = launch_argv()
    origin = one_line(header or "rendered by ktdeploy from "
                      + (printable(recipe.path.name) if recipe.path else "a recipe"))
    lines = ["#!/bin/sh", f"# {origin}", "set -eu", 'cd "$(dirname "$0")"']
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env]
    defaults = (ALLOCATOR_ENV,)
    lines += [f'export {k}="${{{k}-{v}}}"' for k, v in defaults]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return Rendered(
        train=train,
        accelerate=accelerate,
        train_yaml=f"# {origin}\n" + dump_yaml(train),
        accelerate_yaml=f"# {origin}\n" + dump_yaml(accelerate),
        launch_sh="\n".join(lines) + "\n",
        launch_argv=argv,
        env=tuple(env),
        env_defaults=defaults,
    )
