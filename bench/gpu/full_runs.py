"""The full GPU experiment (`python3 bench/gpu/full_runs.py full|repeat`, via bench/gpu/device.sh): every figure in one device call.

(proof)  small tiny model: ktdeploy train -> ktdeploy convert -> numeric check of the adapter
(a)      medium model: `ktdeploy train` vs the same LlamaFactory run launched by hand (LlamaFactory's own
         launcher, the YAMLs ktdeploy rendered), tokens/s ratio
(b)      medium model: the derived kt_num_threads/kt_threadpool_count (the (a) ktdeploy run) vs hand settings
(c)      medium model: KT vs plain LlamaFactory (use_kt off, same YAML otherwise), GPU memory
(peaks)  small / medium / large: peak host RSS and GPU memory, written as gpu_peaks.json for the planner

The medium model (hidden 1024, 8 layers, 64 experts, top-8, expert width 512) on the long synthetic
dataset (cutoff 512, batch 4) is where the CPU experts dominate a step.
"""

from __future__ import annotations

import time

import gpu_bench as gb

PERF = ["train.dataset=tiny_sft_long", "train.learning_rate=1.0e-4"]


def _left(budget: float, t0: float) -> float:
    return budget - (time.monotonic() - t0)


def run(work, budget: float, t0: float) -> dict:
    out: dict = {}
    logs = work / "logs"
    small = gb.MODELS / "tiny-qwen3-moe"
    medium = gb.MODELS / "tiny-medium"
    large = gb.MODELS / "tiny-large"
    cfg = {"small": gb.build_model("small", small), "medium": gb.build_model("medium", medium)}
    steps = 10

    out["proof"] = gb.proof(work, steps=40, timeout=200)

    # (a) ktdeploy train vs by hand, same rendered YAMLs; the ktdeploy run also fills derived threads (b)
    a_kt = gb.ktdeploy_train("a-ktdeploy", medium, steps, logs, 150, extra=PERF)
    a_hand = gb.hand_train("a-hand", a_kt, logs, 150) if a_kt.get("train_yaml") else {"error": "no rendered yaml"}
    out["a"] = {"ktdeploy": a_kt, "hand": a_hand}
    derived = gb.threads_of(a_kt)
    out["derived_threads"] = derived

    # (c) plain LlamaFactory on the same model and data
    out["c_plain"] = gb.hand_train("c-plain", a_kt, logs, 150, plain=True) if a_kt.get("train_yaml") else None

    # (b) hand settings of kt_num_threads (threadpools: 1 NUMA node here), most informative first
    def sweep(values):
        for t in values:
            if t == derived[0]:
                continue
            if _left(budget, t0) < 75:
                gb.say(f"sweep stopped before threads={t}: budget")
                return
            out["b_sweep"].append(gb.ktdeploy_train(f"b-threads-{t}", medium, steps, logs, 100,
                                                    extra=PERF + [f"train.kt_config.kt_num_threads={t}",
                                                                  "train.kt_config.kt_threadpool_count=1"]))

    out["b_sweep"] = []
    sweep((8, 16))

    # (peaks) third size for the planner
    if _left(budget, t0) > 140:
        cfg["large"] = gb.build_model("large", large)
        out["large"] = gb.ktdeploy_train("peaks-large", large, 8, logs, min(120, _left(budget, t0) - 15), extra=PERF)
    sweep((4, 12, 6))
    out["model_configs"] = cfg
    return out


def run_repeat(work, budget: float, t0: float) -> dict:
    """Second full call: the proof again (router LoRA in the check), (a) interleaved twice, (c), (b) again."""
    out: dict = {}
    logs = work / "logs"
    small = gb.MODELS / "tiny-qwen3-moe"
    medium = gb.MODELS / "tiny-medium"
    cfg = {"small": gb.build_model("small", small), "medium": gb.build_model("medium", medium)}
    steps = 10
    out["proof"] = gb.proof(work, steps=40, timeout=200)

    # (a) interleaved: ktdeploy, hand, ktdeploy, hand - every hand run reuses the YAMLs the first full-length
    # ktdeploy run rendered (a 2-step warm-up run goes first so neither side pays the first-run costs)
    first = gb.ktdeploy_train("a-warmup", medium, 2, logs, 150, extra=PERF)
    a = {"hand": [], "ktdeploy": [], "warmup": first}
    for i in (1, 2):
        a["ktdeploy"].append(gb.ktdeploy_train(f"a-ktdeploy-{i}", medium, steps, logs, 150, extra=PERF))
        a["hand"].append(gb.hand_train(f"a-hand-{i}", a["ktdeploy"][0], logs, 150))
    out["a"] = a
    derived = gb.threads_of(a["ktdeploy"][0])
    out["derived_threads"] = derived

    out["c_plain"] = gb.hand_train("c-plain", a["ktdeploy"][0], logs, 150, plain=True)

    out["b_sweep"] = []
    for t in (12, 10, 8, 16):
        if t == derived[0]:
            continue
        if _left(budget, t0) < 70:
            gb.say(f"sweep stopped before threads={t}: budget")
            break
        out["b_sweep"].append(gb.ktdeploy_train(f"b-threads-{t}", medium, steps, logs, 100,
                                                extra=PERF + [f"train.kt_config.kt_num_threads={t}",
                                                              "train.kt_config.kt_threadpool_count=1"]))
    out["model_configs"] = cfg
    return out


if __name__ == "__main__":
    import sys

    sys.exit(gb.main({"full": run, "repeat": run_repeat}))
