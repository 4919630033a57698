"""The executor against the in-memory FakeConnector: skip/run/fail, follow, crash and resume paths (no docker)."""

from __future__ import annotations

import json

import pytest

from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import FOLLOW_SCRIPT, Executor
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core.errors import StepError
from ktdeploy.core.facts.host import CpuFacts, DockerFacts, HostFacts
from ktdeploy.core.markers import FILES_SH
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.params import FollowParams, RunParams
from ktdeploy.core.plan.state import STATE_SCRIPT, ContainerState, JobState
from ktdeploy.core.plan.steps import Plan, Stage, Step, StepAction
from ktdeploy.core.recipe import builtin_recipe, load_recipe
from tests.fakes.connector import FakeConnector, UnscriptedCommand, container_state, fail, ok

FULL = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]
LOG = "/out/trainer_log.jsonl"


def _plan(*steps: Step, stage: str = "TRAIN") -> Plan:
    return Plan(host="fake-host", recipe="r", job="job1", image="img", variant=None, output_dir="/out",
                adapter_dir="/out/adapter", job_dir="/job", stages=(Stage(stage, stage.lower(), tuple(steps)),))


def _executor(conn, plan, tmp_path, **kw) -> Executor:
    return Executor(conn, Emitter(RunRecord.create("r", root=tmp_path / "runs")), plan, poll_s=0, **kw)


def _events(ex: Executor) -> list[str]:
    return [e["kind"] if "kind" in e else e.get("event") for e in ex.record.events()]


def _log_line(step: int, total: int = 3, loss: float = 1.0) -> str:
    return json.dumps({"current_steps": step, "total_steps": total, "loss": loss, "throughput": 100.0,
                       "total_tokens": 1000 * step})


def _snap(status: str, *log_steps: int, exit_code: int | None = 0, oom: bool = False):
    """FOLLOW_SCRIPT's answer: docker inspect's status and output, the log tail, the end mark."""
    return ok("@@inspect\t0\n" + container_state(status, exit_code, oom) + "\n@@log\n"
              + "".join(_log_line(s) + "\n" for s in log_steps) + "@@end\n")


def test_every_step_action_has_a_handler(tmp_path):
    ex = _executor(FakeConnector(), _plan(), tmp_path)
    assert set(ex.handlers()) == set(StepAction)
    with pytest.raises(ValueError):
        Step("x", "x", action="teleport")


def test_satisfied_and_probed_steps_are_skipped_the_rest_run_in_order(tmp_path):
    conn = (FakeConnector().on(("test", "-e", "/done"), ok()).on(("test", "-e", "/todo"), fail())
            .on(("docker", "load"), ok()).on(("docker", "create"), ok("id\n")))
    plan = _plan(Step("a", "known done", argv=("docker", "rm", "x"), satisfied=True, why="state"),
                 Step("b", "probe done", argv=("docker", "load"), probe=("test", "-e", "/done")),
                 Step("c", "probe not done", argv=("docker", "create", "x"), probe=("test", "-e", "/todo")))
    _executor(conn, plan, tmp_path).apply()
    assert [c.argv for c in conn.calls] == [["test", "-e", "/done"], ["test", "-e", "/todo"], ["docker", "create", "x"]]


def test_a_failing_step_stops_up_with_its_output_and_fix(tmp_path):
    conn = FakeConnector().on(("docker", "create"), fail(125, "Error: no such image\n"))
    plan = _plan(Step("train.create", "create", argv=("docker", "create", "x"), fix="build the image"),
                 Step("train.start", "start", argv=("docker", "start", "x")))
    ex = _executor(conn, plan, tmp_path)
    with pytest.raises(StepError) as e:
        ex.apply()
    assert e.value.rc == 125 and "no such image" in e.value.output and e.value.fix == "build the image"
    assert conn.ran("docker", "start") == []      # nothing after the failed step
    failed = [ev for ev in ex.record.events() if ev.get("step") == "train.create" and "message" in ev]
    assert failed and failed[0]["rc"] == 125


def test_an_unscripted_command_fails_the_test(tmp_path):
    with pytest.raises(UnscriptedCommand):
        _executor(FakeConnector(), _plan(Step("a", "a", argv=("rm", "-rf", "/"))), tmp_path).apply()


def _follow_plan() -> Plan:
    return _plan(Step("follow.train", "follow", action="follow", params=FollowParams(container="job1", log=LOG)),
                 stage="FOLLOW")


def test_follow_records_each_new_step_and_finishes_on_exit_0(tmp_path):
    conn = (FakeConnector()
            .on(("sh", "-c", FOLLOW_SCRIPT), [_snap("running"), _snap("running", 1), _snap("running", 1, 2),
                                              _snap("running", 1, 2), _snap("exited", 1, 2, 3)])
            .on(("docker", "logs"), ok("training log\n"))
            .on(("sh", "-c", FILES_SH), ok("@@dir\t/.ktdeploy-runs/out/20260101T000000\n@@file\tstatus\nsucceeded\n\n"
                                           '@@file\trc\n0\n\n@@file\tsummary.json\n{"steady_tokens_per_s": 9.5}\n'
                                           "@@end\n")))
    ex = _executor(conn, _follow_plan(), tmp_path)
    ex.apply()
    assert conn.ran("sh", "-c", FILES_SH)[0][4] == "/.ktdeploy-runs/out"   # the agent's record of /out
    agent = json.loads((ex.record.path / "artifacts" / "agent_record.json").read_text())
    assert agent["state"] == "succeeded" and agent["rc"] == 0 and agent["summary"]["steady_tokens_per_s"] == 9.5
    progress = [ev["current_steps"] for ev in ex.record.events() if ev.get("current_steps") is not None
                and "total_steps" in ev and "exit_code" not in ev]
    assert progress == [1, 2, 3]           # step 2 seen twice is recorded once
    assert (ex.record.path / "artifacts" / "container.log").read_text() == "training log\n"
    assert conn.ran("sh", "-c", FOLLOW_SCRIPT)[0][-2:] == ["job1", LOG]


def test_follow_reports_an_oom_kill_with_advice_and_the_last_lines(tmp_path):
    conn = (FakeConnector()
            .on(("sh", "-c", FOLLOW_SCRIPT), [_snap("running", 1), _snap("exited", 1, exit_code=137, oom=True)])
            .on(("docker", "logs"), ok("step 1\nKilled\n"))
            .on(("sh", "-c", FILES_SH), ok("")))          # no agent record (killed before it wrote one)
    ex = _executor(conn, _follow_plan(), tmp_path)
    with pytest.raises(StepError) as e:
        ex.apply()
    assert e.value.rc == 137 and "OOM-killed" in e.value.message and "Killed" in e.value.message
    assert "--resume auto" in e.value.fix
    assert ex.record.status()["state"] == "crashed"


def test_follow_reports_a_removed_container(tmp_path):
    gone = ok("@@inspect\t1\nError: No such container: job1\n@@log\n@@end\n")
    conn = FakeConnector().on(("sh", "-c", FOLLOW_SCRIPT), [_snap("running", 1), gone])
    with pytest.raises(StepError, match="disappeared"):
        _executor(conn, _follow_plan(), tmp_path).apply()


def _facts() -> HostFacts:
    return HostFacts(cpu=CpuFacts(flags=sorted(["avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                                                "avx512_bf16", "avx512_vnni", "avx512vbmi"])),
                     docker=DockerFacts(present=True, reachable=True, server_version="24.0",
                                        runtimes=["runc", "nvidia"]))


def test_resume_plan_moves_the_cut_off_checkpoint_aside_then_starts(tmp_path):
    """The TRAIN stage of a resumed run, executed: the crashed container's log is kept, the container removed,
    the newer incomplete checkpoint moved aside (never deleted), then the container is created and started."""
    recipe = load_recipe(builtin_recipe(), [])
    out = recipe.train["output_dir"]
    st = JobState(home="/home/u", image_id="sha256:abc", output_exists=True,
                  container=ContainerState(status="exited", exit_code=137, oom_killed=True),
                  top_level=["checkpoint-10", "checkpoint-20"],
                  listing={"checkpoint-10": FULL, "checkpoint-20": ["trainer_state.json"]})
    plan = build_plan(recipe, _facts(), st, UpOptions(host="fake-host", run_id="r1", resume="auto"))
    assert plan.resume_from == f"{out}/checkpoint-10"
    train = plan.stage("TRAIN")
    # a host where nothing is done yet: every probe answers "not yet", every command succeeds
    conn = (FakeConnector().on(("sh", "-c"), fail()).on(("docker", "inspect"), fail())
            .on(("docker", "logs"), ok("old run\n")).on(lambda argv: True, ok()))
    ex = _executor(conn, Plan(**{**plan.__dict__, "stages": (train,)}), tmp_path)
    ex.record.write_text("rendered/ship/recipe.yaml", "train: {}\n")   # what up writes before the executor runs
    ex.apply()
    runs = [c.argv for c in conn.calls if c.kind == "run"]
    moved = [a for a in runs if any("checkpoint-20" in x for x in a)]
    assert moved and not any(a[0] == "rm" for a in moved)
    create = next(i for i, a in enumerate(runs) if a[:2] == ["docker", "create"])
    start = next(i for i, a in enumerate(runs) if a[:2] == ["docker", "start"])
    assert runs.index(moved[0]) < create < start
    assert (ex.record.path / "artifacts" / "previous-container.log").read_text() == "old run\n"
    assert list(conn.files.values()) == [b"train: {}\n"]               # the shipped recipe reached the host


def test_world_size_mismatch_stops_before_anything_changes(tmp_path):
    recipe = load_recipe(builtin_recipe(), [])
    listing = {"checkpoint-10": ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth",
                                 "rng_state_1.pth", "trainer_state.json"]}
    st = JobState(home="/home/u", image_id="sha256:abc", output_exists=True, top_level=["checkpoint-10"],
                  listing=listing)
    plan = build_plan(recipe, _facts(), st, UpOptions(host="fake-host", run_id="r1", resume="auto"))
    conn = FakeConnector().on(lambda argv: argv[:1] == ["test"] or argv[:2] == ["sh", "-c"], fail())
    ex = _executor(conn, Plan(**{**plan.__dict__, "stages": (plan.stage("TRAIN"),)}), tmp_path)
    with pytest.raises(StepError, match="same world size"):
        ex.apply()
    assert conn.ran("docker", "create") == [] and conn.ran("docker", "start") == []


def test_runtime_stage_installs_docker_only_when_its_probe_fails(tmp_path):
    from ktdeploy.core.plan.host_plan import _runtime_stage

    stage = _runtime_stage(HostFacts(docker=DockerFacts(present=False)), nvidia_waived=True)
    assert [s.id for s in stage.steps] == ["runtime.docker", "runtime.nvidia"]
    plan = Plan(**{**_plan().__dict__, "stages": (stage,)})
    conn = FakeConnector().on(("docker", "info"), [fail(127, "docker: not found"), ok()]).on(("sh", "-c"), ok())
    _executor(conn, plan, tmp_path).apply()
    assert len(conn.ran("sh", "-c")) == 1            # installed once
    _executor(conn, plan, tmp_path).apply()          # a second run: the probe now passes, nothing is installed
    assert len(conn.ran("sh", "-c")) == 1


def test_up_doctor_phase_blocks_waives_and_defers(tmp_path):
    from ktdeploy.controller.doctor import DoctorReport
    from ktdeploy.controller.up_host import doctor_phase
    from ktdeploy.core.check_result import CheckResult

    checks = [CheckResult(name=n, status="fail", detail=n) for n in ("gpu.present", "docker.present", "disk.output")]
    said: list = []
    blocking, line = doctor_phase(DoctorReport(facts=HostFacts(), checks=checks), "h", ("gpu.present",), said.append)
    assert [c.name for c in blocking] == ["disk.output"]
    assert line.startswith("0 pass, 0 warn, 2 fail (1 waived; 1 left to the RUNTIME stage)")
    (verdict,) = said
    assert verdict.blocking and verdict.summary_text == line and verdict.failed == ("docker.present", "disk.output")
    assert [c.name for c in verdict.waived] == ["gpu.present"] and [c.name for c in verdict.deferred] == ["docker.present"]
    assert verdict.record() == {"summary": verdict.summary, "failed": ["docker.present", "disk.output"],
                                "waived": ["gpu.present"]}


def _golden_host(folder: str) -> FakeConnector:
    """A FakeConnector answering fact gathering from a golden folder (real command output of a real machine);
    the C probes are unavailable (no cache dir), disk paths unknown."""
    from pathlib import Path

    from ktdeploy.controller import facts_probes
    from ktdeploy.controller.facts_gather import gather_script, load_raw
    from ktdeploy.core.facts import disk
    from ktdeploy.core.facts.data_listing import DATA_SCRIPT

    raw = load_raw(str(Path(__file__).resolve().parents[2] / "golden" / folder))
    text = "".join(f"@@KTD-BEGIN {n}\n{sec.stdout or ''}\n@@KTD-RC {n} {sec.rc if sec.rc is not None else 1}\n"
                   f"{sec.stderr}\n@@KTD-END {n}\n" for n, sec in raw.sections.items())
    return (FakeConnector(name=folder)
            .on(("sh", "-c", gather_script()), ok(text))
            .on(("sh", "-c", facts_probes._RUN_SCRIPT), fail())
            .on(("sh", "-c", facts_probes._PREPARE_SCRIPT), fail())
            .on(("sh", "-c", disk.PATHS_SCRIPT), ok(""))
            .on(("sh", "-c", DATA_SCRIPT), lambda argv: ok("".join(
                f"@@KTD-DATA\t{k}\tmissing\t0\t{p}\n" for k, p in zip(argv[4::2], argv[5::2], strict=False))))
            .on(("sh", "-c", STATE_SCRIPT), ok("@@home\t/home/u\n@@user\t1000:1000\n@@container\t\n@@image\t\n"
                                               "@@output_exists\tno\n@@adapter\tno\n@@listing\n@@end\n")))


def test_up_on_a_host_that_fails_the_doctor_starts_nothing(tmp_path, monkeypatch):
    from ktdeploy.controller.up_host import up
    from ktdeploy.core.command_requests import UpRequest
    from ktdeploy.core.errors import CheckFailed

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    conn = _golden_host("haswell-avx2-qemu")
    with pytest.raises(CheckFailed) as e:
        up(UpRequest(host="gpu01"), connector=conn)
    assert e.value.results                                          # the blocking checks are named
    assert not any(c.argv[:2] in (["docker", "create"], ["docker", "start"]) for c in conn.calls)


def test_up_dry_run_on_the_gpu_golden_host_plans_and_changes_nothing(tmp_path, monkeypatch, capsys):
    """`up --dry-run` end to end on the H200 machine's recorded facts (no docker there: RUNTIME installs it)."""
    from ktdeploy.controller.up_host import up
    from ktdeploy.core import events as ev
    from ktdeploy.core.command_requests import UpRequest

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    conn = _golden_host("gpu-h200-vm")
    said: list = []
    # the golden folder holds no dataset and no model (its data files answer "missing"): those checks are waived
    res = up(UpRequest(host="gpu01", dry_run=True, waive=("data.dataset_info", "model.config")), connector=conn,
             on_event=said.append)
    assert res.state == "dry-run" and res.plan is not None
    assert [type(e) for e in said] == [ev.WaiversRecorded, ev.ConnectStarted, ev.Connected, ev.DoctorVerdict,
                                       ev.DryRun, ev.PlanText] and said[-1].text == res.text
    # the sink and the run record see one stream: each recorded event is one the sink got, in order
    assert [{k: v for k, v in e.items() if k != "ts"} for e in res.record.events()] == \
        [{"event": e.KIND, **e.record()} for e in said if e.KIND]
    assert capsys.readouterr().out == ""     # the controller prints nothing itself
    assert [s.id for s in res.plan.stage("RUNTIME").steps][0] == "runtime.docker"
    assert (res.record.path / "plan.json").exists() and (res.record.path / "facts.json").exists()
    changing = (["docker", "create"], ["docker", "start"], ["mkdir", "-p"])
    mutating = [c.argv for c in conn.calls if c.argv[:2] in changing]
    assert mutating == []


def test_a_failed_serve_create_removes_the_uploaded_key_file(tmp_path):
    conn = FakeConnector().on(("docker", "create"), fail("no such image")).on(("rm", "-f"), ok())
    plan = _plan(Step("serve.create", "create", argv=("docker", "create", "x"),
                      params=RunParams(cleanup=("rm", "-f", "--", "/job/serve.env"))), stage="SERVE")
    with pytest.raises(StepError):
        _executor(conn, plan, tmp_path).apply()
    assert conn.ran("rm", "-f") == [["rm", "-f", "--", "/job/serve.env"]]


def test_follow_says_the_planned_eta_then_the_measured_one_and_records_both(tmp_path):
    from pathlib import Path

    from ktdeploy.core import events as ev

    recipe = load_recipe(Path(__file__).resolve().parents[3] / "recipes/tiny-moe-lora.yaml")
    conn = (FakeConnector()
            .on(("sh", "-c", FOLLOW_SCRIPT), [_snap("running", 1), _snap("running", 1, 2), _snap("exited", 1, 2, 3)])
            .on(("docker", "logs"), ok(""))
            .on(("sh", "-c", FILES_SH), ok("@@dir\t/.ktdeploy-runs/out/x\n@@end\n")))
    shown: list[ev.Event] = []
    ex = Executor(conn, Emitter(RunRecord.create("r", root=tmp_path / "runs"), shown.append), _follow_plan(),
                  poll_s=0, recipe=recipe)
    ex.apply()
    said = [e for e in shown if isinstance(e, ev.Said) and e.lead in ("plan:", "ETA")]
    assert said[0].lead == "plan:" and "s per step" in said[0].text
    assert any(e.lead == "ETA" and "measured" in e.text for e in said)
    eta = json.loads((ex.record.path / "eta.json").read_text())
    assert eta["planned_step_s"] > 0 and eta["planned_tokens_per_s"] > 0
    assert eta["measured_step_s"] is not None and eta["measured_over_planned"] is not None
    assert ex.record.status()["eta"]["planned_step_s"] == eta["planned_step_s"]
    from ktdeploy.core.sizing.throughput import time_model_id
    assert eta["time_model"] == time_model_id()     # what `plan --from-run` checks before it scales by the ratio


def test_an_up_that_finds_the_crash_an_earlier_run_left_says_it_as_follow_does(tmp_path):
    """A detached run crashed; the next `up` (no --resume) reports it with the trainer's own exception and the whole
    log kept in its record, and the one restart: --resume auto."""
    from ktdeploy.core.plan.params import CrashParams

    log = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"/x/trainer.py\", line 7, in step\n"
           "[rank0]: ValueError: loss is nan\n")
    conn = FakeConnector().on(("docker", "logs"), ok(log)).on(("sh", "-c", FOLLOW_SCRIPT), _snap("exited", exit_code=1))
    plan = _plan(Step("train.crashed", "training container job1", action=StepAction.FAIL, params=CrashParams()))
    ex = _executor(conn, plan, tmp_path)
    with pytest.raises(StepError) as e:
        ex.apply()
    kept = ex.record.path / "artifacts" / "container.log"
    assert kept.read_text() == log
    assert e.value.message.startswith(f"TRAIN: the trainer crashed: ValueError: loss is nan (/x/trainer.py:7); full "
                                      f"log: {kept}"), e.value.message
    assert "--resume auto" in e.value.fix


@pytest.mark.parametrize("skipped,want", [(None, "ktdeploy chat R1 (talk to it), ktdeploy eval R1 (base vs tuned)"),
                                          ("deploy.serve.enabled is false", "ktdeploy status --run R1")])
def test_a_finished_up_names_the_next_command(skipped, want):
    from ktdeploy.controller.up_phases import next_step

    plan = Plan(host="h", recipe="r", job="job1", image="img", variant=None, output_dir="/out",
                adapter_dir="/out/adapter", job_dir="/job",
                stages=(Stage("TRAIN", "train", ()), Stage("SERVE", "serve", (), skipped=skipped)))
    assert next_step(plan, "R1") == want
