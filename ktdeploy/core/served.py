"""What a serving container serves (pure): a converted LoRA adapter, a full fine-tune's model, or the base with the
LoRA merged in (`ktdeploy merge`) — exactly one, at one path. The plan's `docker create` of the serving container
(core/plan/docker_argv.create_serve) and the server's argv inside it (agent/serve.build_serve_command) take it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from ktdeploy.core.errors import UsageError

ServedKind = Literal["adapter", "weights", "merged"]


@dataclass(frozen=True)
class Served:
    kind: ServedKind
    path: str

    @property
    def flags(self) -> list[str]:
        """`ktdeploy serve`'s option for it: --adapter DIR, --weights DIR or --merged DIR."""
        return [f"--{self.kind}", self.path]

    @staticmethod
    def one_of(adapter: str | os.PathLike[str] | None = None, weights: str | os.PathLike[str] | None = None,
               merged: str | os.PathLike[str] | None = None) -> Served:
        if sum(v is not None for v in (adapter, weights, merged)) != 1:
            raise UsageError("give exactly one of --adapter (LoRA run), --weights (full fine-tune) and --merged "
                             "(merged LoRA)", fix="--adapter <output_dir>-sglang for a LoRA run, --weights <output_dir> "
                                                  "for a full fine-tune, --merged <output_dir>-merged for `ktdeploy "
                                                  "merge`'s model")
        if adapter is not None:
            return Served("adapter", os.fspath(adapter))
        return Served("weights", os.fspath(weights)) if weights is not None else Served("merged", os.fspath(merged or ""))
