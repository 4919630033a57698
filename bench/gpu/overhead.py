#!/usr/bin/env python3
"""What `ktdeploy train` itself costs a training run (issue P1), measured side by side in one device call.

    device tool: run(command="bash bench/gpu/overhead.sh", carry=["bench/gpu/.carry"], timeout_s=580)

On the medium tiny MoE (hidden 1024, 8 layers, 64 experts, top-8; `tiny_sft_long`, cutoff 512, batch 4) with
the derived thread count, it runs `ktdeploy train` (validate -> doctor -> render -> launch, run record,
metrics callback, summary) and the same LlamaFactory run launched by hand (LlamaFactory's own launcher, the
YAMLs the first ktdeploy run rendered), interleaved after a short warm-up run so drift on the machine falls on
every side alike; to bisect, also `ktdeploy train --skip-doctor` (S), the agent's exact argv and env without
the `ktdeploy train` parent (D), and `ktdeploy train --exec` (E, the default since this bench: the process
becomes the launcher, the trainer writes the record), X (`--exec --skip-doctor`: is it the doctor run just before?); K is `ktdeploy train --watch` (the watching parent). F is E with KTDEPLOY_GC_FREEZE=1 (the heap frozen before step 1; each E/F run's summary carries gc_s/gc_full;
p1_overhead-gcfreeze.json was measured when E froze by default and F set it to 0). G is a hand run from a fresh empty directory (E runs from a fresh record folder), Q is E under py-spy (speedscope
to $OUT). P1_NEWFILES=1 lists the files each run wrote outside the outputs. P1_ORDER picks the sequence
(default EHHEEHHEEHHE: ABBA blocks). Both are timed the same way from outside: the arrival time of each
line LlamaFactory appends to trainer_log.jsonl (gpu_bench.GpuSampler), steady tokens/s after the first step.
Writes $OUT/p1_overhead.json (per run and the ratios; key `train_over_hand_median`) and $OUT/p1_log.txt.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_bench as gb  # noqa: E402

PERF = ["train.dataset=tiny_sft_long", "train.learning_rate=1.0e-4"]
STEPS = 14


def direct_train(name: str, like: dict, logs: Path, timeout: float, cwd: Path | None = None) -> dict:
    """The agent's exact command run without the `ktdeploy train` parent: `accelerate launch -m
    ktdeploy.agent.lf_entry` with KTDEPLOY_METRICS, on the YAMLs the ktdeploy run rendered."""
    from ruamel.yaml import YAML

    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    train = y.load(like["train_yaml"])
    train["output_dir"] = str(gb.OUTPUT / name)
    d = gb.OUTPUT / ".direct" / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "train.yaml", "w") as f:
        y.dump(train, f)
    (d / "accelerate.yaml").write_text(like["accelerate_yaml"])
    argv = [gb.PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--config_file",
            str(d / "accelerate.yaml"), "-m", "ktdeploy.agent.lf_entry", str(d / "train.yaml")]
    return gb.measured(name, argv, gb.OUTPUT / name, logs, timeout,
                       {"CUDA_VISIBLE_DEVICES": "0", "KTDEPLOY_METRICS": str(d / "metrics.jsonl")},
                       cwd=d if cwd is None else cwd)


def real_adapter(out: Path) -> dict:
    """After the pairs (P1_THEN_PROOF=1): the tiny "small" model's proof run (train with held-out logits,
    the real convert, the adapter checked against the trainer's own logits) and its real KT output copied
    to $OUT/real/ so the serve-side loading (bench/serve/load_adapter.py --kt-output) runs on real tensors."""
    import shutil

    work = Path("/tmp/ktdeploy-p1-proof")
    work.mkdir(parents=True, exist_ok=True)
    r = gb.proof(work, steps=40, timeout=150)
    real = out / "real"
    real.mkdir(parents=True, exist_ok=True)
    src = gb.OUTPUT / "proof-small"
    for f in ("fused_expert_lora.safetensors", "adapter_model.safetensors", "adapter_config.json",
              "kt_adapter_manifest.json"):
        if (src / f).is_file():
            shutil.copy2(src / f, real / f)
    return {k: v for k, v in r.items() if k != "train" or not isinstance(v, dict)} | \
        {"train": {k: v for k, v in (r.get("train") or {}).items() if k not in ("train_yaml", "accelerate_yaml")}}


def new_files(marker: Path, out: Path) -> dict:
    """Files written anywhere on the root filesystem since ``marker`` (outside the run outputs and this bench's
    own logs): where a run leaves state that a later run in the same place could find (the stall hunt)."""
    skip = (str(gb.OUTPUT), str(marker.parent), str(out))
    p = gb.sh(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "-path", "/dev", "-o", "-path", "/run",
               ")", "-prune", "-o", "-newer", str(marker), "-type", "f", "-print"], timeout=120)
    paths = [ln for ln in p.stdout.splitlines() if ln and (not ln.startswith(skip) or "/.cuda-cache/" in ln)]
    tops: dict[str, int] = {}
    for ln in paths:
        top = "/".join(ln.split("/")[:4])
        tops[top] = tops.get(top, 0) + 1
    return {"count": len(paths), "by_dir": tops, "first": paths[:120]}


def pyspy_attach(name: str, out: Path) -> None:
    """py-spy (carried in bench/gpu/.carry/tools) attached to the training process (lf_entry) as soon as it
    appears, until it exits, speedscope format: the samples keep their order, so a stalled step's stacks can
    be found. Runs in a thread beside the measured run."""
    import subprocess
    import threading

    wheels = sorted((gb.REPO / "bench" / "gpu" / ".carry" / "tools").glob("py_spy-*.whl"))
    if not wheels:
        gb.say("  no py-spy wheel carried")
        return
    gb.sh([gb.PY, "-m", "pip", "install", "--no-deps", "--no-index", str(wheels[0])], timeout=120)
    exe = str(Path(gb.PY).parent / "py-spy")

    def attach() -> None:
        t_end = time.monotonic() + 120
        while time.monotonic() < t_end:
            found = gb.trainer_processes(("lf_entry",))
            if found:
                pid = found[0][0]
                p = subprocess.run([exe, "record", "--pid", pid, "--rate", "200", "--format", "speedscope",
                                    "--output", str(out / f"pyspy-{name}.json"), "--nonblocking"],
                                   capture_output=True, text=True)
                gb.say(f"  py-spy on {pid}: rc={p.returncode} {p.stderr.strip()[-300:]}")
                return
            time.sleep(0.2)

    threading.Thread(target=attach, daemon=True).start()


def neighbour_ratios(res: dict) -> list[float]:
    """For each exec run: its steady tokens/s over the mean of the hand runs just before and after it in the
    order (one when it is first or last): a paired ratio, so a drift over the call falls on both sides."""
    rate: dict[str, float] = {}
    for key in ("exec", "hand"):
        for r in res[key]:
            if r.get("rc") == 0 and r.get("steady_tokens_per_s"):
                rate[r["name"]] = r["steady_tokens_per_s"]
    seq = [(n, n.split("-")[-1][0]) for n in res["order"] if n in rate]
    out = []
    for i, (name, side) in enumerate(seq):
        if side != "E":
            continue
        near = []
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(seq) and seq[j][1] != "H":
                j += step
            if 0 <= j < len(seq):
                near.append(rate[seq[j][0]])
        if near:
            out.append(round(rate[name] / statistics.mean(near), 4))
    return out


def main() -> int:
    budget = float(os.environ.get("P1_BUDGET_S", "540"))
    out = Path(os.environ.get("OUT", "/tmp/ktdeploy-gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ktdeploy-p1")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # nvidia-smi only at the start of a run (the peak is not what this bench is about): a poll every few
    # seconds is a CPU burst on a machine whose cores kt-kernel's workers hold, on both sides alike, but noise
    if os.environ.get("P1_SNAPSHOT"):
        gb.SNAPSHOT_AT_S = float(os.environ["P1_SNAPSHOT"])
    gb.GPU_POLL_S = float(os.environ.get("P1_GPU_POLL_S", "1e9"))
    res: dict = {"how": "bash bench/gpu/overhead.sh (device tool); bench/gpu/overhead.py", "steps": STEPS,
                 "order": [], "ktdeploy": [], "hand": [], "skip_doctor": [], "direct": [], "exec": [],
                 "exec_skip_doctor": [], "doctor_then_hand": [],
                 "direct_cwd_record": [], "exec_gc_frozen": [], "hand_fresh_cwd": [], "exec_pyspy": []}

    def save() -> None:
        k = [r["steady_tokens_per_s"] for r in res["ktdeploy"] if r.get("rc") == 0 and r.get("steady_tokens_per_s")]
        h = [r["steady_tokens_per_s"] for r in res["hand"] if r.get("rc") == 0 and r.get("steady_tokens_per_s")]
        res["ktdeploy_tokens_per_s"], res["hand_tokens_per_s"] = k, h
        for key in ("skip_doctor", "direct", "exec", "exec_skip_doctor", "doctor_then_hand", "direct_cwd_record",
                    "exec_gc_frozen", "hand_fresh_cwd"):
            v = [r["steady_tokens_per_s"] for r in res[key] if r.get("rc") == 0 and r.get("steady_tokens_per_s")]
            res[f"{key}_tokens_per_s"] = v
            if v and h:
                res[f"{key}_over_hand_median"] = round(statistics.median(v) / statistics.median(h), 4)
        # `ktdeploy train` defaults to --exec (E): that is the figure the goal is about; K (--watch) is kept apart
        # the same per run on the median step interval (robust to one stalled step), and per ABBA block:
        # each E run over the mean of the H runs next to it in the order (drift over the call cancels)
        for key in ("exec", "direct", "hand"):
            res[f"{key}_median_step_tokens_per_s"] = [r.get("median_step_tokens_per_s") for r in res[key]
                                                      if r.get("rc") == 0 and r.get("median_step_tokens_per_s")]
        em, hm = res["exec_median_step_tokens_per_s"], res["hand_median_step_tokens_per_s"]
        if em and hm:
            res["train_over_hand_median_step"] = round(statistics.median(em) / statistics.median(hm), 4)
        res["exec_over_neighbour_hand"] = neighbour_ratios(res)
        if res["exec_over_neighbour_hand"]:
            res["exec_over_neighbour_hand_median"] = round(statistics.median(res["exec_over_neighbour_hand"]), 4)
        e = res.get("exec_tokens_per_s") or []
        if k and h:
            res["watch_over_hand_median"] = round(statistics.median(k) / statistics.median(h), 4)
        if e and h:
            res["train_over_hand_median"] = round(statistics.median(e) / statistics.median(h), 4)
            res["train_over_hand_mean"] = round(statistics.mean(e) / statistics.mean(h), 4)
            res["pairs"] = min(len(e), len(h))
        res["wall_s"] = round(time.monotonic() - gb.T0, 1)
        (out / "p1_overhead.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "p1_log.txt").write_text("\n".join(gb.LOG) + "\n")

    try:
        res["setup"] = gb.setup()
        res["machine"] = {"nproc": os.cpu_count(), "gpu": gb.sh("nvidia-smi --query-gpu=name,driver_version "
                                                                "--format=csv,noheader").stdout.strip()}
        medium = gb.MODELS / "tiny-medium"
        res["model"] = gb.build_model("medium", medium)
        # the warm-up is a full-length ktdeploy run (not measured): it pays the first-run costs and renders the
        # YAMLs every hand (H) and direct (D) run uses
        warm = gb.ktdeploy_train("p1-warmup", medium, STEPS, logs, 150, extra=PERF)
        like = dict(warm) if warm.get("train_yaml") else None
        res["warmup"] = {k: v for k, v in warm.items() if k not in ("train_yaml", "accelerate_yaml")}
        if like is not None and os.environ.get("P1_WARM_HAND", "1") == "1":
            # the hand side pays its first-run costs too (CUDA's JIT cache is per working directory: the first
            # run in a directory compiles the attention's run-time kernels for each new sequence length)
            wh = gb.hand_train("p1-warmup-hand", like, logs, 150)
            res["warmup_hand"] = {k: v for k, v in wh.items() if k != "train"}
        # K = ktdeploy train, S = ktdeploy train --skip-doctor, D = the agent's argv+env without the ktdeploy
        # parent, H = hand launch (LlamaFactory's launcher); ABBA-style order
        for i, side in enumerate(os.environ.get("P1_ORDER", "EHHEEHHEEHHE")):
            if budget - (time.monotonic() - gb.T0) < 75:
                gb.say(f"stopped before run {i}: budget")
                break
            name = f"p1-{side}{i}"
            marker = work / f"marker-{name}"
            marker.touch()
            if side in "KSEXF":   # F: E with the heap frozen (KTDEPLOY_GC_FREEZE=1)
                r = gb.ktdeploy_train(name, medium, STEPS, logs, 150, extra=PERF, skip_doctor=side in "SX",
                                      args=["--exec"] if side in "EXF" else ["--watch"],
                                      env_extra={"KTDEPLOY_GC_FREEZE": "1"} if side == "F" else None)
                res[{"K": "ktdeploy", "S": "skip_doctor", "E": "exec", "X": "exec_skip_doctor",
                     "F": "exec_gc_frozen"}[side]].append(
                    {k: v for k, v in r.items() if k not in ("train_yaml", "accelerate_yaml")})
            elif side == "P":   # the doctor alone first (not measured), then a hand run: residue of the doctor?
                if like is None:
                    continue
                doc = gb.sh([gb.PY, "-m", "ktdeploy", "doctor", "--recipe", str(gb.RECIPE),
                             *gb.common_sets(name, medium, STEPS, PERF), "--json"], timeout=120)
                gb.say(f"  doctor before {name}: rc={doc.returncode}")
                r = gb.hand_train(name, like, logs, 150)
                res["doctor_then_hand"].append({k: v for k, v in r.items() if k != "train"})
            elif side == "Q":   # E under py-spy (not in any ratio: the sampler costs CPU)
                pyspy_attach(name, out)
                r = gb.ktdeploy_train(name, medium, STEPS, logs, 150, extra=PERF, args=["--exec"])
                res["exec_pyspy"].append({k: v for k, v in r.items() if k not in ("train_yaml", "accelerate_yaml")})
            elif side == "G":   # a hand run from a fresh empty directory (as --exec runs from a fresh record folder)
                if like is None:
                    continue
                cwd = work / "cwd" / name
                cwd.mkdir(parents=True, exist_ok=True)
                r = gb.hand_train(name, like, logs, 150, cwd=cwd)
                res["hand_fresh_cwd"].append({k: v for k, v in r.items() if k != "train"})
            elif side == "D":
                if like is None:
                    continue
                res["direct"].append(direct_train(name, like, logs, 150, cwd=gb.REPO))
            elif side == "C":   # D run from its record folder (as --exec does: os.chdir(run_dir)), not the repo
                if like is None:
                    continue
                res["direct_cwd_record"].append(direct_train(name, like, logs, 150))
            else:
                if like is None:
                    continue
                r = gb.hand_train(name, like, logs, 150)
                res["hand"].append({k: v for k, v in r.items() if k != "train"})
            res["order"].append(name)
            if os.environ.get("P1_NEWFILES"):
                res.setdefault("new_files", {})[name] = new_files(marker, out)
            save()
        if os.environ.get("P1_THEN_PROOF"):
            res["proof"] = real_adapter(out)
    except Exception:
        import traceback

        res["error"] = traceback.format_exc()
        gb.say(res["error"])
    save()
    gb.say(f"ktdeploy {res.get('ktdeploy_tokens_per_s')} hand {res.get('hand_tokens_per_s')} "
           f"median ratio {res.get('train_over_hand_median')} mean ratio {res.get('train_over_hand_mean')}; "
           f"skip-doctor {res.get('skip_doctor_tokens_per_s')} ({res.get('skip_doctor_over_hand_median')}), "
           f"direct {res.get('direct_tokens_per_s')} ({res.get('direct_over_hand_median')}), "
           f"exec {res.get('exec_tokens_per_s')} ({res.get('exec_over_hand_median')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
