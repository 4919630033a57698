#!/usr/bin/env python3
"""Predicted vs measured tokens/s for the planner's time model (ktdeploy/core/sizing/throughput.py), and the fit of
its constants. Only runs already committed, all measured on the GPU machine (16-vCPU AMX Xeon VM, one H200,
kt-kernel 0.7.2, torch 2.11):

  * steady runs (steady_tokens_per_s: tokens over the steps after warm-up) from bench/results/gpu/full_results.json,
    repeat_results.json and ab_results.json: the small, medium (kt_num_threads 4..16) and large tiny Qwen3-MoE;
  * whole runs (tokens / train_runtime over 3-6 steps, warm-up included) from bench/results/gpu_peaks.json: the
    weight_scale and vocab_scale shapes with a token count (hidden 2048, 16-80 experts, vocab 4k-152k, cutoff
    512-4096, LoRA and full). Their prediction adds the fitted first-steps warm-up.

    python bench/throughput_calibration.py           # print the table, write bench/results/throughput-calibration.md
    python bench/throughput_calibration.py --fit     # refit the constants on the FIT runs and print them
    python bench/throughput_calibration.py --check   # exit 1 if the committed table differs from a fresh one

The fit: linear least squares on relative error (step seconds = flops/(rate x threads) + bytes/bandwidth +
layer passes x hand-off + fixed), non-negative, over a grid of the two thread constants; the runs named in
HELD_OUT are never seen by it.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import random
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "gpu")]   # bench/gpu's scripts import their siblings

import yaml  # noqa: E402

from ktdeploy.core.sizing.model_config import MoEArchitecture, parse_model_config  # noqa: E402
from ktdeploy.core.sizing.setup import setup_from  # noqa: E402
from ktdeploy.core.sizing.terms import Measured  # noqa: E402
from ktdeploy.core.sizing.throughput import (  # noqa: E402
    FORMAT_SPEED,
    REFERENCE_HOST,
    TIME_CONSTANTS,
    TINY_EXPERT_PARAMS,
    Workload,
    step_shape,
    throughput,
)

RESULTS = ROOT / "bench/results"
REFERENCE, H100_VM, TS_SPR, TS_EMR = "reference", "h100-vm", "ts-model-143", "ts-model-207"
HOSTS = {REFERENCE: "the reference host: 16-vCPU AMX Xeon Firecracker VM, one H200 (bench/results/gpu*)",
         H100_VM: "the H100 VM: 16-vCPU AMX Xeon VM (CPU model not recorded), one H100 80GB, 2026-12-07 "
                  "(bench/results/format-scale/, bench/results/formats/run-20261207/)",
         TS_SPR: "an H100 VM whose 16 vCPUs are Intel family 6 model 143 (105 MiB L3), bench/results/time-scale/ "
                 "call1-2",
         TS_EMR: "an H100 VM whose 16 vCPUs are Intel family 6 model 207 (300 MiB L3), bench/results/time-scale/ "
                 "call3-5: the designed campaign"}
OUT = RESULTS / "throughput-calibration.md"
# The fit sees eight weight-dominated setups, one per axis (filled and variable-length samples, LoRA rank 32, wide
# experts, 32 layers, 160 experts, 4096-token sequences, full fine-tuning); every other setup is held out: the
# other experts/top-k/rank/width/hidden/cutoff/vocab points and every tiny model (small, medium, large).
FIT_SHAPES = {"w10-e80f", "vs-v152-f512", "w30-e160", "w20-l32", "w10-r32", "w10-wide", "w10-c4096",
              "vs-v152-full"}
# The designed campaign (bench/gpu/time_scale.py, one machine): the fit sees the base shape and one change per axis
# that the reference runs cannot separate (tokens per step, layers, experts, expert width, threads, full
# fine-tuning); top-k, hidden size, cutoff, shape fA and the small model are held out.
TIME_FIT = {"ts-base", "ts-b8", "ts-l16", "ts-e128", "ts-i1536", "ts-thr12", "ts-full"}


@dataclass
class Run:
    name: str
    arch: MoEArchitecture
    train: dict[str, Any]
    accelerate: dict[str, Any]
    tokens: int
    steps: int
    measured: float          # tokens/s
    kind: str                # steady | whole
    source: str
    dataset: str

    shape: str = ""          # the model's name; repeats of one setup share (shape, setup) and are averaged
    host: str = REFERENCE    # the machine it ran on (HOSTS)
    fmt: str = "bf16"        # the expert format it ran (bf16 | fp8 | int8 | amxint4 | full)
    window_tokens: float | None = None   # real tokens per step over the steady window, where the log gives them

    @property
    def fit(self) -> bool:
        return (self.host == REFERENCE and self.shape in FIT_SHAPES) or (self.host == TS_EMR and self.shape in TIME_FIT)


def _word_lengths(lo: int, hi: int, n: int = 400) -> list[int]:
    """Words per sample of ktdeploy.agent.tiny's generator (instruction + answer: the words appear twice, once for
    the count task), seed 0 as `ktdeploy tiny-model` builds it."""
    rng = random.Random(0)
    out = []
    for _ in range(n):
        w = rng.randint(lo, hi)
        out.append(w * (1 if rng.randrange(4) == 2 else 2))
    return out


@functools.cache
def padded_ratio(dataset: str, mean_tokens: float, batch: int) -> float:
    """Padded over real tokens for a batch of the tiny datasets: the longest sample sets the batch's length.
    Tokens per sample = template (12, Qwen3 chat markers + task words) + a x words, a fitted to the measured mean."""
    if dataset.startswith("ws_fill"):
        return 1.0
    lo, hi = (90, 200) if dataset == "tiny_sft_long" else (3, 12)
    words = _word_lengths(lo, hi)
    a = (mean_tokens - 12) / statistics.mean(words)
    toks = [12 + a * w for w in words]
    rng = random.Random(1)
    ratios = []
    for _ in range(2000):
        b = rng.sample(toks, batch)
        ratios.append(max(b) / statistics.mean(b))
    return statistics.mean(ratios)


def _batches_in(name: str) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """(dataset, batch) -> (real, padded) tokens of each step of a padding probe's file under time-scale/, as
    LlamaFactory batched them (bench/padding_probe.py: the trainer's own sampler and collator, seed 42); {} where
    the file is not committed."""
    path = RESULTS / "time-scale" / name
    if not path.is_file():
        return {}
    d = json.loads(path.read_text())["batches"]
    return {(v["dataset"], v["batch"]): (v["real"], v["padded"]) for v in d.values()}


@functools.cache
def _probed_batches() -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """The committed probe (padding.json), its batches proven the GPU runs'."""
    return _batches_in("padding.json")


@functools.cache
def _long_probes() -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """The same over a 60-step run (padding_probe.py --long): for runs longer than the probes above."""
    return _batches_in("padding-long.json")


def probed(r: Run) -> tuple[list[int], list[int]] | None:
    """The run's own batches, (real, padded) tokens per step, where the probe has them: same dataset and batch, and
    the same tokens over the run's steps (another tokenizer, such as vocab_scale's, batches other lengths)."""
    if is_filled(r):
        return None
    key = (r.dataset, setup_from(r.train, r.accelerate).batch)
    for got in (_probed_batches().get(key), _long_probes().get(key)):
        if got and len(got[0]) >= r.steps and sum(got[0][:r.steps]) == r.tokens:
            return got[0][:r.steps], got[1][:r.steps]
    return None


def fresh_lengths(lengths: list[int], steps: int) -> int:
    """Of steps 2..``steps``, those whose padded length no earlier step had."""
    return sum(lengths[i] not in lengths[:i] for i in range(1, steps))


def new_lengths(r: Run) -> int:
    """Steps of the steady window (steps 2 to the last) whose batch has a padded length no earlier step had: each
    costs padded_shape_s once. Filled samples: none. Variable-length ones: from the run's probed batches; else
    (another tokenizer) every step of the window, as 4 samples of these lengths rarely repeat a padded length
    within the few steps a run lasts."""
    if is_filled(r):
        return 0
    got = probed(r)
    if got is None:
        return r.steps - 1
    return fresh_lengths(got[1], r.steps)


def _yaml_of(x: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return yaml.safe_load(x["train_yaml"]), yaml.safe_load(x["accelerate_yaml"])


def _with_steady(d: Any) -> list[dict[str, Any]]:
    """Every record in a results file with a steady rate and the train.yaml it ran."""
    if isinstance(d, dict):
        own = [d] if d.get("steady_tokens_per_s") and "train_yaml" in d else []
        return own + [x for v in d.values() for x in _with_steady(v)]
    if isinstance(d, list):
        return [x for v in d for x in _with_steady(v)]
    return []


def _steady_runs() -> list[Run]:
    full = json.loads((RESULTS / "gpu/full_results.json").read_text())
    configs = full["model_configs"]
    by_path = {"tiny-qwen3-moe": "small", "tiny-medium": "medium", "tiny-large": "large"}
    runs = []
    for fname, tag in (("full_results.json", ""), ("repeat_results.json", "@repeat"), ("ab_results.json", "@ab")):
        d = json.loads((RESULTS / "gpu" / fname).read_text())
        found = _with_steady(d)
        for x in found:
            train, acc = _yaml_of(x)
            if not train.get("use_kt"):
                continue
            size = by_path[Path(train["model_name_or_path"]).name]
            runs.append(Run(x["name"] + tag, parse_model_config(configs[size], size), train, acc, x["tokens"],
                            x["steps"], x["steady_tokens_per_s"], "steady", f"bench/results/gpu/{fname}",
                            train["dataset"], size))
    return runs


_STEP_ROW = re.compile(r"'num_input_tokens_seen': (\d+), 'train_runtime': '([\d.]+)'")


def log_steps(path: Path) -> list[tuple[int, float]]:
    """(tokens seen, train_runtime seconds) at every logged step of a LlamaFactory log (logging_steps: 1): the
    trainer's own clock, from the start of training."""
    return [(int(m[1]), float(m[2])) for m in _STEP_ROW.finditer(path.read_text(errors="replace"))]


def steady_from_steps(rows: list[tuple[int, float]], skip: int = 1) -> float | None:
    """Tokens/s from the end of step ``skip + 1`` to the last step (the GPU scripts' steady_tokens_per_s: the
    first step's warm-up left out); None with fewer than two steps after it."""
    if len(rows) < skip + 2:
        return None
    (k0, t0), (k1, t1) = rows[skip], rows[-1]
    return (k1 - k0) / (t1 - t0) if t1 > t0 else None


def _log_of(r: dict[str, Any]) -> Path | None:
    """The committed trainer log of a gpu_peaks run: the one whose last step is the run's tokens and runtime."""
    if r["source"].startswith("bench/gpu/vocab_scale.py"):
        cands = [RESULTS / "gpu/vocab_scale/logs" / f"{r['name']}.log"]
    else:
        cands = [*sorted((RESULTS / "gpu/weight_scale").glob(f"call*/ws-{r['name']}.log")),
                 RESULTS / "gpu/weight_scale" / f"ws-{r['name']}.log"]
    for path in cands:
        rows = log_steps(path) if path.is_file() else []
        if not rows:
            continue
        if "tokens_seen" not in r:       # the run recorded no rate: its one committed log is the run
            return path
        if rows[-1][0] == r["tokens_seen"] and abs(rows[-1][0] / rows[-1][1] - r["tokens_per_s"]) < \
                0.15 * r["tokens_per_s"]:
            return path
    return None


def _whole_runs() -> list[Run]:
    """The weight_scale and vocab_scale runs: steady tokens/s from their committed trainer logs (per-step
    train_runtime, steps after the first), where the log is committed; else the whole-run rate."""
    d = json.loads((RESULTS / "gpu_peaks.json").read_text())
    runs = []
    for r in d["runs"]:
        if not r["train"].get("use_kt") or "model_config" not in r:
            continue
        arch = parse_model_config(r["model_config"], r["name"])
        log = _log_of(r)
        rows = log_steps(log) if log else []
        steady = steady_from_steps(rows)
        if steady:
            assert log is not None
            window = (rows[-1][0] - rows[1][0]) / (len(rows) - 2)
            runs.append(Run(r["name"], arch, r["train"], r["accelerate"], rows[-1][0], len(rows), steady,
                            "steady", str(log.relative_to(ROOT)), r["train"]["dataset"], r["name"].removesuffix("-es"),
                            window_tokens=window))
        elif "tokens_seen" in r:
            runs.append(Run(r["name"], arch, r["train"], r["accelerate"], r["tokens_seen"], r["steps"],
                            r["tokens_per_s"], "whole", "bench/results/gpu_peaks.json", r["train"]["dataset"],
                            r["name"].removesuffix("-es")))
    return runs


FORMAT_SCALE = ("call2.json", "call3.json", "call6.json", "call7.json")
FORMATS_RUN = RESULTS / "formats/run-20261207/gpu_formats_results.json"


def _campaign_run(row: dict, source: str, host: str, name: Callable[[dict], str], label: Callable[[dict], str]) -> Run | None:
    """One row of a bench/gpu campaign (format_scale.py, time_scale.py) as a calibration run: the train.yaml is the
    shipped tiny recipe with the script's --set values (the model path left out); None for a failed run."""
    from bench.gpu.weight_scale import Shape
    from ktdeploy.core.recipe import load_recipe
    m = row.get("measured") or {}
    if m.get("rc") != 0 or not m.get("steady_tokens_per_s"):
        return None
    shape = Shape(**row["shape_spec"])
    sets = [*shape.sets(), *row.get("sets", []), f"train.dataset={shape.dataset}", f"train.max_steps={m['steps']}",
            "train.logging_steps=1", "train.save_steps=1000", "train.include_num_input_tokens_seen=non_padding"]
    r = load_recipe(ROOT / row["recipe"], sets)
    return Run(name(row), parse_model_config(shape.config_dict(), shape.name), dict(r.train),
               dict(r.accelerate or {}), m["tokens"], m["steps"], m["steady_tokens_per_s"], "steady", source,
               shape.dataset, label(row), host, row["format"])


def _format_scale_runs() -> list[Run]:
    """bench/gpu/format_scale.py on the H100 VM: fA/fB in four expert formats side by side and three full fine-tunes."""
    runs = []
    for fname in FORMAT_SCALE:
        for row in json.loads((RESULTS / "format-scale" / fname).read_text())["runs"]:
            run = _campaign_run(row, f"bench/results/format-scale/{fname}", H100_VM,
                                name=lambda x: f"{x['shape_spec']['name']}-{x['format']}",
                                label=lambda x: x["shape_spec"]["name"])
            if run:
                runs.append(run)
    return runs


_FORMAT_OF_SETUP = {"bf16-lora": "bf16", "bf16-full": "full", "int8-lora": "int8", "fp8-lora": "fp8",
                    "amxint4-lora": "amxint4", "int8-lora-ephemeral": "int8"}


def _formats_runs() -> list[Run]:
    """bench/gpu/formats.py on the H100 VM: the six tiny setups (the small model, tiny_sft, 10 steps) side by side."""
    d = json.loads(FORMATS_RUN.read_text())
    full = json.loads((RESULTS / "gpu/full_results.json").read_text())
    arch = parse_model_config(full["model_configs"]["small"], "small")
    acc = {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 1}
    runs = []
    for x in d["setups"]:
        t = x.get("train") or {}
        if t.get("rc") != 0 or not t.get("steady_tokens_per_s"):
            continue
        train = yaml.safe_load(t["train_yaml"])
        tokens = t["summary"]["train_results"]["num_input_tokens_seen"]
        runs.append(Run(f"tiny-{x['setup']}", arch, train, acc, tokens, t["steps"], t["steady_tokens_per_s"],
                        "steady", "bench/results/formats/run-20261207/gpu_formats_results.json", train["dataset"],
                        f"tiny-{x['setup']}", H100_VM, _FORMAT_OF_SETUP[x["setup"]]))
    return runs


TIME_SCALE = RESULTS / "time-scale"


def _host_of(campaign: dict[str, Any]) -> str:
    """Each GPU call may get another VM: the CPU model lscpu printed tells the hosts apart (1.5x apart on one shape)."""
    if "H100" not in campaign.get("machine", ""):
        return REFERENCE
    model = re.search(r"^Model:\s+(\d+)$", campaign.get("cpu", ""), re.M)
    return {"143": TS_SPR, "207": TS_EMR}.get(model[1] if model else "", H100_VM)


def _time_scale_runs() -> list[Run]:
    """bench/gpu/time_scale.py: one axis of a base shape at a time, 14-16 steps, steady over the steps after warm-up."""
    runs = []
    for path in sorted(TIME_SCALE.glob("call*.json")):
        d = json.loads(path.read_text())
        for row in d["runs"]:
            run = _campaign_run(row, str(path.relative_to(ROOT)), _host_of(d),
                                name=lambda x: f"ts-{x['run']}", label=lambda x: f"ts-{x['run']}")
            if run:
                runs.append(run)
    return runs


def reference_runs() -> list[Run]:
    return _steady_runs() + _whole_runs()


def h100_runs() -> list[Run]:
    return _format_scale_runs() + _formats_runs() + [r for r in _time_scale_runs() if r.host != REFERENCE]


def all_runs() -> list[Run]:
    return reference_runs() + h100_runs()


def _workload(r: Run) -> Workload:
    s = setup_from(r.train, r.accelerate)
    # the steady window's own samples where known: every run of one dataset sees the same batches (seed 42)
    per_step = r.window_tokens or r.tokens / r.steps
    mean = per_step / s.batch / s.num_processes
    got = probed(r)
    if got:     # the window's own batches (steps 2 to the last), as LlamaFactory padded them
        return Workload(sample_tokens=mean, padded_ratio=sum(got[1][1:]) / sum(got[0][1:]))
    return Workload(sample_tokens=mean, padded_ratio=padded_ratio(r.dataset, mean, s.batch))


def _new_length_share(r: Run) -> float:
    """New padded lengths per step of the measured window (steps 2 to the last)."""
    return new_lengths(r) / max(1, r.steps - 1)


def predict(r: Run, c: dict[str, Measured]) -> float:
    """Predicted tokens/s as the run measured it (steady, or the whole run with its warm-up): the model's steady
    step plus the window's share of first batches of a padded length (a long run's steady rate has none)."""
    s = setup_from(r.train, r.accelerate)
    tp = throughput(s, r.arch, r.train, REFERENCE_HOST, _workload(r), c)
    per_step = r.window_tokens or r.tokens / r.steps
    step = per_step / tp.tokens_per_s + _new_length_share(r) * c["padded_shape_s"].value
    if r.kind == "steady":
        return per_step / step
    return r.tokens / (r.steps * step + c["first_step_extra_s"].value)


# ---- the fit ---------------------------------------------------------------------------------------------

LINEAR = ("cpu_flop_s_per_core", "expert_dispatch_s", "layer_pass_s", "step_fixed_s", "expert_lora_s",
          "expert_token_s", "padded_shape_s")


def _features(r: Run, c: dict[str, Measured]) -> tuple[list[float], float]:
    """Regressors of the step's seconds (each multiplies 1/rate or a seconds constant) and the seconds left to the
    unfitted terms (GPU, optimizer)."""
    s = setup_from(r.train, r.accelerate)
    sh = step_shape(s, r.arch, REFERENCE_HOST, _workload(r), r.train, c)
    tp = throughput(s, r.arch, r.train, REFERENCE_HOST, _workload(r), c)
    fitted_names = {"routed experts (CPU GEMM)", "per-expert dispatch (CPU)", "MoE layer hand-offs",
                    "fixed per micro-step", "per-expert LoRA work (CPU)", "per routed token (CPU)"}
    other = sum(t.value for t in tp.terms if t.resource == "time" and t.name not in fitted_names)
    m, slow = sh.micro_steps, sh.slowdown
    return [*(m * slow * v for v in (sh.expert_flops / sh.eff_threads, sh.expert_dispatches, sh.layer_passes, 1.0,
                                      sh.expert_lora_units, sh.routed_token_units / sh.eff_threads)),
            _new_length_share(r)], other


def _measured_step(r: Run, c: dict[str, Measured]) -> float:
    per_step = r.window_tokens or r.tokens / r.steps
    if r.kind == "steady":
        return per_step / r.measured
    return (r.tokens / r.measured - c["first_step_extra_s"].value) / r.steps


def _lstsq_nonneg(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares by enumeration: the best unconstrained solution over every subset of columns
    whose coefficients are all non-negative (seven columns: 127 subsets)."""
    import numpy as np
    a, y = np.array(rows), np.array(ys)
    best, best_err = [0.0] * a.shape[1], float("inf")
    for keep in itertools.product([True, False], repeat=a.shape[1]):
        cols = [i for i, k in enumerate(keep) if k]
        if not cols:
            continue
        sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if (sol < 0).any():
            continue
        full = np.zeros(a.shape[1])
        full[cols] = sol
        err = float(((a @ full - y) ** 2).sum())
        if err < best_err:
            best, best_err = [float(v) for v in full], err
    return best


def first_step_extra(runs: list[Run]) -> float:
    """Median of train_runtime - steps / steady rate over the steady runs (their files carry both)."""
    extras = []
    for fname in ("full_results.json", "repeat_results.json", "ab_results.json"):
        d = json.loads((RESULTS / "gpu" / fname).read_text())
        text = json.dumps(d)
        for m in re.finditer(r'"tokens": (\d+), "steps": (\d+), "train_runtime_s": ([\d.]+)', text):
            tokens, steps, runtime = int(m[1]), int(m[2]), float(m[3])
            after = text[m.end():m.end() + 2000]
            sm = re.search(r'"steady_tokens_per_s": ([\d.]+)', text[max(0, m.start() - 400):m.start()]) or \
                re.search(r'"steady_tokens_per_s": ([\d.]+)', after)
            if sm and steps >= 8:
                extras.append(runtime - tokens / float(sm[1]))
    return statistics.median(extras)


def groups(runs: list[Run]) -> list[list[Run]]:
    """Runs of one setup (same shape, cutoff, batch, threads, dataset, fine-tuning): repeats, averaged. The two
    vocab_scale allocator settings (expandable segments on/off) count as repeats: they change memory, not speed."""
    out: dict[tuple[Any, ...], list[Run]] = {}
    for r in runs:
        s = setup_from(r.train, r.accelerate)
        threads = (r.train.get("kt_config") or {}).get("kt_num_threads")
        out.setdefault((r.host, r.fmt, r.shape, s.cutoff_len, s.batch, threads, r.dataset, s.finetuning, s.lora_rank, r.kind),
                       []).append(r)
    return list(out.values())


def measured(g: list[Run]) -> float:
    return statistics.mean(r.measured for r in g)


def campaign_factor(runs: list[Run], c: dict[str, Measured], host: str) -> float:
    """The designed campaign's host against the reference: the geometric mean of measured / predicted step time over
    its fit setups (1 for the reference). Fitted with the constants, so no held-out run of that host enters it."""
    if host == REFERENCE:
        return 1.0
    logs = [math.log(statistics.mean(_measured_step(r, c) for r in g) * predict(g[0], c) /
                     (g[0].window_tokens or g[0].tokens / g[0].steps)) for g in groups(runs) if g[0].fit and
            g[0].host == host]
    return math.exp(statistics.mean(logs)) if logs else 1.0


def fit(runs: list[Run]) -> dict[str, Measured]:
    """Least squares on relative step-time error over the FIT setups of both fitted hosts, the campaign host's step
    times divided by its factor against the reference (alternating: constants, then the factor, until both settle).
    The two thread constants are not refitted here: they stay those of the medium tiny model's thread sweep (4-16
    threads, shown in the table)."""
    c = dict(TIME_CONSTANTS)
    c["first_step_extra_s"] = Measured(round(first_step_extra(runs), 2), TIME_CONSTANTS["first_step_extra_s"].source)
    factor = 1.0
    for _ in range(60):
        rows, ys = [], []
        for g in (g for g in groups(runs) if g[0].fit):
            f, other = _features(g[0], c)
            y = statistics.mean(_measured_step(r, c) for r in g) / (factor if g[0].host == TS_EMR else 1.0) - other
            rows.append([v / y for v in f])
            ys.append(1.0)
        coef = _lstsq_nonneg(rows, ys)
        for name, v in zip(LINEAR, coef, strict=True):
            value = (1.0 / v if v else 1e30) if name == "cpu_flop_s_per_core" else v
            c[name] = Measured(value, TIME_CONSTANTS[name].source)
        factor = campaign_factor(runs, c, TS_EMR)
    for name in LINEAR:
        c[name] = Measured(float(f"{c[name].value:.3g}"), c[name].source)
    return c


# ---- the table ------------------------------------------------------------------------------------------

@dataclass
class Errors:
    fit_max: float
    held_filled: list[float]        # held-out setups on filled samples (every batch cutoff x batch tokens)
    held_var: list[float]           # held-out setups on variable-length samples (the padding model decides)
    held_tiny: list[float]          # of those, the ones under TINY_EXPERT_PARAMS routed expert params
    held_var_wide: list[float]      # variable-length, at or above TINY_EXPERT_PARAMS


def is_filled(r: Run) -> bool:
    return r.dataset.startswith("ws_fill")


def table(runs: list[Run], c: dict[str, Measured], factor: float = 1.0) -> tuple[str, Errors]:
    """Measured vs predicted per setup; ``factor``: the host's fitted step-time factor against the reference."""
    lines = ["| setup (runs averaged) | set | measured as | fine-tuning | hidden x layers, experts top-k, I (vocab) | "
             "cutoff x batch, dataset | kt threads | tokens/s measured (runs) | predicted | error |",
             "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    fitted, filled, var, tiny, var_wide = [], [], [], [], []
    for g in groups(runs):
        r = g[0]
        s = setup_from(r.train, r.accelerate)
        p = predict(r, c) / factor
        m = measured(g)
        err = p / m - 1
        if r.fit:
            fitted.append(abs(err))
        else:
            (filled if is_filled(r) else var).append(abs(err))
            if r.arch.routed_expert_params < TINY_EXPERT_PARAMS:
                tiny.append(abs(err))
            elif not is_filled(r):
                var_wide.append(abs(err))
        a = r.arch
        threads = (r.train.get("kt_config") or {}).get("kt_num_threads")
        each = ", ".join(f"{x.measured:.0f}" for x in g)
        lines.append(f"| {' + '.join(x.name for x in g)} | {'fit' if r.fit else '**held out**'} | {r.kind} | "
                     f"{s.finetuning} r{s.lora_rank} | {a.hidden_size} x {a.num_layers}, {a.num_experts} "
                     f"top-{a.experts_per_tok}, {a.moe_intermediate_size} ({a.vocab_size}) | {s.cutoff_len} x "
                     f"{s.batch}, {r.dataset} | {threads} | {m:.1f} ({each}) | {p:.1f} | {err * 100:+.1f} % |")
    return "\n".join(lines), Errors(max(fitted), filled, var, tiny, var_wide)


# ---- the expert formats: side by side on the H100 VM ------------------------------------------------------

FORMAT_FIT_SHAPE = "fA"        # the format factors are fitted on this shape's four runs; fB and the tiny runs held out
_SETUP_FORMAT = {"bf16": "bf16", "fp8": "fp8", "int8": "int8", "amxint4": "int4"}


def _steps_of(r: Run, c: dict[str, Measured]) -> tuple[float, float]:
    """(the model's step seconds, its bf16 expert GEMM seconds) of the run as it would run with bf16 experts."""
    s = setup_from(r.train, r.accelerate)
    tp = throughput(replace(s, expert_format="bf16"), r.arch, r.train, REFERENCE_HOST, _workload(r), c)
    gemm = next(t.value for t in tp.terms if t.name == "routed experts (CPU GEMM)")
    return tp.step_s, gemm


def format_fit(runs: list[Run], c: dict[str, Measured]) -> dict[str, float]:
    """Each format's GEMM rate relative to bf16 such that the model's format/bf16 ratio of tokens/s on
    FORMAT_FIT_SHAPE is the measured one: step_f = step_bf16 + gemm_bf16 (1/F - 1) = step_bf16 / ratio."""
    side = {r.fmt: r for r in runs if r.host == H100_VM and r.shape == FORMAT_FIT_SHAPE}
    base = side["bf16"]
    step, gemm = _steps_of(base, c)
    out = {}
    for fmt, r in side.items():
        if fmt in _SETUP_FORMAT and fmt != "bf16":
            ratio = r.measured / base.measured
            out[_SETUP_FORMAT[fmt]] = 1.0 / (1.0 + step * (1.0 / ratio - 1.0) / gemm)
    return out


def _side_by_side(runs: list[Run]) -> list[tuple[Run, Run]]:
    """(run, the bf16 LoRA run of the same shape and session) for every non-bf16 LoRA run on the H100 VM."""
    h = [r for r in runs if r.host == H100_VM]
    fs = {r.shape: r for r in h if r.fmt == "bf16"}
    tiny = next(r for r in h if r.name == "tiny-bf16-lora")
    out = []
    for r in h:
        if r.fmt in ("bf16", "full"):
            continue
        out.append((r, fs.get(r.shape, tiny)))
    return out


def formats_section(runs: list[Run], c: dict[str, Measured]) -> tuple[str, float]:
    lines = ["| shape | run | set | measured tokens/s | bf16 measured | measured vs bf16 | model vs bf16 | error |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    held = []
    for r, b in _side_by_side(runs):
        m = r.measured / b.measured
        p = predict(r, c) / predict(b, c)
        fit = r.shape == FORMAT_FIT_SHAPE
        if not fit:
            held.append(abs(p / m - 1))
        lines.append(f"| {r.shape} | {r.name} | {'fit' if fit else '**held out**'} | {r.measured:.1f} | "
                     f"{b.measured:.1f} | {m:.3f} | {p:.3f} | {(p / m - 1) * 100:+.1f} % |")
    return "\n".join(lines), max(held)


# ---- the other machines: what `ktdeploy tune`'s one measurement does for the others ---------------------------

def machine_of(r: Run) -> str:
    """The GPU call (a fresh VM each, unless the next call found it warm) a run of another host came from."""
    return r.host if r.host in (TS_SPR, TS_EMR) else r.source


def anchor_of(group: list[Run]) -> Run | None:
    """The machine's bf16 LoRA run on the widest shape: what `tune` would have measured there."""
    lora = [r for r in group if r.fmt == "bf16" and setup_from(r.train, r.accelerate).finetuning == "lora"]
    return max(lora, key=lambda r: r.arch.routed_expert_params) if lora else None


def host_scaled(runs: list[Run], c: dict[str, Measured], anchor: Run | str) -> dict[str, float]:
    """Predicted tokens/s of every run of the anchor's machine scaled by the anchor's measured / predicted (what
    `ktdeploy plan --tuned` does with tune's figure for another recipe). A name must be one run's only (ts-base ran
    on two VMs: pass the run)."""
    if isinstance(anchor, str):
        (a,) = [r for r in runs if r.name == anchor and r.host != REFERENCE]
    else:
        a = anchor
    f = a.measured / predict(a, c)
    return {r.name: predict(r, c) * f for r in runs if r.host != REFERENCE and machine_of(r) == machine_of(a)}


def host_section(runs: list[Run], c: dict[str, Measured]) -> tuple[str, list[float], list[float]]:
    """Every run of the other machines (not the designed campaign's), each scaled by its own machine's anchor."""
    lines = ["| machine | run | experts | fine-tuning | hidden x layers, experts top-k, I (vocab) | measured steady "
             "(median step) | model, reference host | error | x the machine's factor | error | error vs median step |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lora, full = [], []
    machines: dict[str, list[Run]] = {}
    for r in runs:
        if r.host not in (REFERENCE, TS_EMR):
            machines.setdefault(machine_of(r), []).append(r)
    for m, group in machines.items():
        anchor = anchor_of(group)
        scaled = host_scaled(runs, c, anchor) if anchor else {}
        for r in group:
            s = setup_from(r.train, r.accelerate)
            p, q, med = predict(r, c), scaled.get(r.name), _median_of(r)
            if q and r is not anchor:
                (full if s.finetuning == "full" else lora).append(abs(q / r.measured - 1))
            a = r.arch
            lines.append(
                f"| {m.removeprefix('bench/results/')} | {r.name}{' (anchor)' if r is anchor else ''} | "
                f"{s.expert_format} | {s.finetuning} | {a.hidden_size} x {a.num_layers}, {a.num_experts} "
                f"top-{a.experts_per_tok}, {a.moe_intermediate_size} ({a.vocab_size}) | {r.measured:.1f}"
                f"{f' ({med:.0f})' if med else ''} | {p:.1f} | {(p / r.measured - 1) * 100:+.1f} % | "
                + (f"{q:.1f} | {(q / r.measured - 1) * 100:+.1f} % | " if q else "no bf16 LoRA run there | – | ")
                + (f"{(q / med - 1) * 100:+.1f} % |" if q and med else "– |"))
    return "\n".join(lines), lora, full


_STAMP = re.compile(r"20\d\d-\d\d-\d\d")
# the results files whose runs' logs were not kept: the date their call's output tail gives
_TAIL_OF = {"bench/results/gpu/full_results.json": "bench/results/gpu/full_output_tail.txt",
            "bench/results/gpu/repeat_results.json": "bench/results/gpu/repeat_output_tail.txt",
            # its header: "same warm machine right after the repeat call" (no clock of its own)
            "bench/results/gpu/ab_results.json": "bench/results/gpu/repeat_output_tail.txt"}


def session_of(r: Run) -> str:
    """The day of the reference host's GPU session a run came from, by the first date its log (or its call's output
    tail) prints."""
    src = _TAIL_OF.get(r.source, r.source)
    got = _STAMP.search((ROOT / src).read_text(errors="replace"))
    return got[0] if got else "?"


def _is_tiny(r: Run) -> bool:
    return r.arch.routed_expert_params < TINY_EXPERT_PARAMS


def excess_s(r: Run, c: dict[str, Measured]) -> float:
    """Measured minus predicted seconds per step (steady runs)."""
    per_step = r.window_tokens or r.tokens / r.steps
    return per_step / r.measured - per_step / predict(r, c)


def session_section(runs: list[Run], c: dict[str, Measured]) -> tuple[str, dict[str, list[float]]]:
    """The reference host's weight-dominated runs (>= 1 G routed expert params) by session, with the seconds per step
    the model missed; returns the table and, per session, the excess of its variable-length runs at LoRA rank <= 32."""
    ref = sorted((r for r in runs if r.host == REFERENCE and not _is_tiny(r)), key=lambda r: (session_of(r), r.source))
    lines = ["| session (log clock) | call | run | set | samples | routed expert params | measured | predicted | error "
             "| measured - predicted s/step |", "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    by: dict[str, list[float]] = {}
    for r in ref:
        p, x = predict(r, c), excess_s(r, c)
        if not is_filled(r) and setup_from(r.train, r.accelerate).lora_rank <= 32:
            by.setdefault(session_of(r), []).append(x)
        call = str(Path(r.source).parent if r.source.endswith(".log") else r.source).removeprefix("bench/results/gpu/")
        lines.append(f"| {session_of(r)} | {call} | {r.name} | {'fit' if r.fit else 'held out'} | "
                     f"{'filled' if is_filled(r) else 'variable'} | {r.arch.routed_expert_params / 1e9:.2f} G | "
                     f"{r.measured:.1f} | {p:.1f} | {(p / r.measured - 1) * 100:+.1f} % | {x:+.2f} |")
    return "\n".join(lines), by


def _span(xs: list[float]) -> str:
    return f"{min(xs):+.2f} to {max(xs):+.2f} s"


def _fastest(runs: list[Run], c: dict[str, Measured]) -> str:
    wide = [r for r in runs if r.host == REFERENCE and not _is_tiny(r) and not is_filled(r) and r.arch.vocab_size == 4096]
    top = sorted(wide, key=lambda r: -predict(r, c))[:3]
    return ", ".join(r.name for r in top[:2]) + f" and {top[2].name}"


def _excess_of(runs: list[Run], c: dict[str, Measured], name: str) -> str:
    (r,) = [r for r in runs if r.host == REFERENCE and r.name == name]
    return f"{excess_s(r, c):+.2f} s"


def _median_of(r: Run) -> float | None:
    """The run's median step tokens/s (one stalled step moves it far less than the steady rate), if recorded."""
    if r.source.startswith("bench/results/format-scale/"):
        for row in json.loads((ROOT / r.source).read_text())["runs"]:
            if f"{row.get('shape')}-{row.get('format')}" == r.name:
                return (row.get("measured") or {}).get("median_step_tokens_per_s")
    if r.source.startswith("bench/results/time-scale/"):
        for row in json.loads((ROOT / r.source).read_text())["runs"]:
            if f"ts-{row.get('run')}" == r.name:
                return (row.get("measured") or {}).get("median_step_tokens_per_s")
    if r.source == str(FORMATS_RUN.relative_to(ROOT)):
        for x in json.loads(FORMATS_RUN.read_text())["setups"]:
            if f"tiny-{x['setup']}" == r.name:
                return (x.get("train") or {}).get("median_step_tokens_per_s")
    return None


def _worst(xs: list[float]) -> str:
    return f"{max(xs) * 100:.1f} %" if xs else "–"


def padding_section() -> str:
    """The padding model against LlamaFactory's own batches (bench/padding_probe.py)."""
    rows = ["| dataset x batch | steps probed | padded / real, LlamaFactory's batches | `padded_ratio` (generator) | "
            "new padded lengths in steps 2-14 |", "| --- | ---: | ---: | ---: | ---: |"]
    for (dataset, batch), (real, padded) in sorted(_probed_batches().items()):
        mean = sum(real) / len(real) / batch
        window = min(14, len(padded))
        rows.append(f"| {dataset} x {batch} | {len(real)} | {sum(padded) / sum(real):.3f} | "
                    f"{padded_ratio(dataset, mean, batch):.3f} | {fresh_lengths(padded, window)} of {window - 1} |")
    return "\n".join(rows)


def render(runs: list[Run], c: dict[str, Measured]) -> str:
    ref_body, e = table([r for r in runs if r.host == REFERENCE], c)
    factor = campaign_factor(runs, c, TS_EMR)
    ts_body, t = table([r for r in runs if r.host == TS_EMR], c, factor)
    filled = e.held_filled + t.held_filled
    within = sum(x <= 0.15 for x in filled)
    formats, fmt_held = formats_section(runs, c)
    host, host_lora, host_full = host_section(runs, c)
    sessions_table, sessions = session_section(runs, c)
    consts = "\n".join(f"| `{k}` | {v.value:.4g} | {v.source} |" for k, v in c.items())
    fconsts = "\n".join(f"| `{k}` | {v.value:.4g} | {v.source} |" for k, v in FORMAT_SPEED.items())
    fitted = format_fit(runs, c)
    refit = ", ".join(f"{k} {v:.3g}" for k, v in fitted.items())
    hosts = "; ".join(f"*{k}*, {v}" for k, v in HOSTS.items())
    return f"""# Throughput calibration: the planner's time model vs measured runs

Generated by `python bench/throughput_calibration.py` from committed measurements only (no GPU run here).
Hosts: {hosts}. All: kt-kernel 0.7.2, torch 2.11, one GPU, AMX backend. Models: random Qwen3-MoE
(`ktdeploy tiny-model`, `bench/gpu/weight_scale.py`, `bench/gpu/vocab_scale.py`, `bench/gpu/format_scale.py`,
`bench/gpu/time_scale.py`).

*steady*: tokens/s from the end of the first step to the last (the GPU scripts' `steady_tokens_per_s`; for the
weight_scale and vocab_scale runs, from the end of the second step, by the per-step `train_runtime` of their
committed trainer logs). Tokens are
non-padding tokens (LlamaFactory's `include_num_input_tokens_seen: non_padding`); the model computes on padded
tokens: the measured window's own padded/real ratio where the padding probe below has the run's batches, else
(another tokenizer) the ratio derived from the dataset generator (`padded_ratio` in the script).
*Filled* datasets (`ws_fill_*`) truncate every sample to the cutoff, so a batch is cutoff x batch tokens; the
variable-length ones (`tiny_sft`, `tiny_sft_long`) are padded to each batch's longest sample.

The padding model was checked against LlamaFactory's own batches: `bench/padding_probe.py` runs the trainer's
sampler and collator on the CPU (the full image, a throwaway model) with each variable-length setup, counting
non-padding and then all tokens per step (bench/results/time-scale/padding.json); its non-padding counts equal the
GPU runs' step for step, so these are the GPU runs' batches. The ratio is right; what the padding model missed is
that a batch of a padded length no earlier step had costs more: in the campaign's variable-length runs the two
steps whose length repeated (steps 9 and 11) were the two fastest of `ts-var` and `ts-var-k4` (thin evidence: in
`ts-var-i1536` and `ts-var-l16` the step time follows the padded tokens instead; docs/throughput.md). The model's
`padded_shape_s` ({c["padded_shape_s"].value:.3g} s, fitted) is paid once per new length, counted from the probed
batches over the measured window (a long run meets each multiple of 8 up to cutoff_len once, so its steady rate
carries none, and `plan` adds it to the wall time once per length).

{padding_section()}

Every GPU call may land on another VM of the same kind, and they differ: the designed campaign's base shape ran at
2820 tokens/s on a model-143 CPU and at 1905 on a model-207 one (bench/results/time-scale/). So the fit
(`--fit`, least squares on relative step time) is joint over two hosts with one free step-time factor for the
second: eight setups of the reference host (weight-dominated, one per axis, 2026-12-04) and seven of the designed
campaign (its base shape and one change per axis: tokens per step, layers, experts, expert width, threads, full
fine-tuning); every other setup is held out, the campaign's five variable-length runs among them. The two thread constants are those of the medium tiny model's thread
sweep. Repeats of one setup are averaged (the medium model at 14 threads measured 619-823 tokens/s over five runs,
±14 % around their mean: what one host's runs scatter).

**Worst error on the fitted setups: reference {e.fit_max * 100:.1f} %, campaign {t.fit_max * 100:.1f} % (its fitted
factor {factor:.3f}). Held out on filled samples: {within} of {len(filled)} within 15 %, worst {_worst(filled)}.
Held out on variable-length samples: worst {_worst(e.held_var_wide + t.held_var_wide)} at 1 G routed expert params or
more, {_worst(e.held_var + t.held_var)} over all (the tiny models, under 1 G: worst {_worst(e.held_tiny + t.held_tiny)}).
Expert formats (ratio to bf16 measured side by side): worst held-out error {fmt_held * 100:.1f} %.
Other machines with their own bf16 LoRA run as `tune`'s figure: LoRA worst {_worst(host_lora)}, full fine-tuning
worst {_worst(host_full)}.**

## Reference host

{ref_body}

## The reference host, session by session

The reference host's runs came from GPU sessions on three days (the date each run's log, or its call's output
tail, prints); the runs recorded no CPU model, and a session may have been another VM of the kind (above: one shape
1.48x apart on two VMs of one kind). Below, its weight-dominated runs (>= 1 G routed expert params) with the
seconds per step the model missed. The variable-length runs at LoRA rank 32 or less missed by {_span(sessions.get("2026-12-02", []) + sessions.get("2026-12-03", []))}
per step in the sessions of 2026-12-02 and 2026-12-03, and by {_span(sessions.get("2026-12-04", []))} in those of 2026-12-04; rank 64
(w10-r64, 2026-12-04) by {_excess_of(runs, c, "w10-r64")}. A cost of the session (another VM, or a per-step cost that differed between
sessions) fits that; so does one of shape: {_fastest(runs, c)} are the three weight-dominated variable-length
shapes of vocabulary 4096 the model predicts fastest, and all three miss by about +20 % across two sessions. Nothing
recorded decides between them; the next GPU call that runs them records its CPU model.

{sessions_table}

## The designed campaign (bench/gpu/time_scale.py, one model-207 H100 VM)

Predicted = the model's tokens/s / the campaign's fitted factor {factor:.3f}.

{ts_body}

## Expert formats

`bench/gpu/format_scale.py` trained two weight-dominated shapes (fA: 2048 x 12, 64 experts top-8, I 768; fB: 1536 x
10, 96 top-6, I 1024; every batch 4 x 512 tokens) with their experts held as bf16, native block FP8, INT8 and
AMXINT4, one after another in one call on an H100 VM; `bench/gpu/formats.py` did the same for the six tiny setups
(the small model, 10 steps; its expert GEMM is ~1 % of the step, so those ratios are noise around 1). The factors
in `FORMAT_SPEED` are fitted on fA (`format_fit`: the factor that makes the model's format/bf16 ratio the measured
one; it gives {refit}); fB and the tiny runs are held out. The ratio is what a format changes wherever the host's
factor is.

{formats}

| format | GEMM rate vs bf16 | source |
| --- | ---: | --- |
{fconsts}

## Other machines: one run's factor, as `ktdeploy tune` gives it

Every run of the other GPU calls against the model with the reference host's constants, then scaled by the
measured / predicted of the call's own bf16 LoRA run (what `ktdeploy plan --tuned` does with `ktdeploy tune`'s
figure for another recipe). The median step rate (in brackets) is the median of the per-step intervals: one
stalled interval moves it far less than the steady rate. In the full fine-tunes of bench/results/format-scale/
the steady rate is half the median one (four intervals: three at the median, one 4-9 s longer), so most of
their gap to the model is one stall inside a 4-step window rather than a per-step cost.

{host}

## Constants

| constant | value | source |
| --- | ---: | --- |
{consts}
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    runs = all_runs()
    c = dict(TIME_CONSTANTS)
    if args.fit:
        c = fit(runs)
        for k in (*LINEAR, "threads_reserved", "oversubscription", "first_step_extra_s"):
            print(f"{k} = {c[k].value:.4g}")
        for k, v in format_fit(runs, c).items():
            print(f"FORMAT_SPEED[{k!r}] = {v:.3g}")
    text = render(runs, c)
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print("calibration table up to date" if same else f"{OUT} differs from a fresh run")
        return 0 if same else 1
    print(text)
    if not args.fit:
        OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
