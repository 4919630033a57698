"""TEST DOUBLE for `ktdeploy train` in tune trials (not the real trainer; that is proven on the GPU machine).

Accepts the arguments `ktdeploy tune` passes to `ktdeploy train` and writes ``trainer_log.jsonl`` lines with
LlamaFactory LogCallback's keys (current_steps, total_steps, loss, lr, epoch, percentage, elapsed_time,
remaining_time, throughput, total_tokens, vram_allocated, vram_reserved). Its speed follows a simulated curve
over kt_num_threads that peaks at FAKE_BEST_THREADS (default 8), like the 16-core GPU machine's measured curve
(832 tok/s at 16 threads, 1407 at 8, 1142 at 4).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    sets = {}
    it = iter(argv)
    for a in it:
        if a == "--set":
            k, _, v = next(it).partition("=")
            sets[k] = json.loads(v) if v not in ("", "null") and v[0] in "0123456789-[{\"tf" else v
    threads = int(sets.get("train.kt_config.kt_num_threads", 16))
    depth = int(sets.get("train.kt_config.kt_max_cache_depth", 2))
    retain = sets.get("train.kt_cpu_activation") == "retain"
    steps = int(sets["train.max_steps"])
    out = Path(sets["train.output_dir"])
    out.mkdir(parents=True)
    best = float(os.environ.get("FAKE_BEST_THREADS", "8"))
    rate = 4000.0 * (threads / best) / (1 + ((threads / best) ** 2 - 1) / 2)  # peaks at `best`
    rate *= 1.0 + 0.04 * (depth == 2) + (0.08 if retain else 0.0)
    tokens_per_step = 1024
    if os.environ.get("FAKE_FAIL_THREADS") and threads == int(os.environ["FAKE_FAIL_THREADS"]):
        print("RuntimeError: simulated KT failure", file=sys.stderr)
        return 1
    start = time.time()
    ballast = bytearray(int(os.environ.get("FAKE_RSS_MB", "50")) * (1 << 20))  # resident memory the sampler must see
    ballast[::4096] = b"x" * len(ballast[::4096])
    with open(out / "trainer_log.jsonl", "a") as log:
        for step in range(1, steps + 1):
            time.sleep(tokens_per_step / rate * (3 if step == 1 else 1))  # the first step is slow (warm-up)
            elapsed = time.time() - start
            tokens = step * tokens_per_step
            log.write(json.dumps({"current_steps": step, "total_steps": steps, "loss": 2.0 / step, "lr": 1e-4,
                                  "epoch": step / steps, "percentage": round(step / steps * 100, 2),
                                  "elapsed_time": time.strftime("%H:%M:%S", time.gmtime(elapsed)),
                                  "remaining_time": "0:00:01", "throughput": round(tokens / elapsed, 2),
                                  "total_tokens": tokens, "vram_allocated": 0.4 + 0.01 * depth,
                                  "vram_reserved": 0.5 + 0.01 * depth}) + "\n")
            log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
