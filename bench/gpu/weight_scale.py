"""Weight-dominated calibration points for the planner (issue 19): random Qwen3-MoE models with 5-40 GB of
routed experts, each trained a few steps through `ktdeploy train`, measured and appended to
bench/results/gpu_peaks.json (= ktdeploy/core/sizing/data/gpu_peaks.json) with how they were made.

Per run: peak host RSS of the whole process tree sampled every 0.25 s *over time* (the timeline is kept, marked
with the first trainer-log line, so load vs first steps can be told apart), GPU memory from torch
(LlamaFactory's RECORD_VRAM=1 -> max_memory_allocated in trainer_log.jsonl) and from nvidia-smi memory.used.
The planner's own prediction on the same rendered YAMLs is stored beside it.

On the GPU machine (128 GiB RAM, 64 GiB disk, one device call <= 600 s; a 40 GB build takes ~30-60 s), from a
clean checkout plus the carried wheels (bench/gpu/fetch_wheels.py), one call per group of shapes:

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        python3 bench/gpu/weight_scale.py --setup --shapes w5-e64,w10-e128 --out "$OUT"

(`--list` prints the shapes, their sizes, whether they fit and the grouping into calls.)

then copy "$OUT"/gpu_peaks.json over bench/results/gpu_peaks.json here and run bench/planner_calibration.py.
Pure parts (shapes, expert bytes, machine fit, call grouping, timeline summary, the gpu_peaks entry, the append)
are unit-tested in tests/unit/core/sizing/test_weight_scale.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

GB = 1e9
GIB = 2**30
PEAKS = REPO / "bench/results/gpu_peaks.json"
RECIPE = REPO / "recipes/tiny-moe-lora.yaml"


@dataclass(frozen=True)
class Shape:
    """One random Qwen3-MoE and its training knobs (every layer sparse, no shared expert)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    lora_rank: int = 8
    cutoff_len: int = 512
    batch: int = 4
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 4096
    expert_format: str = "bf16"
    fill: bool = False              # train on samples longer than the cutoff: every sequence is cut_len tokens

    @property
    def dataset(self) -> str:
        """tiny_sft_long pads a 512-cutoff batch to ~360 tokens (longest sample 416) and a 2048 cutoff to ~270:
        the planner plans cutoff x batch (the worst case), so a point that measures activations uses ``fill``."""
        return f"ws_fill_{self.cutoff_len}" if self.fill else tiny_long_dataset()

    def config_dict(self) -> dict:
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size, "intermediate_size": self.moe_intermediate_size * 4,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
        }

    def sets(self) -> list[str]:
        """The recipe overrides (`ktdeploy train --set`) this shape's knobs map to."""
        lora = [f"train.lora_rank={self.lora_rank}", f"train.lora_alpha={2 * self.lora_rank}"] if self.lora_rank else []
        fmt = [f"train.kt_config.kt_expert_weight_format={self.expert_format}"] if self.expert_format else []
        return [*lora, f"train.cutoff_len={self.cutoff_len}", f"train.per_device_train_batch_size={self.batch}", *fmt]


def expert_bytes(s: Shape) -> float:
    """Routed-expert bytes on disk in bf16: layers x experts x (gate, up, down) x H x I x 2."""
    return s.num_hidden_layers * s.num_experts * 3 * s.hidden_size * s.moe_intermediate_size * 2


def non_expert_params(s: Shape) -> int:
    h, L = s.hidden_size, s.num_hidden_layers
    attn = h * s.head_dim * (s.num_attention_heads * 2 + s.num_key_value_heads * 2) + 2 * s.head_dim
    per_layer = attn + h * s.num_experts + 2 * h
    return L * per_layer + 2 * s.vocab_size * h + h


def model_bytes(s: Shape) -> float:
    return expert_bytes(s) + non_expert_params(s) * 2


# Shapes spanning 5-40 GB of experts, varying one axis at a time around w10 (expert count, width, top-k,
# layers, hidden size, LoRA rank, cutoff). Planned host peaks stay under the machine's 128 GiB.
SHAPES: list[Shape] = [
    Shape("w5-e64", 2048, 10, 64, 8, 640),                                   # 5.0 GB of experts
    Shape("w10-e80", 2048, 16, 80, 8, 640),                                  # 10.1 GB: the reference
    Shape("w10-k4", 2048, 16, 80, 4, 640),                                   # top-k 4
    Shape("w10-wide", 2048, 16, 40, 8, 1280),                                # same bytes, half the experts, 2x wide
    Shape("w11-h3072", 3072, 12, 80, 8, 640, num_attention_heads=24),        # 11.3 GB, larger hidden
    Shape("w10-r32", 2048, 16, 80, 8, 640, lora_rank=32),                    # LoRA rank 32 (= the AMX K step)
    Shape("w10-r64", 2048, 16, 80, 8, 640, lora_rank=64),                    # rank 64
    Shape("w10-c2048", 2048, 16, 80, 8, 640, cutoff_len=2048, batch=1, fill=True),  # long cutoff, filled
    Shape("w10-c4096", 2048, 16, 80, 8, 640, cutoff_len=4096, batch=1, fill=True),  # longer, filled
    Shape("w10-e80f", 2048, 16, 80, 8, 640, fill=True),                      # the reference, every batch 4 x 512
    Shape("w20-l32", 2048, 32, 80, 8, 640),                                  # 20.1 GB: more layers
    Shape("w30-e160", 2048, 24, 160, 8, 640),                                # 30.2 GB
    Shape("w39-e208", 2048, 24, 208, 8, 640),                                # 39.3 GB (64 GiB disk: one at a time)
]
SHAPE_BY_NAME = {s.name: s for s in SHAPES}


def planned(s: Shape) -> dict:
    """The planner's figures for this shape on one GPU (the recipe the script trains with)."""
    from ktdeploy.core.sizing.calibration import upper_edges
    from ktdeploy.core.sizing.estimate import estimate
    from ktdeploy.core.sizing.model_config import parse_model_config

    train = {"finetuning_type": "lora", "lora_rank": s.lora_rank, "cutoff_len": s.cutoff_len,
             "per_device_train_batch_size": s.batch, "preprocessing_num_workers": 2, "dataloader_num_workers": 0,
             "kt_config": {"kt_expert_weight_format": s.expert_format, "kt_max_cache_depth": 2,
                           "kt_share_backward_bb": True, "kt_threadpool_count": 1}}
    acc = {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 1,
           "fsdp_config": {"fsdp_cpu_ram_efficient_loading": True}}
    p = estimate((train, acc), parse_model_config(s.config_dict(), source=s.name))
    return {"host_gib": p.host_memory_gib, "gpu_gib": p.gpu_memory_gib_per_gpu, "edges": upper_edges(p)}


def fits_machine(s: Shape, ram_gib: float = 128, disk_gib: float = 64, reserve_gib: float = 8) -> tuple[bool, str]:
    """Whether one run of the shape fits the GPU machine: the model on disk (built, trained, deleted) and the
    planner's upper-edge host peak + the builder's reserve under RAM."""
    disk = model_bytes(s) / GIB
    if disk + reserve_gib > disk_gib:
        return False, f"model {disk:.1f} GiB + {reserve_gib} GiB > disk {disk_gib} GiB"
    host = planned(s)["edges"]["host"]
    if host + reserve_gib > ram_gib:
        return False, f"planned host {host:.1f} GiB + {reserve_gib} GiB > RAM {ram_gib} GiB"
    return True, f"model {disk:.1f} GiB, planned host {host:.1f} GiB"


def run_seconds(s: Shape, steps: int, build_s_per_gb: float = 4.0, load_s_per_gb: float = 3.0,
                step_s: float = 6.0, fixed_s: float = 60.0) -> float:
    """Rough wall time of one run (build + load + steps + start-up), for grouping runs into device calls.
    Defaults are from the issue (~30 s to build ~10 GB) and the tiny runs (~60 s of start-up)."""
    gb = model_bytes(s) / GB
    return fixed_s + gb * (build_s_per_gb + load_s_per_gb) + steps * step_s * max(1.0, gb / 10)


def group_calls(shapes: list[Shape], steps: int, call_s: float = 540.0) -> list[list[str]]:
    """Greedy, in order: shapes per device call so each call stays under ``call_s`` (one shape per call at least)."""
    calls: list[list[str]] = []
    cur: list[str] = []
    left = call_s
    for s in shapes:
        t = run_seconds(s, steps)
        if cur and t > left:
            calls.append(cur)
            cur, left = [], call_s
        cur.append(s.name)
        left -= t
    if cur:
        calls.append(cur)
    return calls


def summarize_timeline(samples: list[tuple[float, int]], train_start_s: float | None) -> dict:
    """Peak RSS of the tree overall, before the first trainer-log line (model load, KT buffer set-up) and after
    it (training steps), with the time of each peak. ``samples`` are (seconds since launch, bytes)."""
    def peak(rows):
        if not rows:
            return None, None
        t, b = max(rows, key=lambda r: r[1])
        return round(b / GIB, 3), round(t, 1)

    out: dict = {}
    out["peak_gib"], out["peak_at_s"] = peak(samples)
    if train_start_s is not None:
        out["train_start_s"] = round(train_start_s, 1)
        out["load_peak_gib"], out["load_peak_at_s"] = peak([r for r in samples if r[0] < train_start_s])
        out["train_peak_gib"], out["train_peak_at_s"] = peak([r for r in samples if r[0] >= train_start_s])
    return out


def thin(samples: list[tuple[float, int]], every_s: float = 2.0) -> list[list[float]]:
    """The timeline kept in the JSON: one sample per ``every_s`` (the max within it), [t, GiB]."""
    buckets: dict[int, tuple[float, int]] = {}
    for t, b in samples:
        k = int(t // every_s)
        if k not in buckets or b > buckets[k][1]:
            buckets[k] = (t, b)
    return [[round(t, 1), round(b / GIB, 3)] for _, (t, b) in sorted(buckets.items())]


def peaks_entry(s: Shape, config: dict, train: dict, accelerate: dict, m: dict, provenance: str) -> dict:
    """One gpu_peaks.json run in the format bench/planner_calibration.py and ktdeploy.core.sizing.calibration read."""
    return {
        "name": s.name, "model_config": config, "train": train, "accelerate": accelerate,
        "num_processes": int(accelerate.get("num_processes") or 1),
        "peak_host_rss_gib": m["peak_host_rss_gib"], "peak_gpu_mem_gib": m.get("peak_gpu_alloc_gib"),
        "peak_gpu_used_gib_nvsmi": m["peak_gpu_used_gib_nvsmi"], "tokens_per_s": m.get("tokens_per_s"),
        "expert_gb": round(expert_bytes(s) / GB, 2), "shape": asdict(s), "dataset": s.dataset,
        "tokens_seen": m.get("tokens"), "steps": m.get("steps"),
        "rss_timeline": m.get("rss_timeline"), "rss_phases": m.get("rss_phases"),
        "planned_at_measurement": m.get("planned"),
        "source": provenance,
    }


def pre_weights_peak(timeline: list[list[float]], train_start_s: float, log_text: str) -> float | None:
    """Peak RSS of the tree before the model's weights start loading (the tokenization phase: the trainer with
    torch, LlamaFactory and CUDA up, the preprocessing workers alive, no weights), from a run's RSS timeline
    ([seconds since launch, GiB]) and its log. The log's clock is placed on the timeline's by the first
    trainer-log line: it appears at train_start_s, ``train_runtime`` of step 1 after "Running training".
    None when the log lacks a line it needs or no sample falls before the weights."""
    import re
    from datetime import datetime

    def at(pattern: str) -> datetime | None:
        m = re.search(r"([0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3}) >> " + pattern, log_text)
        return datetime.strptime(m.group(1), "%H:%M:%S,%f") if m else None

    weights, training = at("loading weights file"), at(r"\*\*\*\*\* Running training")
    step1 = re.search(r"'train_runtime': '([0-9.]+)'", log_text)
    if weights is None or training is None or step1 is None:
        return None
    weights_at = train_start_s - float(step1.group(1)) - (training - weights).total_seconds()
    before = [gib for t, gib in timeline if t < weights_at]
    return max(before) if before else None


def annotate_pre_weights(doc: dict, logs: dict[str, str]) -> dict:
    """gpu_peaks.json with ``pre_weights_peak_gib`` set on every run that has a timeline and a log
    (``logs``: run name -> log text)."""
    runs = []
    for r in doc.get("runs", []):
        r = dict(r)
        text = logs.get(r["name"])
        phases = r.get("rss_phases") or {}
        if text and r.get("rss_timeline") and phases.get("train_start_s") is not None:
            peak = pre_weights_peak(r["rss_timeline"], phases["train_start_s"], text)
            if peak is not None:
                r["pre_weights_peak_gib"] = peak
        runs.append(r)
    return {**doc, "runs": runs}


def committed_logs(root: Path = REPO / "bench/results/gpu") -> dict[str, str]:
    """Run name -> log text of the committed weight_scale / vocab_scale runs (a later call's log of the same run
    replaces an earlier one: bench/results/gpu/weight_scale/call4 re-measured w10-c2048)."""
    out: dict[str, str] = {}
    for f in sorted((root / "weight_scale").glob("**/ws-*.log"), key=lambda p: (len(p.parts), str(p))):
        out[f.stem[len("ws-"):]] = f.read_text(errors="replace")
    for f in sorted((root / "vocab_scale" / "logs").glob("vs-*.log")):
        out[f.stem] = f.read_text(errors="replace")
    return out


def append_runs(doc: dict, entries: list[dict]) -> dict:
    """gpu_peaks.json with ``entries`` added. A run of the same name is replaced (a re-measurement), never
    duplicated; an entry without both peaks is refused (a failed run is not a calibration point)."""
    for e in entries:
        if not e.get("peak_host_rss_gib") or not e.get("peak_gpu_used_gib_nvsmi"):
            raise ValueError(f"run {e.get('name')!r} has no host or GPU peak: not a calibration point")
    names = {e["name"] for e in entries}
    runs = [r for r in doc.get("runs", []) if r.get("name") not in names] + entries
    return {**doc, "runs": runs}


# ---------------------------------------------------------------- the GPU machine side (not unit-tested)

class TreeSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.25):
        super().__init__(daemon=True)
        from ktdeploy.agent.monitor import tree_rss_bytes
        self.pid, self.interval, self.rss = pid, interval, tree_rss_bytes
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(Exception):       # a process vanished mid-scan: the next tick is fine
                self.samples.append((time.monotonic() - self.t0, self.rss(self.pid)))
            self.done.wait(self.interval)


def build(s: Shape, model_dir: Path, data_dir: Path) -> dict:
    import torch

    from ktdeploy.agent import tiny

    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    tiny.build_tokenizer(model_dir, s.vocab_size)
    if not (data_dir / "dataset_info.json").exists():
        tiny.build_dataset(data_dir, 400)
    if s.fill:
        build_fill_dataset(data_dir, s.cutoff_len)
    size = tiny.TinySize(s.hidden_size, s.num_hidden_layers, s.num_experts, s.num_experts_per_tok,
                         s.moe_intermediate_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim,
                         s.vocab_size)
    cfg = tiny.build_model(model_dir, size, device="cuda" if torch.cuda.is_available() else "cpu")
    torch.cuda.empty_cache()
    return cfg


def build_fill_dataset(data_dir: Path, cutoff: int, rows: int = 64) -> str:
    """``ws_fill_<cutoff>``: samples of more words than ``cutoff`` (>= 1 token each), so LlamaFactory truncates
    every one to exactly the cutoff and a batch holds cutoff x batch tokens, the planner's worst case."""
    import random

    from ktdeploy.agent import tiny

    rng = random.Random(cutoff)
    name = f"ws_fill_{cutoff}"
    samples = [tiny._sample(rng, cutoff + 64, cutoff + 256) for _ in range(rows)]
    (data_dir / f"{name}.json").write_text(json.dumps(samples))
    info_path = data_dir / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info[name] = {"file_name": f"{name}.json"}
    info_path.write_text(json.dumps(info, indent=2))
    return name


def tiny_long_dataset() -> str:
    from ktdeploy.agent.tiny import LONG_DATASET_NAME
    return LONG_DATASET_NAME


def measure(s: Shape, model_dir: Path, out_root: Path, steps: int, timeout: float, recipe: Path = RECIPE,
            extra: tuple[str, ...] = (), name: str | None = None) -> dict:
    """One `ktdeploy train` of the shape, sampled from outside; ``recipe`` and ``extra`` (--set values) choose the
    setup (bench/gpu/format_scale.py trains each expert format with its shipped tiny recipe)."""
    from ruamel.yaml import YAML

    from bench.gpu.gpu_bench import GpuSampler, common_sets, read_outputs

    name = name or f"ws-{s.name}"
    out_dir = out_root / name
    shutil.rmtree(out_dir, ignore_errors=True)
    sets = common_sets(name, model_dir, steps, [*s.sets(), f"train.dataset={s.dataset}", *extra])
    argv = [sys.executable, "-m", "ktdeploy", "train", str(recipe), *sets, "--run-root", str(out_root / ".runs" / name)]
    gpu = GpuSampler(out_dir / "trainer_log.jsonl", interval=0.2)
    gpu.start()
    env = {**os.environ, "RECORD_VRAM": "1", "PYTHONUNBUFFERED": "1"}
    start = None
    out_root.mkdir(parents=True, exist_ok=True)
    with open(out_root / f"{name}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT)
        rss = TreeSampler(proc.pid)
        rss.start()
        try:
            while proc.poll() is None:
                if start is None and (out_dir / "trainer_log.jsonl").exists():
                    start = time.monotonic() - rss.t0      # first trainer-log line: load is over, steps began
                if time.monotonic() - rss.t0 > timeout:
                    proc.terminate()
                time.sleep(0.5)
        finally:
            rss.done.set()
            rss.join()
            gpu_peak = gpu.stop()
    phases = summarize_timeline(rss.samples, start)
    gpu._poll_log()
    steady, steady_steps = gpu.steady_tokens_per_s()
    res = {"rc": proc.returncode, "peak_host_rss_gib": phases["peak_gib"],
           "peak_gpu_used_gib_nvsmi": round(gpu_peak, 3), "rss_phases": phases,
           "steady_tokens_per_s": steady, "steady_steps": steady_steps,
           "median_step_tokens_per_s": gpu.median_step_tokens_per_s(),
           # (seconds since the first trainer-log line, step, tokens): a stall shows as one long interval
           "step_arrivals": [(round(t - gpu.log_rows[0][0], 3), st, tok) for t, st, tok in gpu.log_rows][:256],
           "rss_timeline": thin(rss.samples), **read_outputs(out_dir)}
    runs = sorted((out_root / ".runs" / name).glob("*"))
    y = YAML(typ="safe", pure=True)
    if runs and (runs[-1] / "train.yaml").exists():
        res["train"] = y.load((runs[-1] / "train.yaml").read_text())
        res["accelerate"] = y.load((runs[-1] / "accelerate.yaml").read_text())
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all); see --list")
    ap.add_argument("--list", action="store_true", help="print shapes, sizes, planned peaks and the call grouping")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/weight-scale")))
    ap.add_argument("--work", type=Path, default=Path("/srv/ktdeploy"))
    ap.add_argument("--setup", action="store_true",
                    help="install the carried wheels first (bench/gpu/gpu_bench.py setup)")
    ap.add_argument("--timeout", type=float, default=480)
    ap.add_argument("--annotate-pre-weights", action="store_true",
                    help="here: set pre_weights_peak_gib on the committed runs from their logs and timelines")
    a = ap.parse_args()
    shapes = [SHAPE_BY_NAME[n] for n in a.shapes.split(",") if n] if a.shapes else SHAPES
    if a.annotate_pre_weights:
        doc = annotate_pre_weights(json.loads(PEAKS.read_text()), committed_logs())
        PEAKS.write_text(json.dumps(doc, indent=2) + "\n")
        for r in doc["runs"]:
            print(f"{r['name']:18} {r.get('pre_weights_peak_gib')}")
        return 0
    if a.list:
        for s in shapes:
            ok, why = fits_machine(s)
            print(f"{s.name:12} experts {expert_bytes(s) / GB:5.1f} GB  ~{run_seconds(s, a.steps):4.0f} s  "
                  f"{'fits' if ok else 'SKIP'}: {why}")
        print("device calls:", json.dumps(group_calls([s for s in shapes if fits_machine(s)[0]], a.steps)))
        return 0
    if a.setup:
        from bench.gpu.gpu_bench import setup
        setup()
    a.out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(PEAKS.read_text())
    machine = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    entries, results = [], []
    for s in shapes:
        ok, why = fits_machine(s)
        if not ok:
            results.append({"name": s.name, "skipped": why})
            continue
        model_dir = a.work / "models" / f"ws-{s.name}"
        t0 = time.monotonic()
        cfg = build(s, model_dir, a.work / "data")
        build_s = time.monotonic() - t0
        m = measure(s, model_dir, a.work / "output", a.steps, a.timeout)
        m["planned"] = {k: round(v, 3) for k, v in planned(s).items() if k != "edges"}
        results.append({"name": s.name, "rc": m["rc"], "build_s": round(build_s, 1),
                        **{k: m.get(k) for k in ("peak_host_rss_gib", "peak_gpu_used_gib_nvsmi", "peak_gpu_alloc_gib",
                                                 "tokens", "steps", "rss_phases", "planned")}})
        if m["rc"] == 0 and m.get("train"):
            prov = (f"bench/gpu/weight_scale.py --shapes {s.name} --steps {a.steps} on the GPU machine ({machine}, "
                    f"{time.strftime('%Y-%m-%d', time.gmtime())}): random bf16 Qwen3-MoE built by "
                    "ktdeploy.agent.tiny, trained through `ktdeploy train` recipes/tiny-moe-lora.yaml; host = "
                    "process-tree RSS sampled every 0.25 s; GPU = nvidia-smi memory.used (and torch max allocated)")
            entries.append(peaks_entry(s, cfg, m["train"], m["accelerate"], m, prov))
        shutil.rmtree(model_dir, ignore_errors=True)      # 64 GiB disk: one model at a time
        (a.out / "weight_scale_results.json").write_text(json.dumps(results, indent=2))
        if entries:
            (a.out / "gpu_peaks.json").write_text(json.dumps(append_runs(doc, entries), indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if all(r.get("rc", 0) == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
