"""lf_entry's garbage-collector clock and its opt-in heap freeze (pure Python: no transformers needed)."""

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


def test_the_heap_is_frozen_only_when_asked(monkeypatch):
    """Off by default since the GPU machine measured the collector at <= 0.021 s per 14-step run, no full
    collection, frozen or not (bench/results/p1/p1_overhead-gcfreeze.json); KTDEPLOY_GC_FREEZE=1 turns it on."""
    try:
        monkeypatch.delenv("KTDEPLOY_GC_FREEZE", raising=False)
        assert lf_entry.freeze_heap() is False and gc.get_freeze_count() == 0
        monkeypatch.setenv("KTDEPLOY_GC_FREEZE", "1")
        assert lf_entry.freeze_heap() is True
        assert gc.get_freeze_count() > 1000          # the interpreter's and pytest's objects, at least
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
