"""docs/throughput.md's reference table is the planner's output (bench/throughput_table.py writes it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _bench():
    spec = importlib.util.spec_from_file_location("throughput_table", ROOT / "bench/throughput_table.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_doc_table_is_the_generated_one():
    bench = _bench()
    doc = (ROOT / "docs/throughput.md").read_text()
    between = doc.split(bench.BEGIN, 1)[1].split(bench.END, 1)[0].strip()
    assert between == bench.generated(), "run `python bench/throughput_table.py` and commit docs/throughput.md"


def test_every_real_recipe_and_format_has_a_row():
    bench = _bench()
    text = bench.generated()
    real = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml") if not p.name.startswith("tiny"))
    assert real and all(f"| {name} |" in text for name in real)
    for model in ("Qwen3.5-397B-A17B", "DeepSeek-V3", "Qwen3-235B-A22B", "GLM-4.5-Air"):
        for fmt in ("bf16", "fp8", "int8", "int4"):
            assert any(f"| {model} |" in ln and f"| {fmt}" in ln for ln in text.splitlines()), (model, fmt)
    # the one published figure whose setup matches is compared
    assert "147.91 (" in text
