"""docs/serving-merged.md's figures are the committed results (bench/results/merge), rendered by
bench/merge/figures.py: a new bench or proof run that is not written into the doc fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def test_the_figures_block_is_rendered_from_the_committed_results():
    spec = importlib.util.spec_from_file_location("merge_figures", ROOT / "bench" / "merge" / "figures.py")
    assert spec and spec.loader
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    doc = (ROOT / "docs" / "serving-merged.md").read_text()
    assert figures.render() in doc, "run: python bench/merge/figures.py --write"
    assert "merge_over_copy" in figures.render() and "passed" in figures.render()
