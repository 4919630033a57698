"""lf_entry's garbage-collector clock and heap freeze (pure Python: no transformers needed)."""

from __future__ import annotations

import gc

from ktdeploy.agent import lf_entry


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)


def test_the_clock_times_collections_and_counts_full_ones():
    clock = lf_entry.GcClock()
    was_enabled = gc.isenabled()
    gc.disable()       # only the collections this test asks for (an automatic one may come at any allocation)
    gc.callbacks.append(clock)
    try:
        _cycles(20_000)
        gc.collect(0)      # a young collection: timed, not full
        gc.collect()       # a full (generation 2) collection
        seconds, full = clock.take()
        assert seconds > 0 and full == 1
        assert clock.take() == (0.0, 0)     # take() starts the next interval
    finally:
        gc.callbacks.remove(clock)
        if was_enabled:
            gc.enable()


def test_freeze_moves_the_heap_out_of_reach_of_the_collector(monkeypatch):
    try:
        monkeypatch.delenv("KTDEPLOY_GC_FREEZE", raising=False)
        assert lf_entry.freeze_heap() is True
        frozen = gc.get_freeze_count()
        assert frozen > 1000          # the interpreter's and pytest's objects, at least
        gc.unfreeze()
        monkeypatch.setenv("KTDEPLOY_GC_FREEZE", "0")
        assert lf_entry.freeze_heap() is False and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_a_full_collection_walks_less_after_the_freeze():
    was_enabled = gc.isenabled()
    gc.disable()
    keep = [[i] for i in range(300_000)]      # a large live heap, like a trainer's libraries and dataset
    clock = lf_entry.GcClock()
    gc.callbacks.append(clock)
    try:
        gc.collect()
        before, _ = clock.take()
        gc.freeze()
        gc.collect()
        after, _ = clock.take()
        assert after < before / 3, (before, after)
    finally:
        gc.unfreeze()
        gc.callbacks.remove(clock)
        del keep
        if was_enabled:
            gc.enable()
