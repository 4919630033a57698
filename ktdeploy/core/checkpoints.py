"""Which checkpoint to resume from (pure): the newest *complete* ``checkpoint-N`` of an output dir.

HF Trainer's ``_save_checkpoint`` writes the model (adapter) first, then optimizer, scheduler and RNG
state, and ``trainer_state.json`` last; a folder missing any of them was cut off mid-save (killed, OOM,
disk full) and is never chosen. LlamaFactory's own auto-resume (``get_last_checkpoint``) looks only at the
folder name, which is why ktdeploy picks the checkpoint itself and passes ``resume_from_checkpoint``.

World size: HF saves ``rng_state.pth`` with one process and ``rng_state_<rank>.pth`` per process
otherwise; resuming needs the same number of processes (cookbook §2.6).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
RNG_RE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")

TRAINER_STATE = "trainer_state.json"
# Files LlamaFactory / the Trainer write into the output dir when a run has finished (after the last step).
FINISHED_MARKERS = ("train_results.json", "all_results.json")
# LlamaFactory's LogCallback appends one JSON line per logging step here (<output_dir>/trainer_log.jsonl);
# the controller follows it (controller/follow.py) and the plan lists it among the artifacts.
TRAINER_LOG = "trainer_log.jsonl"
# Model / adapter weights as HF Trainer and PEFT save them (one of these suffices).
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model_fsdp.bin")
WEIGHT_DIRS = ("pytorch_model_fsdp_0",)
# Optimizer state: plain (optimizer.pt), FSDP full state dict (optimizer.bin) or FSDP sharded (optimizer_0/).
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
OPTIMIZER_DIRS = ("optimizer_0",)
SCHEDULER_FILE = "scheduler.pt"


@dataclass(frozen=True)
class Checkpoint:
    name: str
    step: int
    files: tuple[str, ...]
    missing: tuple[str, ...] = field(default=())
    world_size: int | None = None

    @property
    def complete(self) -> bool:
        return not self.missing


def _world_size(files: set[str]) -> int | None:
    ranks = set()
    single = False
    for f in files:
        m = RNG_RE.match(f)
        if m:
            if m.group(1) is None:
                single = True
            else:
                ranks.add(int(m.group(1)))
    if ranks:
        return len(ranks)
    return 1 if single else None


def inspect_checkpoint(name: str, entries: Iterable[str]) -> Checkpoint:
    """``entries``: names directly inside the checkpoint folder (files and sub-folders; a sub-folder counts
    only when it is listed with at least one file inside, as ``sub/file``)."""
    m = CHECKPOINT_RE.match(name)
    if not m:
        raise ValueError(f"not a checkpoint folder name: {name!r}")
    top: set[str] = set()
    nonempty_dirs: set[str] = set()
    for e in entries:
        e = e.strip("/")
        if not e:
            continue
        head, _, rest = e.partition("/")
        if rest:
            nonempty_dirs.add(head)
        else:
            top.add(head)
    missing = []
    if TRAINER_STATE not in top:
        missing.append(TRAINER_STATE)
    if not (top & set(WEIGHT_FILES) or nonempty_dirs & set(WEIGHT_DIRS)):
        missing.append("model/adapter weights (" + " | ".join(WEIGHT_FILES[:2]) + ")")
    if not (top & set(OPTIMIZER_FILES) or nonempty_dirs & set(OPTIMIZER_DIRS)):
        missing.append("optimizer state (optimizer.pt | optimizer.bin | optimizer_0/)")
    if SCHEDULER_FILE not in top:
        missing.append(SCHEDULER_FILE)
    ws = _world_size(top)
    if ws is None:
        missing.append("rng_state*.pth")
    return Checkpoint(name=name, step=int(m.group(1)), files=tuple(sorted(top | {d + "/" for d in nonempty_dirs})),
                      missing=tuple(missing), world_size=ws)


def parse_listing(text: str) -> dict[str, list[str]]:
    """Output of ``find OUTPUT -mindepth 1 -maxdepth 3 -printf '%P\\n'`` -> {checkpoint name: entries inside}."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip().strip("/")
        if not line:
            continue
        head, _, rest = line.partition("/")
        if not CHECKPOINT_RE.match(head):
            continue
        out.setdefault(head, [])
        if rest:
            out[head].append(rest)
    return out


def checkpoints(listing: dict[str, list[str]]) -> list[Checkpoint]:
    """Every checkpoint folder, oldest step first."""
    return sorted((inspect_checkpoint(n, e) for n, e in listing.items()), key=lambda c: c.step)


def newest_complete(listing: dict[str, list[str]], world_size: int | None = None) -> Checkpoint | None:
    """The newest complete checkpoint (with ``world_size`` given: only one saved by that many processes)."""
    for c in reversed(checkpoints(listing)):
        if c.complete and (world_size is None or c.world_size == world_size):
            return c
    return None


def finished_markers(names: Iterable[str]) -> list[str]:
    """The finished-run markers among ``names`` (the names directly inside an output dir): non-empty means the
    output dir holds a completed training run, which ktdeploy never overwrites."""
    present = set(names)
    return [m for m in FINISHED_MARKERS if m in present]


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint a resume starts from, or why none can be: ``none_complete`` (auto: every checkpoint was cut
    off mid-save, or there is none), ``missing`` / ``incomplete`` (the named one), ``world_size`` (saved by a
    different number of processes than the run has: resuming needs the same, cookbook §2.6)."""

    checkpoint: Checkpoint | None
    problem: str | None = None


def choose_resume(listing: dict[str, list[str]], resume: str, world_size: int) -> ResumeChoice:
    """The one resume policy of ``ktdeploy up`` (core/plan/host_plan.py) and ``ktdeploy train`` (agent/train.py):
    ``resume`` is ``auto`` (the newest complete checkpoint) or a ``checkpoint-N`` name in ``listing``."""
    if resume == "auto":
        chosen = newest_complete(listing)
        if chosen is None:
            return ResumeChoice(None, "none_complete")
    else:
        chosen = next((c for c in checkpoints(listing) if c.name == resume), None)
        if chosen is None:
            return ResumeChoice(None, "missing")
        if not chosen.complete:
            return ResumeChoice(chosen, "incomplete")
    if chosen.world_size is not None and chosen.world_size != world_size:
        return ResumeChoice(chosen, "world_size")
    return ResumeChoice(chosen)
