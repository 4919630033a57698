"""The one way a run tells what happens: an event (core/events.py) goes into the run record's events.jsonl (when
it has a record form) and then to the caller's sink (the CLI renders it; a Python caller may collect or ignore
it). The controller itself never prints."""

from __future__ import annotations

from ktdeploy.controller.runs import RunRecord
from ktdeploy.core.events import Event, Sink, ignore


class Emitter:
    def __init__(self, record: RunRecord, sink: Sink | None = None) -> None:
        self.record = record
        self.sink = sink or ignore

    def emit(self, event: Event) -> None:
        if event.KIND is not None:
            self.record.event(event.KIND, **event.record())
        self.sink(event)
