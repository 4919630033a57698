#!/usr/bin/env python3
"""Pool several P1 overhead calls (bench/gpu/overhead.sh outputs) into one figure.

One device call fits 5-6 interleaved pairs, and hand runs alone spread +-8 % between
calls, so a single call cannot resolve a 2 % difference. Every call here measures both
sides side by side; pooling keeps each run's tokens/s and recomputes the ratios over all:

    python3 bench/gpu/pool_p1.py bench/results/p1/p1_overhead-{workdir,after1,after2}.json \
        > bench/results/p1/p1_pooled.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def pool(files: list[Path]) -> dict:
    calls, exec_rates, hand_rates, neighbour = [], [], [], []
    for f in files:
        d = json.loads(f.read_text())
        e, h = d["exec_tokens_per_s"], d["hand_tokens_per_s"]
        exec_rates += e
        hand_rates += h
        neighbour += d.get("exec_over_neighbour_hand", [])
        calls.append({"file": f.name, "order": "".join(n.split("-")[-1][0] for n in d["order"]),
                      "exec": e, "hand": h, "train_over_hand_median": d["train_over_hand_median"],
                      "train_over_hand_mean": d["train_over_hand_mean"]})
    return {
        "how": "python3 bench/gpu/pool_p1.py " + " ".join(f.as_posix() for f in files),
        "calls": calls,
        "exec_runs": len(exec_rates),
        "hand_runs": len(hand_rates),
        "train_over_hand_median": round(statistics.median(exec_rates) / statistics.median(hand_rates), 4),
        "train_over_hand_mean": round(statistics.mean(exec_rates) / statistics.mean(hand_rates), 4),
        "exec_over_neighbour_hand_median": round(statistics.median(neighbour), 4) if neighbour else None,
        "per_call_train_over_hand_median": [c["train_over_hand_median"] for c in calls],
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(pool([Path(a) for a in argv]), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
