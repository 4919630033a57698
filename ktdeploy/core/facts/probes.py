"""The execution probes' answers (pure): each probe prints one JSON line (ktdeploy/probes/<name>.c); the runner
(controller/facts_probes.py) hands the text here."""

from __future__ import annotations

from typing import Any, TypeVar

from ktdeploy.core.facts.host import AmxProbe, MempolicyProbe
from ktdeploy.core.safeio import parse_json

ProbeFacts = TypeVar("ProbeFacts", AmxProbe, MempolicyProbe)


def parse_probe_output(text: str) -> dict[str, Any]:
    """The last JSON line a probe printed."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            data = parse_json(line)
            if not isinstance(data, dict):
                raise ValueError("the probe's JSON line is not an object")
            return data
    raise ValueError("probe printed no JSON line")


def _probe_model(model: type[ProbeFacts], text: str) -> ProbeFacts:
    """A probe's JSON line as ``model``: only the fields the model has, except ``ran`` and ``skipped`` (what the
    runner decides, never the probe); a wrong type is a ValueError (pydantic's ValidationError is one)."""
    data = parse_probe_output(text)
    fields = {k: v for k, v in data.items() if k in model.model_fields and k not in ("ran", "skipped")}
    return model(**fields, ran=True)


def amx_from_output(text: str) -> AmxProbe:
    return _probe_model(AmxProbe, text)


def mempolicy_from_output(text: str) -> MempolicyProbe:
    return _probe_model(MempolicyProbe, text)
