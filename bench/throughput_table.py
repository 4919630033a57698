#!/usr/bin/env python3
"""Write docs/throughput.md's generated table (between its markers) from the planner: every shipped real-model
recipe (recipes/*.yaml but the tiny ones) in each expert format on the reference host of
ktdeploy/core/sizing/reference_table.py.

    python bench/throughput_table.py          # rewrite the table in docs/throughput.md
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ktdeploy.core.recipe import load_recipe  # noqa: E402
from ktdeploy.core.sizing.model_config import MoEArchitecture, resolve_model_config  # noqa: E402
from ktdeploy.core.sizing.reference_table import table  # noqa: E402

DOC = ROOT / "docs/throughput.md"
BEGIN, END = "<!-- reference table: bench/throughput_table.py -->", "<!-- end of reference table -->"
MODELS = {"qwen35-397b": "Qwen3.5-397B-A17B", "deepseek-v3": "DeepSeek-V3", "qwen3-235b": "Qwen3-235B-A22B",
          "glm-4.5-air": "GLM-4.5-Air"}


def shipped() -> list[tuple[str, str, dict[str, Any], dict[str, Any], MoEArchitecture]]:
    out = []
    for p in sorted((ROOT / "recipes").glob("*.yaml")):
        if p.name.startswith("tiny"):
            continue
        r = load_recipe(p)
        arch, _ = resolve_model_config(r.train)
        model = next(v for k, v in MODELS.items() if p.name.startswith(k))
        out.append((p.name, model, dict(r.train or {}), dict(r.accelerate or {}), arch))
    return out


def generated() -> str:
    return table(shipped())


def main() -> int:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{generated()}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
