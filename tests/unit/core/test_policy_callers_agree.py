"""One policy, one place: the former copies' callers now give the same answer (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.agent import train as T
from ktdeploy.controller.doctor import DoctorReport
from ktdeploy.core import checkpoints as ckpt
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import AGENT_DEFERRED, RUNTIME_FIXABLE, gate
from ktdeploy.core.checks.threads import derive_threads, derived_kt_threads, serve_threads
from ktdeploy.core.errors import CheckFailed, RunRecordError
from ktdeploy.core.facts.host import CpuFacts, HostFacts, MemoryFacts, NumaNode
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes/tiny-moe-lora.yaml"


def _facts(cores=24, nodes=2) -> HostFacts:
    return HostFacts(cpu=CpuFacts(logical_cpus=cores, physical_cores=cores,
                                  numa_nodes=[NumaNode(id=i, cpus=list(range(i * cores // nodes,
                                                                             (i + 1) * cores // nodes)))
                                              for i in range(nodes)]),
                     memory=MemoryFacts(total_bytes=64 << 30, available_bytes=60 << 30))


def _checks(*failing: str) -> list[CheckResult]:
    return [CheckResult(name="cpu.isa.avx2", status="pass", detail="ok")] + [
        CheckResult(name=n, status="fail", detail=f"{n} failed", fix="fix it") for n in failing]


# -- which failed checks block a run ------------------------------------------------------------------
@pytest.mark.parametrize("failing,waive", [
    ((), ()), (("gpu.present",), ()), (("gpu.present",), ("gpu.present",)),
    (("docker.present", "docker.nvidia_runtime"), ()), (("docker.memlock", "gpu.count_vs_recipe"), ("gpu.count_vs_recipe",)),
])
def test_doctor_report_and_gate_agree(failing, waive):
    report = DoctorReport(facts=_facts(), checks=_checks(*failing), waived=tuple(waive))
    g = gate(report.checks, waive)
    assert report.failed == g.blocking
    assert report.waived_failures == g.waived
    assert {c.name for c in g.blocking} == set(failing) - set(waive)


def test_up_defers_runtime_fixable_and_agent_ignores_docker_checks(tmp_path):
    checks = _checks("docker.present", "docker.memlock", "gpu.present")
    up = gate(checks, ("gpu.present",), defer=RUNTIME_FIXABLE)
    assert [c.name for c in up.deferred] == ["docker.present"]
    assert [c.name for c in up.blocking] == ["docker.memlock"]     # up needs memlock for its container
    agent = gate(checks, (), defer=AGENT_DEFERRED)
    assert [c.name for c in agent.blocking] == ["gpu.present"]     # docker.* never concern `ktdeploy train`
    # ... and the agent's run_doctor uses exactly that gate
    recipe = load_recipe(RECIPE)
    with pytest.raises(CheckFailed) as e:
        T.run_doctor(recipe, False, diagnose=lambda r: DoctorReport(facts=_facts(), checks=checks))
    assert [c.name for c in e.value.results] == ["gpu.present"]
    T.run_doctor(recipe, False, diagnose=lambda r: DoctorReport(facts=_facts(), checks=_checks("docker.present")))


def test_agent_needs_the_doctor_handed_in():
    with pytest.raises(ValueError, match="diagnose"):
        T.run_doctor(load_recipe(RECIPE), False)
    assert T.run_doctor(load_recipe(RECIPE), True)[1] is None   # --skip-doctor needs none


# -- kt_num_threads / kt_threadpool_count ---------------------------------------------------------------
@pytest.mark.parametrize("sets", [[], ["train.kt_config.kt_num_threads=6"],
                                  ["train.kt_config.kt_num_threads=6", "train.kt_config.kt_threadpool_count=1"]])
def test_train_preview_and_serve_derive_the_same_threads(sets):
    recipe = load_recipe(RECIPE, sets)
    facts = _facts(24, 2)
    reserve = recipe.deploy.reserve_cores
    # the agent (what `ktdeploy train` renders)
    derived, _, _ = T.run_doctor(recipe, False, diagnose=lambda r: DoctorReport(facts=facts, checks=_checks()))
    # up's preview of the rendered files
    assert derived_kt_threads(recipe.train, facts, reserve) == derived
    # serve: --kt-cpuinfer / --kt-threadpool-count default to what training used
    effective = {**{k.split(".", 1)[1]: v for k, v in derived.items()},
                 **{k: v for k, v in recipe.kt_config.items() if k in ("kt_num_threads", "kt_threadpool_count")}}
    assert serve_threads(recipe.kt_config, lambda: derive_threads(facts, reserve)) == (
        effective["kt_num_threads"], effective["kt_threadpool_count"])
    assert derive_threads(facts, reserve) == (24 - reserve, 2)


def test_serve_threads_flag_else_recipe_else_derived_and_derives_only_when_a_count_is_open():
    asked: list[int] = []

    def derived() -> tuple[int, int]:
        asked.append(1)
        return 22, 2

    assert serve_threads({}, derived) == (22, 2)
    assert serve_threads({"kt_num_threads": 6}, derived) == (6, 2)
    assert serve_threads({"kt_num_threads": 6}, derived, cpuinfer=8) == (8, 2)
    assert len(asked) == 3
    assert serve_threads({"kt_num_threads": 6, "kt_threadpool_count": 1}, derived) == (6, 1)
    assert serve_threads({}, derived, cpuinfer=4, threadpools=3) == (4, 3)
    assert len(asked) == 3                          # nothing open: this host's facts are never gathered
    assert serve_threads({"kt_num_threads": 0, "kt_threadpool_count": None}, derived) == (22, 2)  # 0 counts as unset
    assert serve_threads({"kt_num_threads": -1}, derived) == (-1, 2)   # build_serve_command refuses it (exit 2)


def test_no_threads_derived_without_kt():
    assert derived_kt_threads({"use_kt": False, "kt_config": {}}, _facts()) == {}
    assert derived_kt_threads({"use_kt": True, "kt_config": {}}, _facts()) == {
        "kt_config.kt_num_threads": 22, "kt_config.kt_threadpool_count": 2}


# -- a finished run ------------------------------------------------------------------------------------
@pytest.mark.parametrize("marker", ckpt.FINISHED_MARKERS)
def test_plan_state_and_agent_agree_on_a_finished_run(tmp_path, marker):
    out = tmp_path / "out"
    out.mkdir()
    (out / marker).write_text("{}")
    assert JobState(top_level=[marker]).finished
    with pytest.raises(RunRecordError, match="finished run"):
        T.resolve_resume(out, None)
    (out / marker).unlink()
    (out / "trainer_log.jsonl").write_text("")
    assert not JobState(top_level=["trainer_log.jsonl"]).finished
    assert ckpt.finished_markers(["trainer_log.jsonl"]) == []


# -- trainer_log.jsonl and steady tokens/s ----------------------------------------------------------------
def _lf_log() -> str:
    import json

    rows = [{"current_steps": s, "total_steps": 5, "loss": 2.0 - s / 10, "total_tokens": s * 1000,
             "throughput": s * 1000 / t, "vram_reserved": 1.0 + s / 10}
            for s, t in [(1, 5.0), (2, 6.0), (3, 7.0), (4, 8.0), (5, 9.0)]]
    return "\n".join(json.dumps(r) for r in rows) + "\n{torn"


def test_follow_and_tune_read_trainer_log_with_one_parser():
    from ktdeploy.agent.tune import measure
    from ktdeploy.controller import executor, slurm_jobs
    from ktdeploy.core import trainer_log

    text = _lf_log()
    assert measure.parse_log(text) == trainer_log.parse_log(text)
    assert executor.latest is slurm_jobs.latest is trainer_log.latest and trainer_log.latest(text).current_steps == 5
    assert trainer_log.steady_tokens_per_s(measure.parse_log(text), 1) == pytest.approx(1000.0)
    assert trainer_log.peak_vram_gib(measure.parse_log(text)) == pytest.approx(1.5)


def test_train_summary_uses_the_same_steady_rate(tmp_path):
    import json

    from ktdeploy.agent.monitor import RunOutcome
    from ktdeploy.core.trainer_log import steady_rate

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "step_s": s, "tokens_seen": 1000 * i} for i, s in [(1, 9.0), (2, 1.0), (3, 1.0), (4, 2.0)]]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = T._summarise(run, RunOutcome(rc=0, wall_s=1.0, peak_rss_bytes=0, hwm_rss_bytes=0), tmp_path / "out")
    # the first step (compilation) is left out: 3000 tokens in 4 s
    assert summary["steady_tokens_per_s"] == pytest.approx(750.0)
    assert steady_rate((1000, 0.0), (4000, 4.0)) == 750.0


# -- docker argv ------------------------------------------------------------------------------------------
def test_controller_builds_no_docker_argv_by_hand():
    from ktdeploy.core.plan import docker_argv as dk

    for mod in ("up_host.py", "up_slurm.py", "up_phases.py", "run_queries.py", "executor.py"):
        text = (ROOT / "ktdeploy" / "controller" / mod).read_text()
        assert '["docker"' not in text, f"controller/{mod} builds a docker argv by hand: use core/plan/docker_argv"
    assert dk.logs("c", tail=15) == ["docker", "logs", "--tail", "15", "--", "c"]
    assert dk.logs("c", timestamps=True, since="2026-12-03T07:00:00Z") == [
        "docker", "logs", "--timestamps", "--since", "2026-12-03T07:00:00Z", "--", "c"]
    assert dk.stop("c") == ["docker", "stop", "--time", "30", "--", "c"]


# -- the output-marker format -------------------------------------------------------------------------------
def test_one_marker_format_for_gather_state_and_follow():
    from ktdeploy.controller import facts_gather
    from ktdeploy.core import markers
    from ktdeploy.core.plan.state import parse_state

    assert facts_gather.parse_sections is markers.parse_sections and markers.SECTION_SH in facts_gather.gather_script()
    secs = markers.parse_sections("@@KTD-BEGIN cpu\nflags a b\n\n@@KTD-RC cpu 0\n\n@@KTD-END cpu\n")
    assert secs["cpu"].stdout == "flags a b" and secs["cpu"].rc == 0
    text = "@@home\t/home/u\n@@output_exists\tyes\n@@listing\ncheckpoint-1/trainer_state.json\n@@end\n"
    fields, blocks = markers.parse_fields(text, blocks=("listing",))
    assert fields == {"home": "/home/u", "output_exists": "yes"}
    assert blocks == {"listing": ["checkpoint-1/trainer_state.json"]}
    st = parse_state(text)
    assert st.home == "/home/u" and st.output_exists and st.top_level == ["checkpoint-1"]


# -- the resume policy ----------------------------------------------------------------------------------------
_FULL = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]
_FULL2 = [f for f in _FULL if f != "rng_state.pth"] + ["rng_state_0.pth", "rng_state_1.pth"]


@pytest.mark.parametrize("listing,resume", [
    ({"checkpoint-10": _FULL, "checkpoint-20": ["trainer_state.json"]}, "auto"),
    ({"checkpoint-10": _FULL, "checkpoint-20": _FULL}, "auto"),
    ({"checkpoint-10": _FULL, "checkpoint-20": ["trainer_state.json"]}, "checkpoint-20"),
    ({"checkpoint-10": _FULL}, "checkpoint-10"),
    ({"checkpoint-10": _FULL2}, "auto"),
    ({"checkpoint-10": _FULL2}, "checkpoint-10"),
])
def test_up_and_train_choose_the_same_checkpoint(tmp_path, listing, resume):
    from ktdeploy.core.facts.host import DockerFacts
    from ktdeploy.core.plan import UpOptions, build_plan
    from ktdeploy.core.recipe import builtin_recipe

    recipe = load_recipe(builtin_recipe(), [])
    out = recipe.train["output_dir"]
    # up: the plan from the gathered listing
    st = JobState(home="/home/u", image_id="sha256:abc", output_exists=True, top_level=sorted(listing), listing=listing)
    facts = HostFacts(cpu=CpuFacts(flags=sorted(["avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                                                 "avx512_bf16", "avx512_vnni", "avx512vbmi"])),
                      docker=DockerFacts(present=True, reachable=True, server_version="24", runtimes=["nvidia"]))
    plan = build_plan(recipe, facts, st, UpOptions(host="h", run_id="r", resume=resume if resume == "auto"
                                                   else f"{out}/{resume}"))
    refused = [s for _, s in plan.steps() if s.id == "train.resume" and s.action == "fail"]
    up_choice = None if refused else plan.resume_from.rsplit("/", 1)[1]
    # train: the same folders on disk
    d = tmp_path / "out"
    for name, entries in listing.items():
        for e in entries:
            (d / name).mkdir(parents=True, exist_ok=True)
            (d / name / e).write_text("x")
    try:
        got = T.resolve_resume(d, resume if resume == "auto" else str(d / resume), 1)
        train_choice = Path(got).name
    except RunRecordError:
        train_choice = None
    assert up_choice == train_choice
    assert ckpt.choose_resume(listing, resume, 1).checkpoint is None or up_choice in (
        None, ckpt.choose_resume(listing, resume, 1).checkpoint.name)


# -- one run-record format (core/run_record.py) --------------------------------------------------------------------
def test_agent_record_written_by_the_agent_is_read_by_the_controller(tmp_path):
    """ktdeploy train's record (agent/train.write_record + finish_record, lf_entry's ranks line) read back through
    the controller's reader (executor.agent_record: FILES_SH over a connector) and core's read_agent_record."""
    from ktdeploy.agent import lf_entry
    from ktdeploy.controller.connectors.local import LocalConnector
    from ktdeploy.controller.executor import agent_record
    from ktdeploy.core import run_record as rr

    out = tmp_path / "vol" / "run1"
    out.mkdir(parents=True)
    (out / "train_results.json").write_text('{"train_loss": 1.25}')
    run_dir = Path(T._run_dir(out, None))
    assert str(run_dir.parent) == JobLayout(str(out)).agent_runs
    plan = T.TrainPlan(recipe_path="r.yaml", output_dir=str(out), run_dir=str(run_dir), argv=["true"],
                       env={}, derived={}, resume_from=None, train_yaml="a: 1\n", accelerate_yaml="b: 2\n",
                       launch_sh="#!/bin/sh\n")
    d = T.write_record(plan)
    (d / rr.LAUNCH_MODE).write_text(rr.LAUNCH_EXEC + "\n")
    (d / rr.RANKS).write_text(rr.rank_line(0, 0, 2 << 30))
    assert lf_entry._rank0()   # lf_entry's RunMetrics writes these lines (rank 0) with rr.metrics_line
    (d / rr.METRICS).write_text("".join(rr.metrics_line({"step": i + 1, "step_s": 0.5, "tokens_seen": t,
                                                         "loss": 2.0 - i / 4})
                                        for i, t in enumerate((10, 110, 210, 310))))
    summary = T.finish_record(d, out, 0, 12.5, 3 << 30, 2 << 30)

    folder, rec = agent_record(LocalConnector(), str(out))
    assert folder == str(d)
    assert rec.state == "succeeded" and rec.finished and rec.rc == 0 and rec.launch_mode == "exec"
    assert rec.summary["schema"] == rr.SCHEMA_VERSION and set(rr.SUMMARY_KEYS) <= set(rec.summary)
    assert {k: rec.summary[k] for k in summary} == summary
    assert rec.summary["steady_tokens_per_s"] == 200.0 and rec.summary["train_results"] == {"train_loss": 1.25}
    assert rec.ranks == [{"rank": 0, "rc": 0, "hwm_bytes": 2 << 30}]
    files = {n: (d / n).read_text() for n in rr.AGENT_FILES if (d / n).exists()}
    assert rr.read_agent_record(files) == rec


def test_agent_record_states_and_a_killed_run(tmp_path):
    from ktdeploy.core import run_record as rr

    assert rr.read_agent_record({rr.STATUS: rr.status_text("running")}).state == "running"  # SIGKILLed: no rc
    assert rr.read_agent_record({rr.STATUS: "bogus\n", rr.SUMMARY: "[1]"}) == rr.AgentRecord()
    with pytest.raises(ValueError):
        rr.status_text("finished")           # the controller's word, not the agent's
    assert rr.final_state(0) == "succeeded" and rr.final_state(3) == "failed"


def test_controller_record_uses_the_one_format(tmp_path):
    from ktdeploy.controller import runs
    from ktdeploy.core import run_record as rr

    rec = runs.RunRecord.create("r", root=tmp_path)
    assert runs.STATES is rr.RUN_STATES
    assert {p.name for p in rec.path.iterdir()} == {rr.RENDERED, rr.ARTIFACTS}
    rec.set_status("running", host="h")
    rec.event("stage_start", stage="TRAIN")
    st = rr.parse_status_json((rec.path / rr.STATUS_JSON).read_text())
    assert st == rec.status() and st["schema"] == rr.SCHEMA_VERSION and st["state"] == "running" and st["id"] == rec.id
    assert rr.parse_events((rec.path / rr.EVENTS).read_text() + '{"torn') == rec.events()
    assert rec.events()[0]["event"] == "stage_start"
    with pytest.raises(ValueError):
        rr.status_update({}, "succeeded", rec.id, 0.0)   # the agent's word, not the controller's


# -- facts gathered once per container start; the planner run once per doctor run ----------------------------------
def test_facts_are_gathered_once_per_container_start(monkeypatch):
    """The image's entrypoint gathers the host facts for its ISA gate; train's doctor (and serve, tune) reuse them."""
    from ktdeploy.cli import image_entry
    from ktdeploy.controller import facts_gather, local_host

    calls: list[str] = []
    real_shell = facts_gather.gather_script

    def counting_script(*a, **kw):
        calls.append("gather")
        return real_shell(*a, **kw)

    monkeypatch.setattr(facts_gather, "gather_script", counting_script)
    monkeypatch.setattr(local_host, "_RAW", {})
    image_entry.isa_gate("avx2", ["train", "r.yaml"])            # the entrypoint's gate (no probes for avx2)
    report = local_host.local_doctor(load_recipe(RECIPE))        # train's doctor
    local_host.local_threads(load_recipe(RECIPE).deploy.reserve_cores)   # serve's threads
    assert calls == ["gather"]
    assert report.facts.cpu.logical_cpus and report.facts.paths   # the doctor still looked at the recipe's paths


def test_the_planner_runs_once_per_doctor_run(monkeypatch):
    from ktdeploy.controller import doctor as D
    from ktdeploy.core.checks import resources
    from ktdeploy.core.sizing import advice

    recipe = load_recipe(RECIPE)
    before = {c.name: (c.status, c.detail) for c in D.run_checks(_facts(), recipe)}
    runs: list[int] = []
    real = resources.plan_recipe
    monkeypatch.setattr(resources, "plan_recipe", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    monkeypatch.setattr(advice, "estimate", lambda *a, **kw: pytest.fail("plan.* checks planned again"))
    facts = _facts()
    facts.memory.available_bytes = 1 << 50      # no shortfall: no knob search (which does estimate, on purpose)
    D.run_checks(facts, recipe)
    assert runs == [1]
    monkeypatch.undo()
    assert {c.name: (c.status, c.detail) for c in D.run_checks(_facts(), recipe)} == before


def test_every_run_into_one_output_root_shares_one_trainer_directory():
    """The trainer's working directory is one per output root (CUDA's JIT cache keys run-time kernels by it: a
    fresh one per run recompiled them at every run), holds the records, and its JIT cache sits inside it."""
    a, b = JobLayout("/vol/out/run-a").trainer_workdir, JobLayout("/vol/out//run-b/").trainer_workdir
    assert a == b == "/vol/out/.ktdeploy-runs"
    assert JobLayout("/vol/out/run-a").agent_runs == "/vol/out/.ktdeploy-runs/run-a"
    assert JobLayout("/vol/out/run-b").cuda_jit_cache.startswith(a + "/")
    assert JobLayout("/vol/other/run-a").trainer_workdir != a
