"""docs/throughput.md's table (pure): each shipped real-model recipe, in each expert format, on one stated reference
host, with the time model's tokens/s and the wall time of one epoch of a stated dataset. The doc's table is this
function's output (tests/unit/core/sizing/test_reference_table.py compares them; bench/throughput_table.py writes it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.sizing.model_config import MoEArchitecture
from ktdeploy.core.sizing.setup import setup_from
from ktdeploy.core.sizing.throughput import HostCPU, Workload, throughput

# Two AMX sockets: what the recipes' kt_num_threads 64 / kt_threadpool_count 2 are written for, with the trainer's
# reserve (threads_reserved) free. The per-core rate is the GPU machine's (its VM cores), so the band is the
# other-host one.
REFERENCE = HostCPU(72, 2, V.AMX, "2 x 36-core AMX Xeon (72 physical cores, 2 NUMA nodes), kt-kernel AMX build, "
                                  "the recipe's GPUs; per-core rate of the GPU machine")
DATASET_SAMPLES = 10_000       # one epoch of 10,000 samples that fill cutoff_len (2048 in every real recipe)
FORMATS = ("bf16", "fp8", "int8", "int4")
# The cookbook's published throughput (§4, kt-facts "Published figures"): BF16 LoRA, cutoff 2048, batch 1 per GPU,
# gradient accumulation 1, 2 GPUs. Its CPU is not stated.
PUBLISHED = {("Qwen3-235B-A22B", "bf16", 2): 147.91}


def _with_format(train: dict[str, Any], fmt: str) -> dict[str, Any]:
    t = copy.deepcopy(train)
    kt = dict(t.get("kt_config") or {})
    kt.pop("kt_expert_weight_format", None)
    kt["kt_backend"] = "amxint4" if fmt == "int4" else "auto"
    if fmt != "int4":
        kt["kt_expert_weight_format"] = fmt
    t["kt_config"] = kt
    t["num_train_epochs"] = 1
    t.pop("max_steps", None)
    return t


def _hours(s: float) -> str:
    return f"{s / 3600:.1f} h"


def rows(recipes: Sequence[tuple[str, str, dict[str, Any], dict[str, Any], MoEArchitecture]],
         host: HostCPU = REFERENCE) -> list[str]:
    """Markdown rows: (recipe file, model label, train, accelerate, architecture) -> one row per format."""
    out: list[str] = []
    seen: set[str] = set()
    for name, model, train, accelerate, arch in recipes:
        own = setup_from(train, accelerate).expert_format
        # a model's second recipe adds only its own format (its other rows would repeat the first recipe's)
        for fmt in (FORMATS if model not in seen else (own,)):
            t = _with_format(train, fmt)
            s = setup_from(t, accelerate)
            tp = throughput(s, arch, t, host, Workload(samples=DATASET_SAMPLES))
            assert tp.wall_time_s is not None
            pub = PUBLISHED.get((model, fmt, s.num_processes))
            vs = f"{pub:.2f} ({tp.tokens_per_s / pub * 100 - 100:+.0f} %)" if pub else "–"
            mark = " (recipe's)" if fmt == own else ""
            out.append(f"| {name} | {model} | {s.finetuning} | {fmt}{mark} | {s.num_processes} | "
                       f"{tp.tokens_per_s:.1f} ± {tp.band * 100:.0f} % | {tp.step_s:.1f} | {tp.steps} | "
                       f"{_hours(tp.wall_time_s)} | {vs} |")
        seen.add(model)
    return out


HEADER = ("| recipe | model | fine-tuning | experts | GPUs | tokens/s | s/step | steps | one epoch | cookbook tokens/s |\n"
          "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def table(recipes: Sequence[tuple[str, str, dict[str, Any], dict[str, Any], MoEArchitecture]]) -> str:
    return "\n".join([HEADER, *rows(recipes)])
