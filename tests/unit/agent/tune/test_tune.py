from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ktdeploy.agent.monitor import PAGE, tree_rss_bytes
from ktdeploy.agent.tune import session as api
from ktdeploy.agent.tune.candidates import Candidate, stage_one, stage_two, thread_ladder
from ktdeploy.agent.tune.measure import parse_log
from ktdeploy.agent.tune.runner import TrialSpec, run_trial, trial_argv, trial_out_dir
from ktdeploy.agent.tune.select import Trial, choose, should_stop_early
from ktdeploy.core.errors import RecipeError
from ktdeploy.core.facts.host import CpuFacts, HostFacts, MemoryFacts, NumaNode
from ktdeploy.core.trainer_log import steady_tokens_per_s

REPO = Path(__file__).resolve().parents[4]
FAKE = (sys.executable, str(REPO / "tests" / "fakes" / "tune_trainer.py"))
RECIPE = str(REPO / "recipes" / "tiny-moe-lora.yaml")


def _volume(tmp_path: Path) -> list[str]:
    """Overrides putting the recipe's output volume (and output_dir) under tmp_path."""
    vol = tmp_path / "output"
    return [f"deploy.volumes.output={vol}", f"train.output_dir={vol}/tiny-moe-lora"]


def test_thread_ladder_is_numa_aligned_and_bounded():
    assert thread_ladder(16, 1) == [4, 8, 12, 16]
    assert thread_ladder(64, 2) == [16, 32, 48, 64]
    assert all(t % 2 == 0 for t in thread_ladder(30, 2))
    assert thread_ladder(2, 1) == [1, 2]
    assert thread_ladder(1, 4) == [4] or thread_ladder(1, 4) == [1]


def test_stage_one_starts_with_the_cookbook_setting():
    cands = stage_one(16, 1)
    assert cands[0] == Candidate(16, 1)      # "threads = physical cores" is the baseline
    assert [c.kt_num_threads for c in cands] == [16, 12, 8, 4]


def test_stage_two_explores_around_the_best():
    best = Candidate(8, 2)
    cands = stage_two(best, 16, 2, cache_depth=2, retain_fits=True, gradient_checkpointing=True)
    threads = {c.kt_num_threads for c in cands}
    assert {6, 10} <= threads
    assert Candidate(8, 1) in cands                                    # one pool instead of one per node
    assert Candidate(8, 2, kt_max_cache_depth=1) in cands and Candidate(8, 2, kt_max_cache_depth=3) in cands
    assert Candidate(8, 2, kt_cpu_activation="retain") in cands
    no_mem = stage_two(best, 16, 2, cache_depth=2, retain_fits=False, gradient_checkpointing=True)
    assert all(c.kt_cpu_activation is None for c in no_mem)


def test_steady_rate_leaves_warmup_out():
    lines = [json.dumps({"current_steps": s, "total_steps": 5, "total_tokens": s * 1000, "throughput": s * 1000 / t})
             for s, t in [(1, 5.0), (2, 6.0), (3, 7.0), (4, 8.0), (5, 9.0)]]
    samples = parse_log("\n".join(lines) + "\n{broken")
    assert len(samples) == 5
    assert steady_tokens_per_s(samples, warmup_steps=1) == pytest.approx(1000.0)
    assert steady_tokens_per_s(samples, warmup_steps=5) is None


def test_tree_rss_sums_descendants_only(tmp_path):
    """The sampler tune trials use (ktdeploy.agent.monitor), over a /proc laid out in a folder."""
    tree = {1: (None, 100), 10: (1, 5), 11: (10, 7), 12: (11, 11), 20: (1, 1000)}   # pid: (parent, resident pages)
    for pid, (_, pages) in tree.items():
        task = tmp_path / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (task / "children").write_text(" ".join(str(c) for c, (p, _) in tree.items() if p == pid))
        (tmp_path / str(pid) / "statm").write_text(f"{pages * 3} {pages} 0 0 0 0 0\n")
    assert tree_rss_bytes(10, tmp_path) == 23 * PAGE


def test_choose_respects_memory_and_status():
    a = Trial(Candidate(8, 1), tokens_per_s=1400, peak_host_rss_gib=50, status="ok")
    b = Trial(Candidate(4, 1), tokens_per_s=1100, peak_host_rss_gib=10, status="ok")
    c = Trial(Candidate(12, 1), tokens_per_s=2000, status="stopped-early")
    assert choose([a, b, c], 100, None) is a
    assert choose([a, b, c], 20, None) is b
    assert choose([c], None, None) is None
    assert should_stop_early(500, 1000) and not should_stop_early(900, 1000)


def _facts(cores=16, nodes=1):
    return HostFacts(cpu=CpuFacts(logical_cpus=cores, physical_cores=cores,
                                  numa_nodes=[NumaNode(id=i, cpus=list(range(i * cores // nodes, (i + 1) * cores // nodes)))
                                              for i in range(nodes)]),
                     memory=MemoryFacts(total_bytes=64 << 30, available_bytes=60 << 30))


def test_run_trial_measures_the_double(tmp_path):
    spec = TrialSpec(str(REPO / "recipes" / "tiny-moe-lora.yaml"), [], tmp_path, warmup_steps=2, measure_steps=4,
                     command=FAKE)
    t = run_trial(spec, Candidate(8, 1), 0, None)
    assert t.status == "ok", t.note
    assert t.tokens_per_s == pytest.approx(4000 * 1.04, rel=0.25)
    assert t.peak_host_rss_gib and t.peak_host_rss_gib > 0.03   # the double holds 50 MB resident
    assert t.peak_gpu_gib == pytest.approx(0.52)


def test_tune_end_to_end_picks_the_peak_and_beats_all_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "TrialSpec", lambda *a, **k: TrialSpec(*a, **k, command=FAKE))
    res = api.tune(RECIPE, _volume(tmp_path), budget_minutes=5, workdir=str(tmp_path / "output" / "tune"),
                   warmup_steps=2, measure_steps=3, facts=_facts(16, 1))
    data = res.to_json()
    assert data["chosen"]["kt_num_threads"] == 8
    assert data["speedup_vs_all_cores"] > 1.2     # simulated curve: 4000 vs 3200 tok/s at 16 threads, before stage two
    assert res.baseline.candidate == Candidate(16, 1)
    assert (tmp_path / "output" / "tune" / "tune.json").exists()
    assert api.tuned_overrides(tmp_path / "output" / "tune" / "tune.json")[-1].startswith("train.kt_config.kt_threadpool_count=")


def test_failed_candidate_is_reported_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_THREADS", "8")
    monkeypatch.setattr(api, "TrialSpec", lambda *a, **k: TrialSpec(*a, **k, command=FAKE))
    res = api.tune(RECIPE, _volume(tmp_path), budget_minutes=5, workdir=str(tmp_path / "output" / "tune"),
                   warmup_steps=1, measure_steps=2, facts=_facts(8, 1))
    first = res.trials[0]
    assert first.candidate.kt_num_threads == 8 and first.status == "failed"
    assert "simulated KT failure" in first.note
    assert res.chosen is not None and res.chosen.status == "ok"


def test_trials_land_on_the_output_volume_when_workdir_is_elsewhere(tmp_path, monkeypatch):
    """--workdir outside deploy.volumes.output: logs and tune.json go there, trial outputs stay on the volume,
    and the real `ktdeploy train --dry-run` accepts every trial's arguments."""
    import subprocess

    seen: list[TrialSpec] = []

    def spec(*a, **k):
        seen.append(TrialSpec(*a, **k, command=FAKE))
        return seen[-1]

    monkeypatch.setattr(api, "TrialSpec", spec)
    logs = tmp_path / "elsewhere"
    res = api.tune(RECIPE, _volume(tmp_path), budget_minutes=5, workdir=str(logs), warmup_steps=1,
                   measure_steps=2, facts=_facts(8, 1))
    assert (logs / "tune.json").exists() and (logs / "trial-00.log").exists()
    trials = tmp_path / "output" / ".ktdeploy-tune" / "tiny-moe-lora"
    assert (trials / "trial-00" / "trainer_log.jsonl").exists()
    assert res.chosen is not None
    real = TrialSpec(RECIPE, _volume(tmp_path), logs, 1, 2, trials_root=seen[0].trials_root)
    argv = trial_argv(real, Candidate(4, 1), trial_out_dir(real, 40)) + ["--dry-run", "--json"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["output_dir"] == str(trials / "trial-40")


def test_a_bad_recipe_starts_no_trial(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "TrialSpec", lambda *a, **k: TrialSpec(*a, **k, command=FAKE))
    bad = _volume(tmp_path) + ["train.per_device_train_batch_size=0"]
    with pytest.raises(RecipeError) as err:
        api.tune(RECIPE, bad, budget_minutes=5, workdir=str(tmp_path / "w"), facts=_facts(8, 1))
    assert any(f.path == "train.per_device_train_batch_size" for f in err.value.findings)
    assert not (tmp_path / "w").exists() and not (tmp_path / "output").exists()


def test_failure_reason_finds_the_exception_behind_the_panel():
    from ktdeploy.agent.tune.measure import failure_reason

    log = "\n".join([
        "[INFO] loading model", "Traceback (most recent call last):", '  File "x.py", line 3, in <module>',
        "ValueError: False is not a valid SaveStrategy", "╭──── StepError ────╮",
        "│ training failed (exit 1)                    │", "│ fix: read the last lines of the log above; fix the cause │",
        "│ and rerun with --resume auto │", "╰───────────────────╯"])
    assert failure_reason(log) == "ValueError: False is not a valid SaveStrategy"
    assert failure_reason("│ one │\n╰──╯\nlast words") == "one | last words"
