"""docs/eval.md's GPU-machine result table is the committed eval_proof.json (issue 43's proof), figure for figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROOF = REPO / "bench/results/eval/gpu-20261207/eval_proof.json"
ROWS = {"ROUGE-L": "rouge-l", "ROUGE-1": "rouge-1", "ROUGE-2": "rouge-2", "BLEU-4": "bleu-4",
        "exact match": "exact_match"}


def test_the_docs_table_is_the_committed_proof() -> None:
    proof = json.loads(PROOF.read_text())
    text = (REPO / "docs/eval.md").read_text()
    for label, key in ROWS.items():
        m = re.search(rf"\|\s*{re.escape(label)}\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*\+?([\d.]+)\s*\|", text)
        assert m, f"docs/eval.md: no row for {label}"
        base = proof["eval"]["base"]["metrics"][key]
        tuned = proof["eval"]["tuned"]["metrics"][key]
        assert [float(x) for x in m.groups()] == [round(base, 1), round(tuned, 1), round(tuned - base, 1)]


def test_the_proof_clears_its_stated_margin() -> None:
    proof = json.loads(PROOF.read_text())
    v = proof["verdict"]
    assert v["ok"] and v["rouge_l_margin"] >= v["wanted"] == 20.0
    assert proof["eval"]["samples"] == proof["holdout"] == 60
    assert proof["eval"]["tuned"]["failed"] == proof["eval"]["base"]["failed"] == 0
