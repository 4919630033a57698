"""Real vocabularies, long filled sequences and a full fine-tune on the GPU machine (issue 32): one device call.

Every earlier calibration run had the tiny models' 4,096-token vocabulary. Here the same random Qwen3-MoE body
(hidden 2048, 8 layers, 16 query / 4 KV heads x 128, 32 experts top-8, expert width 768) is built with the
vocabularies of real KT models (32,000; DeepSeek-V3's 129,280; Qwen3's 151,936) and trained through
`ktdeploy train` at cutoff 512 x batch 4, at long filled sequences (2,048 x 1, 4,096 x 1), with LoRA and once
as a full fine-tune (the whole non-expert part trained on the GPU). Each case runs with PyTorch's default
caching allocator or with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the setting the fix proposes),
both measured side by side in the same call.

Per case, in its own process tree (``ktdeploy train --skip-doctor``), with its own time budget, measured the
way bench/gpu/weight_scale.py measures: peak host RSS of the tree (every 0.25 s), nvidia-smi memory.used above
idle (every 0.2 s), torch's max_memory_allocated (LlamaFactory RECORD_VRAM=1) and max_memory_reserved (the run
record's metrics.jsonl, ktdeploy.agent.lf_entry). Results are written after every case, so a call cut short
still returns what it measured:

    $OUT/vocab_results.json     every case: figures, rss phases, the planner's figures at measurement time
    $OUT/gpu_peaks_vocab.json   {"runs": [...]} in bench/results/gpu_peaks.json's format (successful cases)
    $OUT/vocab_log.txt          this script's log;   $OUT/vocab_logs.tar.gz  every run's output and record

On the GPU machine (wheels from bench/gpu/fetch_wheels.py in WHEELS below, this checkout on PYTHONPATH):

    python3 bench/gpu/vocab_scale.py --setup --out "$OUT" --deadline 500

Here, CPU only: ``--list`` prints the cases, time estimates and planned figures; ``--dry-run`` also writes each
case's config.json and recipe and has `ktdeploy train --dry-run --skip-doctor` validate and render it.
The pure parts are unit-tested in tests/unit/core/sizing/test_vocab_scale.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import weight_scale as ws  # noqa: E402  (bench/gpu/weight_scale.py: Shape, TreeSampler, timeline, entries)

GIB = 2**30
T0 = time.monotonic()
WHEELS = Path(os.environ.get("VOCAB_SCALE_WHEELS") or REPO / "bench/gpu/.carry/wheels")
RECIPE = REPO / "recipes/tiny-moe-lora.yaml"
ALLOC = {"default": "expandable_segments:False", "expandable": "expandable_segments:True"}
LOG: list[str] = []


@dataclass(frozen=True)
class Body:
    """One model to build: the shared body with a vocabulary (and the expert count of the full-FT body)."""

    name: str
    vocab_size: int
    num_experts: int = 32
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768

    def shape(self, case: Case) -> ws.Shape:
        return ws.Shape(f"vs-{case.name}", 2048, 8, self.num_experts, self.num_experts_per_tok,
                        self.moe_intermediate_size, lora_rank=8 if case.finetuning == "lora" else 0,
                        cutoff_len=case.cutoff, batch=case.batch, vocab_size=self.vocab_size, fill=case.fill)


BODIES = {b.name: b for b in (
    Body("v152", 151_936),        # Qwen3 / Qwen3.5
    Body("v129", 129_280),        # DeepSeek-V3 / Kimi-K2 family
    Body("v32", 32_000),          # ~32k (Mixtral / Llama-2 size)
    Body("v152s", 151_936, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256),  # full FT: small experts
)}


@dataclass(frozen=True)
class Case:
    name: str
    body: str
    cutoff: int
    batch: int
    fill: bool                 # every sample longer than the cutoff: each batch holds cutoff x batch tokens
    alloc: str                 # key of ALLOC
    finetuning: str = "lora"
    steps: int = 3              # filled: the same shapes every step, so the peak is set by step 2

    @property
    def tokens(self) -> int:
        return self.cutoff * self.batch


# Priority order: a call cut short keeps the most informative cases. 1-2: the held-out run of the issue
# (Qwen vocabulary, 512 x 4 on the variable-length tiny_sft_long) without and with expandable segments;
# then the vocabularies and long sequences under the proposed setting; then default-allocator twins.
CASES = [
    Case("v152-var", "v152", 512, 4, False, "default", steps=6),
    Case("v152-var-es", "v152", 512, 4, False, "expandable", steps=6),
    Case("v152-f512-es", "v152", 512, 4, True, "expandable"),
    Case("v152-c4096-es", "v152", 4096, 1, True, "expandable"),
    Case("v32-f512-es", "v32", 512, 4, True, "expandable"),
    Case("v129-f512-es", "v129", 512, 4, True, "expandable"),
    Case("v152-c2048-es", "v152", 2048, 1, True, "expandable"),
    Case("v152-full-es", "v152s", 512, 4, True, "expandable", finetuning="full"),
    Case("v152-f512", "v152", 512, 4, True, "default"),
    Case("v152-c4096", "v152", 4096, 1, True, "default"),
    Case("v32-f512", "v32", 512, 4, True, "default"),
]
CASE_BY_NAME = {c.name: c for c in CASES}


def est_seconds(c: Case) -> float:
    """Wall time of one case, from the weight_scale runs (bench/results/gpu/weight_scale/*/weight_scale_results.json):
    launch to first step 31-43 s with the doctor (5.0-39.3 GB of experts: the load barely moves it), steps of the
    2.4 GB body ~1 s per 2048 tokens, ~4 s to save and exit; a full fine-tune also writes the whole model."""
    fixed = 40.0 if c.finetuning == "lora" else 55.0
    return fixed + c.steps * max(1.0, c.tokens / 2048) + 4.0


SRV = Path("/srv/ktdeploy")       # the recipe's volumes (models, data, output), as bench/gpu/gpu_bench.py uses


def sets(c: Case, model_dir: Path, out_root: Path) -> list[str]:
    """The recipe overrides of a case; a root other than /srv/ktdeploy (the CPU dry run) moves the volumes too."""
    s = BODIES[c.body].shape(c)
    root = out_root.parent
    vals = [] if root == SRV else [f"deploy.volumes.model={root / 'models'}", f"deploy.volumes.data={root / 'data'}",
                                   f"deploy.volumes.output={out_root}", f"train.dataset_dir={root / 'data'}"]
    vals += [f"train.output_dir={out_root / s.name}", f"train.model_name_or_path={model_dir}",
            f"train.max_steps={c.steps}", "train.include_num_input_tokens_seen=non_padding", "train.logging_steps=1",
            "train.save_steps=1000", "train.plot_loss=false", f"train.cutoff_len={c.cutoff}",
            f"train.per_device_train_batch_size={c.batch}", f"train.dataset={s.dataset}"]
    if c.finetuning == "lora":
        vals += ["train.lora_rank=8", "train.lora_alpha=16"]
    else:
        vals += ["train.save_strategy='no'"]     # no optimizer-state checkpoint; the final model is still written
    out = []
    for v in vals:
        out += ["--set", v]
    return out


def full_recipe(dest: Path) -> Path:
    """recipes/tiny-moe-lora.yaml as a full fine-tune: finetuning_type full, its LoRA fields removed (the
    recipe rules refuse LoRA fields on a full fine-tune)."""
    from ruamel.yaml import YAML

    from ktdeploy.core.recipe.catalog import LORA_FIELDS

    y = YAML(typ="safe", pure=True)
    doc = y.load(RECIPE.read_text())
    for k in LORA_FIELDS:
        doc["train"].pop(k, None)
    doc["train"]["finetuning_type"] = "full"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "tiny-moe-full.yaml"
    with path.open("w") as f:
        y.dump(doc, f)
    return path


def recipe_for(c: Case, work: Path) -> Path:
    return RECIPE if c.finetuning == "lora" else full_recipe(work / "vs-recipes")


def train_argv(c: Case, recipe: Path, model_dir: Path, out_root: Path, dry_run: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "ktdeploy", "train", str(recipe), *sets(c, model_dir, out_root),
            "--run-root", str(out_root / ".runs" / f"vs-{c.name}"), "--skip-doctor"]
    return argv + (["--dry-run", "--json"] if dry_run else [])


def case_env(c: Case, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(RECORD_VRAM="1", PYTHONUNBUFFERED="1", PYTORCH_CUDA_ALLOC_CONF=ALLOC[c.alloc])
    return env


def planned(c: Case, train: dict, accelerate: dict, config: dict) -> dict:
    """The planner's figures for the rendered YAMLs (the code carried in this call)."""
    from ktdeploy.core.sizing.calibration import upper_edges
    from ktdeploy.core.sizing.estimate import estimate
    from ktdeploy.core.sizing.model_config import parse_model_config

    p = estimate((train, accelerate), parse_model_config(config, source=c.name))
    return {"host_gib": round(p.host_memory_gib, 3), "gpu_gib": round(p.gpu_memory_gib_per_gpu, 3),
            "edges": {k: round(v, 3) for k, v in upper_edges(p).items()},
            "gpu_terms": {t.name: round(t.gib, 3) for t in p.terms("gpu")}}


def metrics_peaks(text: str) -> dict:
    """Torch's peaks from a run record's metrics.jsonl (lf_entry's RunMetrics rows), GiB; per step too."""
    alloc, reserved, per_step = 0, 0, []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "peak_gpu_mem_bytes" in row:
            alloc = max(alloc, row["peak_gpu_mem_bytes"])
            reserved = max(reserved, row.get("peak_gpu_reserved_bytes", 0))
            per_step.append([row.get("step"), round(row["peak_gpu_mem_bytes"] / GIB, 3),
                             round(row.get("peak_gpu_reserved_bytes", 0) / GIB, 3), row.get("tokens_seen")])
    return {"torch_alloc_gib": round(alloc / GIB, 3) if alloc else None,
            "torch_reserved_gib": round(reserved / GIB, 3) if reserved else None, "per_step": per_step}


def entry(c: Case, config: dict, m: dict, provenance: str) -> dict:
    """One gpu_peaks.json run (ws.peaks_entry) plus what this call adds: torch's reserved peak, the allocator
    setting and the fine-tuning type."""
    e = ws.peaks_entry(BODIES[c.body].shape(c), config, m["train"], m["accelerate"], m, provenance)
    e.update(peak_gpu_reserved_gib=m.get("torch_reserved_gib"), alloc_conf=ALLOC[c.alloc],
             finetuning=c.finetuning, case=asdict(c))
    if e["peak_gpu_mem_gib"] is None:
        e["peak_gpu_mem_gib"] = m.get("torch_alloc_gib")
    return e


def plan_cases(cases: list[Case], budget_s: float, spent_s: float = 0.0) -> tuple[list[Case], list[Case]]:
    """The cases that fit the budget in priority order (a case that does not fit is skipped, later smaller ones
    still run), and the skipped ones."""
    run, skip = [], []
    left = budget_s - spent_s
    for c in cases:
        if est_seconds(c) <= left:
            run.append(c)
            left -= est_seconds(c)
        else:
            skip.append(c)
    return run, skip


# ---------------------------------------------------------------- the GPU machine side

def say(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def setup() -> dict:
    py = sys.executable
    say("setup: uninstall upstream transformers/accelerate/peft/trl, install the carried wheels (--no-compile)")
    subprocess.run([py, "-m", "pip", "uninstall", "-y", "-q", "transformers", "accelerate", "peft", "trl"],
                   capture_output=True, timeout=120)
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {WHEELS}: run bench/gpu/fetch_wheels.py and carry them")
    p = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                        "--no-warn-conflicts", *wheels], capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise SystemExit("pip install failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])
    v = subprocess.run([py, "-c", "import importlib.metadata as m; print({d: m.version(d) for d in ['torch', "
                        "'transformers-kt', 'accelerate-kt', 'peft-kt', 'kt-kernel', 'llamafactory-kt']})"],
                       capture_output=True, text=True, timeout=120)
    say(f"versions: {v.stdout.strip()} {v.stderr.strip()[-300:]}")
    return {"versions": v.stdout.strip()}


def build_bodies(names: list[str], models: Path, data: Path, fills: list[int]) -> dict:
    """In this process (torch imported once): every body's tokenizer + random bf16 weights, the datasets."""
    import torch

    from ktdeploy.agent import tiny

    out = {}
    if not (data / "dataset_info.json").exists():
        tiny.build_dataset(data, 400)
    for cut in fills:
        ws.build_fill_dataset(data, cut)
    for n in names:
        b = BODIES[n]
        t = time.monotonic()
        d = models / f"vs-{n}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        tiny.build_tokenizer(d, b.vocab_size)
        size = tiny.TinySize(2048, 8, b.num_experts, b.num_experts_per_tok, b.moe_intermediate_size, 16, 4, 128,
                             b.vocab_size)
        cfg = tiny.build_model(d, size, device="cuda" if torch.cuda.is_available() else "cpu")
        torch.cuda.empty_cache()
        out[n] = {"config": cfg, "build_s": round(time.monotonic() - t, 1)}
        print(json.dumps({"built": n, "s": out[n]["build_s"]}), flush=True)
    return out


def gpu_used_mib() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return -1


def wait_gpu_idle(idle_mib: int, limit_s: float = 20.0) -> int:
    """Wait until the GPU is back near its idle use (the previous case's process has let go), at most limit_s."""
    t = time.monotonic()
    used = gpu_used_mib()
    while used > idle_mib + 64 and time.monotonic() - t < limit_s:
        time.sleep(0.5)
        used = gpu_used_mib()
    return used


def measure(c: Case, recipe: Path, model_dir: Path, out_root: Path, timeout: float, log_dir: Path) -> dict:
    from ruamel.yaml import YAML

    from bench.gpu.gpu_bench import GpuSampler, read_outputs

    name = f"vs-{c.name}"
    out_dir = out_root / name
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.rmtree(out_root / ".runs" / name, ignore_errors=True)
    gpu = GpuSampler(out_dir / "trainer_log.jsonl", interval=0.2)
    gpu.start()
    start, timed_out = None, False
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(train_argv(c, recipe, model_dir, out_root), cwd=str(REPO), env=case_env(c),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        rss = ws.TreeSampler(proc.pid)
        rss.start()
        try:
            while proc.poll() is None:
                if start is None and (out_dir / "trainer_log.jsonl").exists():
                    start = time.monotonic() - rss.t0
                if time.monotonic() - rss.t0 > timeout:
                    timed_out = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(8)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait(5)
                    break
                time.sleep(0.25)
        finally:
            rss.done.set()
            rss.join()
            gpu_peak = gpu.stop()
    wall = time.monotonic() - rss.t0
    phases = ws.summarize_timeline(rss.samples, start)
    res: dict = {"name": c.name, "rc": proc.returncode, "timed_out": timed_out, "wall_s": round(wall, 1),
                 "peak_host_rss_gib": phases["peak_gib"], "peak_gpu_used_gib_nvsmi": round(gpu_peak, 3),
                 "gpu_idle_base_mib": gpu.base, "rss_phases": phases, "rss_timeline": ws.thin(rss.samples),
                 **read_outputs(out_dir)}
    runs = sorted((out_root / ".runs" / name).glob("*"))
    if runs:
        rd = runs[-1]
        y = YAML(typ="safe", pure=True)
        if (rd / "train.yaml").exists():
            res["train"] = y.load((rd / "train.yaml").read_text())
            res["accelerate"] = y.load((rd / "accelerate.yaml").read_text())
        if (rd / "metrics.jsonl").exists():
            res.update(metrics_peaks((rd / "metrics.jsonl").read_text()))
        res["run_dir"] = str(rd)
    if res.get("peak_gpu_alloc_gib") is None:
        res["peak_gpu_alloc_gib"] = res.get("torch_alloc_gib")
    return res


def write_outputs(out: Path, doc: dict, entries: list[dict], log_dir: Path, out_root: Path) -> None:
    (out / "vocab_results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "gpu_peaks_vocab.json").write_text(json.dumps({"runs": entries}, indent=2) + "\n")
    (out / "vocab_log.txt").write_text("\n".join(LOG) + "\n")
    with tarfile.open(out / "vocab_logs.tar.gz.part", "w:gz") as tar:
        if log_dir.exists():
            tar.add(log_dir, arcname="logs")
        for rd in sorted((out_root / ".runs").glob("vs-*/*")):
            for f in rd.iterdir():
                if f.is_file() and f.stat().st_size < 4 * 2**20:
                    tar.add(f, arcname=f"runs/{rd.parent.name}/{f.name}")
    os.replace(out / "vocab_logs.tar.gz.part", out / "vocab_logs.tar.gz")


def run_device(cases: list[Case], out: Path, work: Path, deadline: float, do_setup: bool) -> int:
    """``work``: the volumes' root (models/, data/, output/ under it, as the recipe's deploy.volumes say)."""
    out.mkdir(parents=True, exist_ok=True)
    models, out_root, log_dir = work / "models", work / "output", work / "vs-logs"
    doc: dict = {"how": "python3 bench/gpu/vocab_scale.py --setup (device tool, nvidia-h200)", "cases": [],
                 "planned_order": [c.name for c in cases], "skipped": []}
    entries: list[dict] = []
    try:
        if do_setup:
            doc["setup"] = setup()
        machine = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
        doc["machine"] = machine
        bodies = sorted({c.body for c in cases})
        fills = sorted({c.cutoff for c in cases if c.fill})
        say(f"build bodies {bodies}, fill datasets {fills}")
        b = subprocess.run([sys.executable, __file__, "--build", ",".join(bodies), "--work", str(work),
                            "--fills", ",".join(map(str, fills))], cwd=str(REPO), capture_output=True, text=True,
                           timeout=max(60.0, deadline - (time.monotonic() - T0) - 30))
        say(f"build rc={b.returncode} {b.stdout.strip()[-600:]} {b.stderr.strip()[-1500:] if b.returncode else ''}")
        if b.returncode:
            raise RuntimeError("model build failed")
        configs = {n: json.loads((models / f"vs-{n}" / "config.json").read_text()) for n in bodies}
        idle = gpu_used_mib()
        doc["gpu_idle_mib"] = idle
        for c in cases:
            left = deadline - (time.monotonic() - T0)
            est = est_seconds(c)
            if left < est + 5:
                say(f"skip {c.name}: {left:.0f} s left, needs ~{est:.0f} s")
                doc["skipped"].append(c.name)
                continue
            used = wait_gpu_idle(idle)
            recipe = recipe_for(c, work)
            timeout = min(est * 1.8, left - 5)
            say(f"run {c.name} (alloc {ALLOC[c.alloc]}, {c.finetuning}, {c.cutoff}x{c.batch}, "
                f"{'filled' if c.fill else 'tiny_sft_long'}), budget {timeout:.0f} s, gpu before {used} MiB")
            m = measure(c, recipe, models / f"vs-{c.body}", out_root, timeout, log_dir)
            if m.get("train"):
                m["planned"] = planned(c, m["train"], m["accelerate"], configs[c.body])
            say(f"  -> rc={m['rc']} timed_out={m['timed_out']} wall={m['wall_s']} s host={m['peak_host_rss_gib']} "
                f"nvsmi={m['peak_gpu_used_gib_nvsmi']} alloc={m.get('peak_gpu_alloc_gib')} "
                f"reserved={m.get('torch_reserved_gib')} tokens={m.get('tokens')} steps={m.get('steps')} "
                f"planned={m.get('planned', {}).get('host_gib')}/{m.get('planned', {}).get('gpu_gib')}")
            doc["cases"].append({k: v for k, v in m.items() if k not in ("train", "accelerate")})
            if m["rc"] == 0 and not m["timed_out"] and m.get("train") and m["peak_host_rss_gib"] \
                    and m["peak_gpu_used_gib_nvsmi"]:
                prov = (f"bench/gpu/vocab_scale.py case {c.name} on the GPU machine ({machine}, "
                        f"{time.strftime('%Y-%m-%d', time.gmtime())}): random bf16 Qwen3-MoE built by "
                        "ktdeploy.agent.tiny, trained through `ktdeploy train --skip-doctor` with "
                        f"PYTORCH_CUDA_ALLOC_CONF={ALLOC[c.alloc]}; host = process-tree RSS every 0.25 s; GPU = "
                        "nvidia-smi memory.used above idle (torch max allocated and reserved beside it)")
                entries.append(entry(c, configs[c.body], m, prov))
            write_outputs(out, doc, entries, log_dir, out_root)
    except Exception:
        import traceback

        doc["error"] = traceback.format_exc()
        say(f"ERROR {doc['error'][-800:]}")
    finally:
        doc["wall_s"] = round(time.monotonic() - T0, 1)
        write_outputs(out, doc, entries, log_dir, out_root)
        say(f"done: {len(entries)} entries in {doc['wall_s']} s")
    return 0


def dry_run(cases: list[Case], work: Path) -> int:
    """CPU check: each case's config.json (no weights) and recipe; `ktdeploy train --dry-run` validates and
    renders it; prints the planner's figures for the rendered YAMLs."""
    from ruamel.yaml import YAML

    y = YAML(typ="safe", pure=True)
    bad = 0
    for c in cases:
        body = BODIES[c.body]
        d = work / "models" / f"vs-{c.body}"
        d.mkdir(parents=True, exist_ok=True)
        (work / "data").mkdir(exist_ok=True)
        cfg = body.shape(c).config_dict()
        (d / "config.json").write_text(json.dumps(cfg))
        p = subprocess.run(train_argv(c, recipe_for(c, work), d, work / "output", dry_run=True), cwd=str(REPO),
                           capture_output=True, text=True, env=case_env(c), timeout=120)
        if p.returncode:
            bad += 1
            print(f"{c.name}: rc {p.returncode}\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
            continue
        plan = json.loads(p.stdout)
        train, acc = y.load(plan["train_yaml"]), y.load(plan["accelerate_yaml"])
        pl = planned(c, train, acc, cfg)
        print(f"{c.name:14} ok  {train['finetuning_type']:4} {train['cutoff_len']}x{train['per_device_train_batch_size']}"
              f" {train['dataset']:14} est {est_seconds(c):3.0f} s  planned host {pl['host_gib']:6.2f} GiB  "
              f"gpu {pl['gpu_gib']:6.2f} GiB")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all, in priority order)")
    ap.add_argument("--list", action="store_true", help="print the cases, estimates and the plan for --deadline")
    ap.add_argument("--dry-run", action="store_true", help="CPU check: validate and render every case")
    ap.add_argument("--setup", action="store_true", help="install the carried wheels first")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/vocab-scale")))
    ap.add_argument("--work", type=Path, default=SRV, help="the volumes' root: models/, data/, output/")
    ap.add_argument("--deadline", type=float, default=500.0, help="seconds from start for the whole command")
    ap.add_argument("--build", default="", help=argparse.SUPPRESS)      # internal: build these bodies
    ap.add_argument("--fills", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.build:
        build_bodies(a.build.split(","), a.work / "models", a.work / "data",
                     [int(x) for x in a.fills.split(",") if x])
        return 0
    cases = [CASE_BY_NAME[n] for n in a.cases.split(",") if n] if a.cases else CASES
    if a.list:
        run, skip = plan_cases(cases, a.deadline, spent_s=30 + 15 + 10 * len({c.body for c in cases}))
        for c in cases:
            print(f"{c.name:14} {c.body:5} {c.cutoff:5}x{c.batch} {'fill' if c.fill else 'var ':4} {c.alloc:10} "
                  f"{c.finetuning:4} {c.steps} steps ~{est_seconds(c):3.0f} s {'' if c in run else 'SKIP'}")
        return 0
    if a.dry_run:
        return dry_run(cases, a.work)
    return run_device(cases, a.out, a.work, a.deadline, a.setup)


if __name__ == "__main__":
    sys.exit(main())
