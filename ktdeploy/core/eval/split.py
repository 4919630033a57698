"""The held-out split `up` (and `ktdeploy train`) carves out of the training data before training (pure).

``deploy.eval.holdout`` is a fraction (0 < h < 1) or a count of rows per dataset. Which rows: every row gets the key
sha256(seed, the row as canonical JSON); the rows with the smallest keys are held out. The choice depends only on the
seed and the rows' contents — not on their order, not on the machine — and a row written twice in the file goes to
the held-out side with its twin (no copy of a held-out row is trained on). The manifest records the seed, the rule,
each source file's SHA-256 and the held-out row indices, so the split can be checked and is never made differently
for a resumed run.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.errors import UsageError

RULE = "sha256(seed, canonical JSON row): the smallest keys are held out; identical rows stay together"
MANIFEST = "holdout.json"
HOLDOUT_SUFFIX = ".holdout"   # the held-out part's entry in the split's dataset_info.json: "<name>.holdout"


def canonical(row: Any) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def row_key(row: Any, seed: int) -> str:
    return hashlib.sha256(f"{seed}\0{canonical(row)}".encode()).hexdigest()


def held_count(distinct: int, holdout: float) -> int:
    """How many distinct rows are held out: a fraction of them (at least one) or a count; one row at least is left to
    train on."""
    if distinct < 2:
        raise UsageError(f"deploy.eval.holdout needs at least 2 distinct rows to split, the dataset has {distinct}",
                         key="deploy.eval.holdout", fix="Use a larger dataset, or evaluate with --dataset instead.")
    want = max(1, math.floor(distinct * holdout + 0.5)) if holdout < 1 else int(holdout)
    if want >= distinct:
        raise UsageError(f"deploy.eval.holdout {holdout:g} leaves no row to train on ({distinct} distinct rows)",
                         key="deploy.eval.holdout", fix=f"Hold out fewer than {distinct} rows.")
    return want


@dataclass(frozen=True)
class Split:
    train: tuple[int, ...]
    held: tuple[int, ...]
    duplicates_held: int          # rows held out because an identical row was chosen

    def to_json(self) -> dict[str, Any]:
        return {"train_rows": len(self.train), "held_rows": len(self.held), "held": list(self.held),
                "duplicates_held": self.duplicates_held}


def split_rows(rows: Sequence[Any], holdout: float, seed: int) -> Split:
    keys = [row_key(r, seed) for r in rows]
    distinct = sorted(set(keys))
    chosen = set(distinct[:held_count(len(distinct), holdout)])
    held = tuple(i for i, k in enumerate(keys) if k in chosen)
    train = tuple(i for i, k in enumerate(keys) if k not in chosen)
    return Split(train=train, held=held, duplicates_held=len(held) - len(chosen))


def manifest(*, seed: int, holdout: float, sources: dict[str, dict[str, Any]], splits: dict[str, Split]) -> dict:
    """What the split folder's holdout.json holds: enough to redo the split and to see it was not changed."""
    return {"rule": RULE, "seed": seed, "holdout": holdout, "sources": sources,
            "datasets": {name: s.to_json() for name, s in splits.items()}}


def same_split(recorded: Any, seed: int, holdout: float, sources: dict[str, dict[str, Any]]) -> bool:
    """Was the recorded split made by this rule from these very files?"""
    return (isinstance(recorded, dict) and recorded.get("seed") == seed and recorded.get("holdout") == holdout
            and recorded.get("sources") == sources)
