"""The variant images' configuration, as data (pure): what `docker commit --change` sets and what a `docker load`
archive carries are the same settings, written once here.

A variant is the dependency image plus light's files plus: the ISA's ENV, USER kt, WORKDIR, ENTRYPOINT, CMD and
the identity labels. ``variant_settings`` says that; ``commit_changes`` writes it as `--change` lines;
``image_config`` writes it as an image configuration (the JSON a `docker load` archive holds), from the
dependency image's `docker image inspect` and `docker history` rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ktdeploy.controller.images.tags import ISA_VARIANTS
from ktdeploy.core import variants as V

ENTRYPOINT = ["/usr/bin/tini", "--", "/opt/venv/bin/python", "-m", "ktdeploy.cli.image_entry"]
CMD = ["doctor"]
USER = "kt"
WORKDIR = "/workspace"
LAYER_COMMENT = "ktdeploy: light stage (/stage of the light image: ktdeploy, probes, verifier)"


@dataclass(frozen=True)
class VariantSettings:
    env: dict[str, str]
    labels: dict[str, str]
    user: str = USER
    workdir: str = WORKDIR
    entrypoint: tuple[str, ...] = tuple(ENTRYPOINT)
    cmd: tuple[str, ...] = tuple(CMD)


def variant_settings(isa: str, labels: dict[str, str]) -> VariantSettings:
    """The config one ISA variant adds to the dependency image (the Dockerfile's final stage, plus labels)."""
    isa = V.canonical(isa)
    return VariantSettings(
        env={"KTSFT_VARIANT": isa, "KT_KERNEL_CPU_VARIANT": ISA_VARIANTS[isa]},
        labels={**labels, "io.ktdeploy.isa": isa, "io.ktdeploy.kt_kernel_variant": ISA_VARIANTS[isa]})


def _label_value(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def commit_changes(isa: str, labels: dict[str, str]) -> list[str]:
    """`docker commit --change` list for one variant. One commit, whatever the number of changes."""
    s = variant_settings(isa, labels)
    return [
        "ENV " + " ".join(f"{k}={v}" for k, v in s.env.items()),
        f"USER {s.user}",
        f"WORKDIR {s.workdir}",
        f"ENTRYPOINT {json.dumps(list(s.entrypoint))}",
        f"CMD {json.dumps(list(s.cmd))}",
        "LABEL " + " ".join(f"{k}={_label_value(v)}" for k, v in sorted(s.labels.items())),
    ]


def _set_env(env: list[str], updates: dict[str, str]) -> list[str]:
    out = list(env)
    for key, value in updates.items():
        entry = f"{key}={value}"
        for i, e in enumerate(out):
            if e.split("=", 1)[0] == key:
                out[i] = entry
                break
        else:
            out.append(entry)
    return out


# Dockerfile instructions that never make a filesystem layer (the classic builder writes them as "#(nop) ...").
_METADATA_ONLY = ("ENV", "LABEL", "ARG", "CMD", "ENTRYPOINT", "USER", "EXPOSE", "SHELL", "VOLUME", "STOPSIGNAL",
                  "HEALTHCHECK", "ONBUILD", "MAINTAINER")


def _is_empty(row: dict[str, Any]) -> bool:
    created_by = str(row.get("CreatedBy") or "")
    if "#(nop)" in created_by:
        instruction = created_by.split("#(nop)", 1)[1].strip().split(" ", 1)[0].upper()
        return instruction in _METADATA_ONLY
    return False


def _size(row: dict[str, Any]) -> int:
    try:
        return int(row.get("Size") or 0)
    except (TypeError, ValueError):
        return 0


def history_entries(rows: list[dict[str, Any]], n_layers: int) -> list[dict[str, Any]]:
    """The image config's history from `docker history --no-trunc --human=false --format '{{json .}}'` rows
    (newest first) of an image with ``n_layers`` filesystem layers, oldest first, each marked empty_layer or not.

    `docker history` does not say which rows made a layer; their sizes and instructions do: a row with bytes
    made one, a metadata instruction (ENV, LABEL, ...) did not, and the zero-byte rest (a RUN that changed
    nothing, a WORKDIR that existed) made as many as the layer count still needs — when that leaves a choice,
    the rows are not guessed at: one anonymous entry per layer instead, as a `docker import` has."""
    entries, maybe = [], []
    for row in reversed(rows):
        e: dict[str, Any] = {"created": str(row.get("CreatedAt") or "1970-01-01T00:00:00Z"),
                   "created_by": str(row.get("CreatedBy") or "")}
        if row.get("Comment"):
            e["comment"] = str(row["Comment"])
        if _size(row) == 0:
            e["empty_layer"] = True
            if not _is_empty(row):
                maybe.append(e)
        entries.append(e)
    need = n_layers - sum(1 for e in entries if not e.get("empty_layer"))
    if need == len(maybe):
        for e in maybe:
            del e["empty_layer"]
    elif need != 0:
        return [{"created": "1970-01-01T00:00:00Z", "created_by": f"(dependency image layer {i + 1} of {n_layers})"}
                for i in range(n_layers)]
    return entries


def image_config(base: dict[str, Any], history: list[dict[str, Any]], diff_id: str, created: str,
                 settings: VariantSettings | None = None) -> dict[str, Any]:
    """The configuration of ``base`` (its `docker image inspect`) with one more layer ``diff_id`` and, for a
    variant, its settings. Without settings: the base's own config (the image the verification runs in)."""
    cfg = dict(base.get("Config") or {})
    if settings is not None:
        cfg["Env"] = _set_env(list(cfg.get("Env") or []), settings.env)
        cfg["User"] = settings.user
        cfg["WorkingDir"] = settings.workdir
        cfg["Entrypoint"] = list(settings.entrypoint)
        cfg["Cmd"] = list(settings.cmd)
        cfg["Labels"] = {**(cfg.get("Labels") or {}), **settings.labels}
    config: dict[str, Any] = {
        "architecture": base.get("Architecture") or "amd64",
        "os": base.get("Os") or "linux",
        "created": created,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [*base["RootFS"]["Layers"], diff_id]},
    }
    if base.get("Variant"):
        config["variant"] = base["Variant"]
    config["history"] = [*history, {"created": created, "created_by": LAYER_COMMENT}]
    return config
