"""Helpers for the golden folders in tests/golden/ (raw outputs recorded on real machines)."""

from __future__ import annotations

import json
from pathlib import Path

from ktdeploy.controller.facts_gather import build_facts, load_raw
from ktdeploy.core.facts.host import HostFacts

GOLDEN = Path(__file__).resolve().parents[3] / "golden"


def folders() -> list[Path]:
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir() and (p / "facts.json").exists())


def facts_of(name: str) -> HostFacts:
    return build_facts(load_raw(str(GOLDEN / name)))


def expected(name: str) -> dict:
    return json.loads((GOLDEN / name / "facts.json").read_text())
