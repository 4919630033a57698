"""Render a recipe into LlamaFactory's training YAML, Accelerate's YAML and the exact launch line.

Pure and deterministic: the same recipe (and the same derived values) gives byte-identical files.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.representer import SafeRepresenter
from ruamel.yaml.resolver import VersionedResolver

from ktdeploy.core.recipe.document import Recipe

TRAIN_FILE = "train.yaml"
ACCELERATE_FILE = "accelerate.yaml"
LAUNCH_FILE = "launch.sh"


_STR = "tag:yaml.org,2002:str"
_YAML11 = VersionedResolver(version=(1, 1))


class _Representer(SafeRepresenter):
    """Quotes every string a YAML 1.1 reader would turn into something else. LlamaFactory (OmegaConf) and
    Accelerate read with PyYAML (YAML 1.1), where a plain `save_strategy: no` is the boolean false."""


def _represent_str(rep: SafeRepresenter, value: str):
    if _YAML11.resolve(ScalarNode, value, (True, False)) != _STR:
        return rep.represent_scalar(_STR, value, style="'")
    return SafeRepresenter.represent_str(rep, value)


_Representer.add_representer(str, _represent_str)


def dump_yaml(data: dict[str, Any]) -> str:
    """YAML that YAML 1.1 (PyYAML) and YAML 1.2 (ruamel) readers both load back to ``data``."""
    y = YAML(typ="safe", pure=True)
    y.Representer = _Representer
    y.default_flow_style = False
    y.sort_base_mapping_type_on_output = False
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

    def write(self, directory: str | Path) -> dict[str, Path]:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        out = {}
        for name, text, mode in ((TRAIN_FILE, self.train_yaml, 0o644), (ACCELERATE_FILE, self.accelerate_yaml, 0o644),
                                 (LAUNCH_FILE, self.launch_sh, 0o755)):
            p = d / name
            p.write_text(text, encoding="utf-8")
            p.chmod(mode)
            out[name] = p
        return out


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
    origin = header or f"rendered by ktdeploy from {recipe.path.name if recipe.path else 'a recipe'}"
    lines = ["#!/bin/sh", f"# {origin}", "set -eu", 'cd "$(dirname "$0")"']
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return Rendered(
        train=train,
        accelerate=accelerate,
        train_yaml=f"# {origin}\n" + dump_yaml(train),
        accelerate_yaml=f"# {origin}\n" + dump_yaml(accelerate),
        launch_sh="\n".join(lines) + "\n",
        launch_argv=argv,
        env=tuple(env),
    )
