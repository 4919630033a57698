"""`ktdeploy train --exec`: the process becomes the launcher (same pid, no ktdeploy parent left), and the
trainer-side entry point (lf_entry.finish) writes rc, status and summary.json into the run record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Stands in for `accelerate launch -m ktdeploy.agent.lf_entry`: it writes what the RunMetrics callback writes,
# then ends the way lf_entry.main does (finish(rc)).
TRAINER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from ktdeploy.agent import lf_entry
    d = Path(os.environ["KTDEPLOY_RUN_DIR"])
    Path(sys.argv[1]).write_text(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(),
                                             "cuda_cache": os.environ.get("CUDA_CACHE_PATH")}))
    with open(os.environ["KTDEPLOY_METRICS"], "a") as f:
        for i in range(1, 5):
            f.write(json.dumps({"step": i, "time": i, "step_s": 0.5, "tokens_seen": 100 * i}) + "\\n")
    block = bytearray(64 * 2**20)  # a 64 MiB peak the summary must see
    lf_entry.finish(int(sys.argv[2]))
""")

LAUNCH = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from ktdeploy.agent.train import TrainPlan, execute
    tmp = Path(sys.argv[1])
    run_dir = tmp / "runs" / "r1"
    run_dir.parent.mkdir(parents=True)
    (tmp / "out").mkdir()
    plan = TrainPlan(recipe_path="r.yaml", output_dir=str(tmp / "out"), run_dir=str(run_dir),
                     argv=[sys.executable, "-c", sys.argv[2], str(tmp / "seen.json"), sys.argv[3]],
                     env={"KTDEPLOY_METRICS": str(run_dir / "metrics.jsonl")}, derived={}, resume_from=None,
                     train_yaml="a: 1\\n", accelerate_yaml="b: 2\\n", launch_sh="#!/bin/sh\\n")
    (tmp / "launcher.json").write_text(json.dumps({"pid": os.getpid()}))
    execute(plan, echo=None, exec_launch=True)
    raise SystemExit("execute(exec_launch=True) returned")
""")


def _run(tmp_path: Path, rc: int, cuda_cache: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CUDA_CACHE_PATH", None)
    if cuda_cache:
        env["CUDA_CACHE_PATH"] = cuda_cache
    return subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path), TRAINER, str(rc)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_exec_replaces_the_ktdeploy_process_and_the_trainer_writes_the_record(tmp_path):
    p = _run(tmp_path, 0)
    assert p.returncode == 0, p.stderr
    launcher = json.loads((tmp_path / "launcher.json").read_text())
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["pid"] == launcher["pid"]  # the same process: nothing of ktdeploy stays beside the trainer
    d = tmp_path / "runs" / "r1"
    # the trainer runs in the output root's records directory (the same for every run), not in its own record
    # folder, and CUDA's JIT cache sits there too: a fresh directory per run recompiled run-time kernels each run
    assert seen["cwd"] == str(tmp_path / ".ktdeploy-runs")
    assert seen["cuda_cache"] == str(tmp_path / ".ktdeploy-runs" / ".cuda-cache")
    assert (d / "launch_mode").read_text() == "exec\n"
    assert (d / "status").read_text() == "succeeded\n" and (d / "rc").read_text() == "0\n"
    summary = json.loads((d / "summary.json").read_text())
    assert summary["rc"] == 0 and summary["steps"] == 4
    assert summary["steady_tokens_per_s"] == 200.0  # 300 tokens over 3 steady steps of 0.5 s
    assert summary["peak_host_rss_gib"] >= 64 / 1024 and summary["peak_host_rss_hwm_gib"] >= 64 / 1024
    assert (d / "train.yaml").read_text() == "a: 1\n"


def test_a_failed_exec_run_is_recorded_as_failed(tmp_path):
    p = _run(tmp_path, 1)
    assert p.returncode == 0, p.stderr  # the stand-in exits 0 itself; the rc it reports is what is recorded
    d = tmp_path / "runs" / "r1"
    assert (d / "status").read_text() == "failed\n" and (d / "rc").read_text() == "1\n"
    assert json.loads((d / "summary.json").read_text())["rc"] == 1


def test_a_cuda_cache_path_the_environment_names_is_kept(tmp_path):
    p = _run(tmp_path, 0, cuda_cache=str(tmp_path / "mine"))
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["cuda_cache"] == str(tmp_path / "mine")
