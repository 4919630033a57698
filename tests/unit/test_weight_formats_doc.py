"""docs/weight-formats.md's memory table is what the planner predicts today: each shipped real-model recipe with only
its expert format changed (the recipe's other settings kept), BF16 / FP8 (native FP8 models only) / INT8 / AMXINT4."""

from __future__ import annotations

import re
from pathlib import Path

from ktdeploy.core.recipe.document import load_recipe
from ktdeploy.core.sizing import plan_recipe
from ktdeploy.core.sizing.model_config import native_format, resolve_model_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "weight-formats.md"
RECIPES = ("qwen35-397b-bf16-lora.yaml", "qwen3-235b-int8-lora.yaml", "deepseek-v3-fp8-lora.yaml")
FORMATS = {
    "bf16": ["train.kt_config.kt_expert_weight_format=bf16", "train.kt_config.kt_backend=auto",
             "train.kt_weight_path=null"],
    "fp8": ["train.kt_config.kt_expert_weight_format=fp8", "train.kt_config.kt_backend=auto",
            "train.kt_weight_path=null", "train.kt_config.kt_num_gpu_experts=0"],
    "int8": ["train.kt_config.kt_expert_weight_format=int8", "train.kt_config.kt_backend=auto",
             "train.kt_weight_path=/data/models/X-INT8", "train.kt_config.kt_num_gpu_experts=0"],
    "amxint4": ["train.kt_config.kt_expert_weight_format=null", "train.kt_config.kt_backend=AMXINT4",
                "train.kt_weight_path=/data/models/X-AMXINT4"],
}


def _row(recipe: str) -> str:
    base = load_recipe(REPO / "recipes" / recipe)
    arch, _ = resolve_model_config(base.train)
    model = Path(str(base.keys.model_name_or_path)).name
    host: dict[str, str] = {}
    gpu = None
    for fmt, sets in FORMATS.items():
        r = load_recipe(REPO / "recipes" / recipe, sets)
        if fmt == "fp8" and arch.native_format != "fp8":
            host[fmt] = "-"
            continue
        plan, _, _ = plan_recipe(r)
        host[fmt] = f"{plan.host_memory_gib:.1f}"
        gpu = f"{plan.gpu_memory_gib_per_gpu:.2f}"
    return f"| {recipe} | {model} | {host['bf16']} | {host['fp8']} | {host['int8']} | {host['amxint4']} | {gpu} |"


def test_the_format_memory_table_is_the_planners():
    text = DOC.read_text()
    table = text.split("<!-- doc-table: format-memory -->", 1)[1].split("<!-- /doc-table -->", 1)[0]
    rows = table.strip().splitlines()[2:]
    assert rows == [_row(r) for r in RECIPES], "regenerate the table: " + "\n".join(_row(r) for r in RECIPES)


def test_fp8_is_offered_only_for_native_fp8_models():
    for recipe in RECIPES:
        cfg = resolve_model_config(load_recipe(REPO / "recipes" / recipe).train)[0]
        row = _row(recipe)
        assert (row.split("|")[4].strip() == "-") is (cfg.native_format != "fp8")
    assert native_format({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}) == "fp8"


def test_the_doc_names_only_commands_that_exist():
    from typer.main import get_command

    from ktdeploy.cli import app

    names = set(get_command(app).commands)  # type: ignore[attr-defined]
    quoted = set(re.findall(r"ktdeploy ([a-z][a-z-]+)", DOC.read_text()))
    assert quoted <= names, quoted - names


def test_the_runs_table_is_formats_json():
    import json
    import sys

    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import formats_summary

    rows = json.loads((REPO / "bench" / "results" / "formats.json").read_text())
    text = DOC.read_text()
    table = text.split("<!-- doc-table: formats-runs -->", 1)[1].split("<!-- /doc-table -->", 1)[0]
    assert table.strip() == formats_summary.table(rows)
    assert {r["setup"] for r in rows} == {"bf16-lora", "bf16-full", "fp8-lora", "int8-lora", "int8-lora-ephemeral",
                                          "amxint4-lora"}
    for r in rows:
        if r["setup"] != "bf16-full":   # the one earlier run of 3 steps (said in the doc)
            assert r["rc"] == 0 and r["steps"] >= 8 and r["loss_last"] < r["loss_first"], r
