#!/usr/bin/env python3
"""GPU proof of ktdeploy on a bare GPU machine (no docker, no internet): one command, one device call.

    bash bench/gpu/device.sh smoke|full        # (sets PYTHONPATH, OUT)

Everything it needs travels with the repo: the slimmed KT SFT wheels in bench/gpu/.carry/wheels
(built here by bench/gpu/fetch_wheels.py from the image lock's versions). On the machine it
  1. removes upstream transformers/accelerate/peft/trl and installs the carried wheels (--no-deps);
  2. [smoke] captures golden command outputs for the doctor's parsers (tests/golden/gpu-h200-vm);
  3. builds tiny random Qwen3-MoE models, a byte-level BPE tokenizer and a synthetic dataset locally;
  4. runs `ktdeploy train recipes/tiny-moe-lora.yaml` (validate -> doctor -> render -> launch),
     `ktdeploy convert`, and bench/gpu/check_adapter.py (the numeric check of the converted adapter);
  5. [full] measures side by side: ktdeploy train vs the same LlamaFactory run launched by hand;
     the derived kt_num_threads vs a sweep of hand settings; KT vs plain LlamaFactory GPU memory;
     and peak host RSS / GPU memory at three model sizes for the planner (gpu_peaks.json).
Every run is sampled the same way from outside (process-tree RSS from /proc every 0.2 s, GPU memory
used from nvidia-smi every 0.2 s) and read back the same way (LlamaFactory's trainer_state.json,
train_results.json and trainer_log.jsonl with RECORD_VRAM=1 = torch.cuda.max_memory_allocated).
Results go to $OUT as a few files (the device tool returns at most 8).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ktdeploy.agent.monitor import run_streaming  # noqa: E402

RECIPE = REPO / "recipes/tiny-moe-lora.yaml"
SRV = Path("/srv/ktdeploy")
MODELS, DATA, OUTPUT = SRV / "models", SRV / "data", SRV / "output"
WHEELS = REPO / "bench/gpu/.carry/wheels"
PY = sys.executable
T0 = time.monotonic()
GPU_POLL_S = 0.2   # nvidia-smi sampling period of measured(); a bench of ktdeploy's own cost raises it
LOG: list[str] = []


def say(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def sh(cmd: list[str] | str, timeout: float = 300, check: bool = False, env=None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


# ---------------------------------------------------------------- setup
def setup() -> dict:
    say("setup: uninstall upstream transformers/accelerate/peft/trl, install carried wheels")
    sh([PY, "-m", "pip", "uninstall", "-y", "transformers", "accelerate", "peft", "trl"], timeout=120)
    wheels = sorted(glob.glob(str(WHEELS / "*.whl")))
    if not wheels:
        raise SystemExit(f"no wheels in {WHEELS}: run bench/gpu/fetch_wheels.py here and carry bench/gpu/.carry")
    p = sh([PY, "-m", "pip", "install", "--no-deps", "--no-index", "--no-warn-conflicts", *wheels], timeout=300)
    if p.returncode != 0:
        raise SystemExit("pip install failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])
    code = ("import importlib.metadata as m, torch, transformers, accelerate, peft, trl, kt_kernel, llamafactory;"
            "print({d: m.version(d) for d in ['torch','transformers-kt','accelerate-kt','peft-kt','trl-kt',"
            "'kt-kernel','llamafactory-kt','tokenizers','datasets']})")
    v = sh([PY, "-c", code], timeout=120)
    say(f"versions: {v.stdout.strip()} {v.stderr.strip()[-500:]}")
    return {"versions": v.stdout.strip(), "python": platform.python_version()}


# ---------------------------------------------------------------- golden outputs for the doctor
def golden(dest: Path) -> None:
    say("golden: capturing command outputs")
    dest.mkdir(parents=True, exist_ok=True)
    cmds = {
        "proc_cpuinfo.txt": "cat /proc/cpuinfo",
        "lscpu.json": "lscpu -J",
        "nvidia_smi_query.csv": "nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,uuid "
                                "--format=csv,noheader,nounits",
        "proc_meminfo.txt": "cat /proc/meminfo",
        "uname_r.txt": "uname -r",
        "systemd_detect_virt.txt": "systemd-detect-virt",
        "nproc.txt": "nproc",
        "os_release.txt": "cat /etc/os-release",
    }
    src = ["# Golden outputs from the GPU machine (device tool, kind nvidia-h200)", "",
           f"Captured by `bash bench/gpu/device.sh smoke` (bench/gpu/gpu_bench.py golden()) on "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, as root, outside any container.", "",
           "| file | command | exit code |", "| --- | --- | --- |"]
    for name, cmd in cmds.items():
        p = sh(cmd, timeout=60)
        (dest / name).write_text(p.stdout if p.stdout else p.stderr)
        src.append(f"| {name} | `{cmd}` | {p.returncode} |")
    cc = shutil.which("gcc") or shutil.which("cc")
    probe = REPO / "ktdeploy/probes/amx_probe.c"
    if cc and probe.exists():
        b = sh([cc, "-O1", "-o", "/tmp/amx_probe", str(probe)], timeout=120)
        p = sh(["/tmp/amx_probe"], timeout=60) if b.returncode == 0 else b
        (dest / "amx_probe.json").write_text(p.stdout or p.stderr)
        src.append(f"| amx_probe.json | `{os.path.basename(cc)} -O1 -o amx_probe ktdeploy/probes/amx_probe.c && "
                   f"./amx_probe` | {p.returncode} |")
    else:
        src.append(f"| amx_probe.json | not captured: compiler {cc!r}, probe present {probe.exists()} | - |")
    p = sh([PY, "-m", "ktdeploy", "doctor", "--json"], timeout=300)
    how = "python3 -m ktdeploy doctor --json"
    if "No such command" in (p.stderr + p.stdout):  # CLI command not registered yet: same function, called directly
        how = "python3 -c 'doctor(LocalConnector()).to_json()' (ktdeploy.controller.doctor)"
        p = sh([PY, "-c", "import json; from ktdeploy.controller.doctor import doctor; from ktdeploy.controller.connectors import "
                          "LocalConnector; print(json.dumps(doctor(LocalConnector()).to_json(), indent=2))"], timeout=300)
    (dest / "doctor.json").write_text(p.stdout or p.stderr)
    src.append(f"| doctor.json | `{how}` | {p.returncode} |")
    src += ["", f"gcc: {cc}; python: {PY} {platform.python_version()}"]
    (dest / "SOURCE.md").write_text("\n".join(src) + "\n")


# ---------------------------------------------------------------- tiny models
def build_model(size: str, model_dir: Path, samples: int = 400) -> dict:
    if (model_dir / "config.json").exists():
        return json.loads((model_dir / "config.json").read_text())
    say(f"build tiny model {size} -> {model_dir}")
    p = sh([PY, "-m", "ktdeploy", "tiny-model", str(model_dir), "--data-dir", str(DATA), "--size", size,
            "--samples", str(samples), "--overwrite"], timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"tiny-model failed: {p.stdout[-2000:]} {p.stderr[-3000:]}")
    return json.loads((model_dir / "config.json").read_text())


# ---------------------------------------------------------------- measuring one run
class GpuSampler(threading.Thread):
    """nvidia-smi memory.used every 0.2 s, and the arrival time of each line LlamaFactory appends to
    trainer_log.jsonl (polled every 0.05 s): a launcher-independent clock for steady-state tokens/s."""

    def __init__(self, trainer_log: Path | None = None, interval: float = 0.2):
        super().__init__(daemon=True)
        self.interval, self.peak, self.base = interval, 0, self._used()
        self._halt = threading.Event()
        self.log_path, self.log_pos, self.log_rows = trainer_log, 0, []

    @staticmethod
    def _used() -> int:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.strip().splitlines()[0])
        except Exception:
            return 0

    def _poll_log(self) -> None:
        p = self.log_path
        if p is None or not p.exists() or p.stat().st_size <= self.log_pos:
            return
        now = time.monotonic()
        with p.open() as f:
            f.seek(self.log_pos)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.log_pos += len(complete.encode())
        for line in complete.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.log_rows.append((now, row.get("current_steps"), row.get("total_tokens")))

    def run(self):
        last_gpu = 0.0
        while not self._halt.is_set():
            if time.monotonic() - last_gpu >= self.interval:
                self.peak = max(self.peak, self._used())
                last_gpu = time.monotonic()
            self._poll_log()
            self._halt.wait(0.05)

    def steady_tokens_per_s(self, skip: int = 1):
        rows = [r for r in self.log_rows if r[1] is not None and r[2]]
        rows = [r for r in rows if r[1] > skip]
        if len(rows) < 3:
            return None, 0
        (t0, s0, k0), (t1, s1, k1) = rows[0], rows[-1]
        return (round((k1 - k0) / (t1 - t0), 1) if t1 > t0 else None), s1 - s0

    def median_step_tokens_per_s(self, skip: int = 1):
        """Tokens per step over the median step interval: one stalled step (a GC, a neighbour on the VM)
        moves it far less than the first-to-last rate."""
        rows = [r for r in self.log_rows if r[1] is not None and r[2] and r[1] > skip]
        rates = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in itertools.pairwise(rows) if b[0] > a[0] and b[2] > a[2]]
        return round(statistics.median(rates), 1) if len(rates) >= 2 else None

    def stop(self) -> float:
        self._halt.set()
        self.join(5)
        return max(0, self.peak - self.base) / 1024  # GiB above the idle baseline


def read_outputs(out_dir: Path) -> dict:
    res: dict = {}
    st = out_dir / "trainer_state.json"
    tr = out_dir / "train_results.json"
    if st.exists():
        s = json.loads(st.read_text())
        losses = [h["loss"] for h in s.get("log_history", []) if "loss" in h]
        res["loss_first"], res["loss_last"] = (losses[0], losses[-1]) if losses else (None, None)
        res["tokens"] = s.get("num_input_tokens_seen") or max(
            [h.get("num_input_tokens_seen", 0) for h in s.get("log_history", [])] or [0])
        res["steps"] = s.get("global_step")
    if tr.exists():
        t = json.loads(tr.read_text())
        res["train_runtime_s"] = t.get("train_runtime")
    if res.get("tokens") and res.get("train_runtime_s"):
        res["tokens_per_s"] = round(res["tokens"] / res["train_runtime_s"], 1)
    vram = []
    tl = out_dir / "trainer_log.jsonl"
    if tl.exists():
        for line in tl.read_text().splitlines():
            try:
                vram.append(json.loads(line).get("vram_allocated") or 0)
            except json.JSONDecodeError:
                pass
    res["peak_gpu_alloc_gib"] = max(vram) if vram else None
    res["artifacts"] = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    return res


SNAPSHOT_AT_S: float | None = None   # a bench that hunts a launcher difference sets it (overhead.py: P1_SNAPSHOT)


def trainer_processes(marks: tuple[str, ...] = ("lf_entry", "llamafactory.launcher")) -> list[tuple[str, str]]:
    """(pid, command line) of each training process: one whose command names a mark, not accelerate's launcher."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = b" ".join((d / "cmdline").read_bytes().split(b"\0")).decode(errors="replace")
        except OSError:
            continue
        if any(m in text for m in marks) and "accelerate.commands.launch" not in text:
            found.append((d.name, text))
    return found


def _trainer_snapshot() -> dict:
    """What a process inherits across exec and what runs beside it: the process table (CPU, nice, class) and,
    for each training process (lf_entry / llamafactory.launcher, not accelerate's launcher), its /proc status
    lines, scheduling, limits, cgroup, timer slack and environment names."""
    snap: dict = {"ps": sh("ps -eo pid,ppid,ni,cls,pri,psr,pcpu,rss,nlwp,stat,args --sort=-pcpu | head -30").stdout}
    keys = ("Cpus_allowed_list", "Mems_allowed_list", "THP_enabled", "NoNewPrivs", "Seccomp", "Threads",
            "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "SigIgn", "SigBlk", "CapEff", "VmRSS")
    for pid, text in trainer_processes():
        d = Path("/proc") / pid
        info: dict = {"cmd": text[:200]}
        try:
            info["status"] = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip()
                              for ln in (d / "status").read_text().splitlines() if ln.split(":", 1)[0] in keys}
            info["sched"] = [ln for ln in (d / "sched").read_text().splitlines()
                             if ln.startswith(("policy", "prio", "nr_involuntary", "nr_voluntary", "nr_migrations"))]
            info["limits"] = (d / "limits").read_text()
            info["cgroup"] = (d / "cgroup").read_text()
            info["timerslack_ns"] = (d / "timerslack_ns").read_text().strip()
            info["oom_score_adj"] = (d / "oom_score_adj").read_text().strip()
            info["cwd"] = os.readlink(d / "cwd")
            info["env"] = sorted({e.split(b"=", 1)[0].decode(errors="replace")
                                  for e in (d / "environ").read_bytes().split(b"\0") if e})
            info["fds"] = len(list((d / "fd").iterdir()))
            info["numa_maps_policies"] = sorted({ln.split()[1] for ln in (d / "numa_maps").read_text().splitlines()
                                                 if len(ln.split()) > 1})
        except OSError as err:
            info["error"] = str(err)
        snap[pid] = info
    snap["meminfo"] = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.split(":")[0] in ("MemFree", "Cached", "Dirty", "Writeback", "AnonHugePages",
                                               "HugePages_Total", "HugePages_Free")}
    snap["loadavg"] = Path("/proc/loadavg").read_text().strip()
    return snap


def measured(name: str, argv: list[str], out_dir: Path, log_dir: Path, timeout: float, env=None,
             cwd: Path = REPO) -> dict:
    say(f"run {name}: {' '.join(argv)[:300]}")
    log_dir.mkdir(parents=True, exist_ok=True)
    gpu = GpuSampler(out_dir / "trainer_log.jsonl", interval=GPU_POLL_S)
    gpu.start()
    snapshot: dict = {}
    if SNAPSHOT_AT_S is not None:
        def take() -> None:
            if not done.wait(SNAPSHOT_AT_S):
                snapshot.update(_trainer_snapshot())
        done = threading.Event()
        threading.Thread(target=take, daemon=True).start()
    full_env = {**os.environ, "RECORD_VRAM": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    o = run_streaming(argv, env=full_env, cwd=str(cwd), log_path=log_dir / f"{name}.log", echo=None,
                      timeout=timeout)
    if SNAPSHOT_AT_S is not None:
        done.set()
    gpu_peak = gpu.stop()
    gpu._poll_log()
    steady, nsteps = gpu.steady_tokens_per_s()
    median_step = gpu.median_step_tokens_per_s()
    res = {"name": name, "rc": o.rc, "wall_s": round(o.wall_s, 1), "peak_host_rss_gib": round(o.peak_rss_gib, 3),
           "peak_gpu_used_gib_nvsmi": round(gpu_peak, 3), "steady_tokens_per_s": steady, "steady_steps": nsteps,
           "median_step_tokens_per_s": median_step,
           "step_arrivals": [(round(t - gpu.log_rows[0][0], 3), st, tok) for t, st, tok in gpu.log_rows][:64]
           if gpu.log_rows else [],
           **read_outputs(out_dir)}
    if snapshot:
        res["snapshot"] = snapshot
    if o.rc != 0:
        res["tail"] = o.tail[-25:]
    say(f"  -> rc={o.rc} wall={o.wall_s:.0f}s tok/s steady={steady} whole={res.get('tokens_per_s')} rss={o.peak_rss_gib:.2f}GiB "
        f"gpu_alloc={res.get('peak_gpu_alloc_gib')} nvsmi={gpu_peak:.2f} loss {res.get('loss_first')}->"
        f"{res.get('loss_last')}")
    if o.rc != 0:
        say("  tail: " + " | ".join(o.tail[-12:]))
    return res


def common_sets(name: str, model: Path, steps: int, extra: list[str] = ()) -> list[str]:
    sets = [f"train.output_dir={OUTPUT / name}", f"train.model_name_or_path={model}", f"train.max_steps={steps}",
            "train.include_num_input_tokens_seen=non_padding", "train.logging_steps=1", "train.save_steps=1000",
            "train.plot_loss=false", *extra]
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def ktdeploy_train(name: str, model: Path, steps: int, log_dir: Path, timeout: float, extra: list[str] = (),
                   probe: bool = False, skip_doctor: bool = False, args: list[str] = (),
                   env_extra: dict | None = None, wrap: list[str] = (), recipe: Path = RECIPE) -> dict:
    """`ktdeploy train` measured; ``extra`` are --set values, ``args`` further options (e.g. --tuned FILE);
    ``wrap`` goes before the argv (a profiler)."""
    env = dict(env_extra or {})
    if probe:
        env.update({"KTDEPLOY_PROBE_PROMPTS": str(DATA / "heldout_prompts.json"),
                    "KTDEPLOY_PROBE_OUT": str(OUTPUT / f"{name}.probe_logits.safetensors")})
    argv = [PY, "-m", "ktdeploy", "train", str(recipe), *common_sets(name, model, steps, extra),
            "--run-root", str(OUTPUT / ".runs" / name)]
    if skip_doctor:
        argv.append("--skip-doctor")
    argv = [*wrap, *argv, *args]
    res = measured(name, argv, OUTPUT / name, log_dir, timeout, env)
    runs = sorted((OUTPUT / ".runs" / name).glob("*"))
    if runs:
        rd = runs[-1]
        res["run_dir"] = str(rd)
        res["run_dir_files"] = sorted(f"{p.relative_to(rd)} {p.stat().st_size}" for p in rd.rglob("*") if p.is_file())
        for f in ("command.json", "summary.json"):
            if (rd / f).exists():
                res[f.split(".")[0]] = json.loads((rd / f).read_text())
        if (rd / "train.yaml").exists():
            res["train_yaml"] = (rd / "train.yaml").read_text()
            res["accelerate_yaml"] = (rd / "accelerate.yaml").read_text()
    return res


def hand_train(name: str, like: dict, log_dir: Path, timeout: float, plain: bool = False,
               cwd: Path = REPO) -> dict:
    """The same LlamaFactory run launched by hand: the rendered YAMLs, LlamaFactory's own launcher."""
    from ruamel.yaml import YAML

    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    train = y.load(like["train_yaml"])
    train["output_dir"] = str(OUTPUT / name)
    if plain:  # plain LlamaFactory: no KT at all
        for k in [k for k in train if k.startswith("kt_") or k == "use_kt"]:
            del train[k]
    d = OUTPUT / ".hand" / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "train.yaml", "w") as f:
        y.dump(train, f)
    (d / "accelerate.yaml").write_text(like["accelerate_yaml"])
    argv = [PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--config_file",
            str(d / "accelerate.yaml"), "-m", "llamafactory.launcher", str(d / "train.yaml")]
    res = measured(name, argv, OUTPUT / name, log_dir, timeout, {"CUDA_VISIBLE_DEVICES": "0"}, cwd=cwd)
    res["train"] = train
    return res


def threads_of(res: dict) -> tuple:
    y = res.get("train_yaml") or ""
    import re

    t = re.search(r"kt_num_threads:\s*(\d+)", y)
    p = re.search(r"kt_threadpool_count:\s*(\d+)", y)
    return (int(t.group(1)) if t else None, int(p.group(1)) if p else None)


# ---------------------------------------------------------------- proof: train -> convert -> check
def proof(work: Path, steps: int, timeout: float) -> dict:
    model = MODELS / "tiny-qwen3-moe"
    build_model("small", model)
    name = "proof-small"
    extra = ["train.learning_rate=2.0e-3", "train.warmup_ratio=0.0"]
    r = ktdeploy_train(name, model, steps, work / "logs", timeout, extra=extra, probe=True)
    out = {"train": r}
    if r["rc"] != 0 and any("CheckFailed" in line for line in r.get("tail", [])):
        say("doctor blocked the run; recording it and retrying with --skip-doctor")
        out["doctor_blocked"] = r
        shutil.rmtree(OUTPUT / name, ignore_errors=True)
        r = out["train"] = ktdeploy_train(name, model, steps, work / "logs", timeout, extra=extra, probe=True,
                                          skip_doctor=True)
    if r["rc"] != 0:
        return out
    err = OUTPUT / f"{name}.probe_logits.safetensors.error"
    if err.exists():
        out["probe_error"] = err.read_text()
        say(f"probe failed: {out['probe_error']}")
    adapter = OUTPUT / f"{name}-sglang"
    c = sh([PY, "-m", "ktdeploy", "convert", str(OUTPUT / name), "-o", str(adapter), "--json"], timeout=300)
    say(f"convert rc={c.returncode} {c.stdout[-600:]} {c.stderr[-1500:]}")
    out["convert"] = {"rc": c.returncode, "stdout": c.stdout[-4000:], "stderr": c.stderr[-3000:]}
    if c.returncode == 0:
        chk = sh([PY, str(REPO / "bench/gpu/check_adapter.py"), "--model", str(model), "--adapter", str(adapter),
                  "--probe", str(OUTPUT / f"{name}.probe_logits.safetensors"), "-o", str(work / "adapter_check.json")],
                 timeout=300)
        say(f"check rc={chk.returncode} {chk.stdout[-1500:]} {chk.stderr[-1500:]}")
        out["check"] = json.loads((work / "adapter_check.json").read_text()) if (work / "adapter_check.json").exists() \
            else {"rc": chk.returncode, "stderr": chk.stderr[-3000:]}
        for f in ("kt_adapter_manifest.json", "adapter_config.json"):
            p = OUTPUT / name / f
            if p.exists():
                out[f] = json.loads(p.read_text())
        out["converted_config"] = json.loads((adapter / "adapter_config.json").read_text())
    return out


# ---------------------------------------------------------------- main
def main(experiments: dict | None = None) -> int:
    """``experiments`` maps further modes to ``fn(work, budget, t0) -> dict``: bench/gpu/full_runs.py passes
    its full and repeat runs (it imports this module, never the other way round)."""
    experiments = experiments or {}
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["smoke", *experiments])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/ktdeploy-gpu-out"))
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole command")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ktdeploy-bench")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    results: dict = {"mode": args.mode, "how": f"bash bench/gpu/device.sh {args.mode} (device tool, nvidia-h200)",
                     "machine": {}}
    try:
        results["setup"] = setup()
        results["machine"] = {"nproc": os.cpu_count(), "gpu": sh("nvidia-smi --query-gpu=name,memory.total,driver_version"
                                                                 " --format=csv,noheader").stdout.strip(),
                              "kernel": platform.release()}
        if args.mode == "smoke":
            golden(work / "golden")
            results["proof"] = proof(work, steps=40, timeout=240)
            # a first look at the thread count on the medium model (informs derive_threads)
            med = MODELS / "tiny-medium"
            build_model("medium", med)
            sweep = []
            for t in (4, 8, 12):
                if time.monotonic() - T0 > args.budget - 60:
                    break
                sweep.append(ktdeploy_train(f"smoke-threads-{t}", med, 8, work / "logs", 120,
                                            extra=[f"train.kt_config.kt_num_threads={t}",
                                                   "train.kt_config.kt_threadpool_count=1"], skip_doctor=True))
            results["thread_probe"] = sweep
        else:
            results.update(experiments[args.mode](work, args.budget, T0))
    except Exception as err:  # keep whatever was measured
        import traceback

        results["error"] = traceback.format_exc()
        say(f"ERROR {err}")
    finally:
        results["wall_s"] = round(time.monotonic() - T0, 1)
        (work / "results.json").write_text(json.dumps(results, indent=2, default=str))
        (work / "bench_log.txt").write_text("\n".join(LOG) + "\n")
        shutil.copy(work / "results.json", out / f"gpu_{args.mode}_results.json")
        shutil.copy(work / "bench_log.txt", out / f"gpu_{args.mode}_log.txt")
        with tarfile.open(out / f"gpu_{args.mode}_files.tar.gz", "w:gz") as tar:
            for sub in ("golden", "logs", "adapter_check.json"):
                if (work / sub).exists():
                    tar.add(work / sub, arcname=sub)
            for rd in glob.glob(str(OUTPUT / ".runs" / "*" / "*")):
                tar.add(rd, arcname="runs/" + "/".join(Path(rd).parts[-2:]))
            for name in ("proof-small",):
                for f in ("adapter_config.json", "kt_adapter_manifest.json", "trainer_state.json",
                          "train_results.json", "trainer_log.jsonl"):
                    p = OUTPUT / name / f
                    if p.exists():
                        tar.add(p, arcname=f"outputs/{name}/{f}")
                p = OUTPUT / f"{name}-sglang"
                for f in ("adapter_config.json", "ktdeploy_convert.json"):
                    if (p / f).exists():
                        tar.add(p / f, arcname=f"outputs/{name}-sglang/{f}")
    say(f"done in {time.monotonic() - T0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
