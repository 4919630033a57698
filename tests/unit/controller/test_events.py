"""What `up` tells: the controller emits typed events (core/events.py) through controller/emitter.Emitter, which
writes the run record's event; the CLI (cli/events_view.py) is the one renderer. The controller holds no rich
markup, no esc() and no rich import, and writes no run-record event but through the emitter; each event keeps
the record name and fields `ktdeploy status`/`logs` and the tests read, and shows as the line it always did."""

from __future__ import annotations

import ast
import inspect
import io
import re
from pathlib import Path

from ktdeploy.cli.events_view import EventView, lines, plain_lines
from ktdeploy.cli.output import SafeConsole
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import events as ev
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.sched.slurm import JobInfo
from ktdeploy.core.trainer_log import LogEntry

CONTROLLER = Path(__file__).resolve().parents[3] / "ktdeploy" / "controller"
# a rich markup tag: [green], [/yellow], [bold yellow], [dim], [/] ...
TAG = re.compile(r"\[/\]|\[/?(?:bold|dim|italic|underline|reverse|strike|blink|not|on|link|"
                 r"green|yellow|red|cyan|magenta|blue|white|black|bright_\w+)\b[^\]\n]*\]")


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(CONTROLLER.rglob("*.py"))]


def _strings(tree: ast.Module) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_controller_holds_no_markup_no_esc_and_no_rich():
    bad = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.name}: imports {n}" for n in names if n == "rich" or n.startswith(("rich.", "ktdeploy.core.markup"))]
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "esc":
                bad.append(f"{path.name}:{node.lineno}: esc()")
        bad += [f"{path.name}: markup {m.group()!r} in {s[:60]!r}" for s in _strings(tree) for m in TAG.finditer(s)]
    assert not bad, "\n".join(bad)


def test_the_markup_check_sees_what_the_controller_used_to_hold():
    old = ast.parse('from ktdeploy.core.markup import esc\nsay(f"[green]✓[/green] {esc(x)} [dim](y)[/dim]")\n'
                    'say(f"[bold yellow]WARNING: z[/]")')
    assert [m.group() for s in _strings(old) for m in TAG.finditer(s)] == ["[green]", "[/green]", "[dim]", "[/dim]",
                                                                         "[bold yellow]", "[/]"]
    assert not [m for s in ('a list[str]', 'checks [] waived', 'x[i]', 'parts[0]') for m in TAG.finditer(s)]


def test_only_the_emitter_writes_run_record_events():
    """RunRecord.event (its body formats with core.run_record's ``rr.event``) is called by the emitter alone."""
    calls = [f"{p.name}:{n.lineno}" for p, tree in _sources() if p.name != "emitter.py" for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "event"
             and getattr(n.func.value, "id", None) != "rr"]
    assert not calls, calls


# -- every event: its record (name, fields) and its line(s) --------------------------------------------------------
def _check(name: str, status: str = "fail", detail: str = "", layer: str | None = None) -> CheckResult:
    return CheckResult(name=name, status=status, detail=detail, layer=layer)


ENTRY = LogEntry(current_steps=2, total_steps=3, loss=0.5, throughput=200.0, remaining_time="0:00:01")
JOB = JobInfo(job_id="42", state="RUNNING", nodes="n1")
# (event, record name, record fields, shown lines): the names and fields as the controller wrote them before the
# events were typed; the lines as `up` printed them (markup gone)
CASES = [
    (ev.WaiversRecorded(checks=("gpu.present", "docker.memlock"), profile="cpu-only", also=("docker.memlock",),
                        status_file="/r/status.json"), "waived", ("checks", "profile"),
     ["CPU-only test profile: the GPU checks are waived here and in the containers, which start without GPUs — "
      "recorded in /r/status.json", "WARNING: also waiving checks docker.memlock — recorded in /r/status.json"]),
    (ev.WaiversRecorded(checks=("x.y",), profile=None, also=("x.y",), status_file="/r/status.json"), "waived",
     ("checks", "profile"), ["WARNING: waiving checks x.y — recorded in /r/status.json"]),
    (ev.ConnectStarted(host="gpu01"), "stage_start", ("stage", "step", "host"), []),
    (ev.PlanningFromFacts(path="/f.json", host="gpu01"), "facts_file", ("path",),
     ["- PREFLIGHT: not connecting to gpu01; planning from the facts in /f.json"]),
    (ev.Connected(connector="ssh://root@h:22"), "connected", ("connector",),
     ["✓ PREFLIGHT: connected to ssh://root@h:22"]),
    (ev.SyncDeferred(local="/l", target="/t"), None, None,
     ["- SYNC: /l -> /t happens at the real run (not connected)"]),
    (ev.SyncStarted(role="model"), "stage_start", ("stage", "role"), []),
    (ev.SyncPlanned(local="/l", remote="/t", files=4, missing=4, missing_bytes=3 << 20), None, None,
     ["- SYNC: would upload 4 of 4 file(s), 3.0 MiB from /l to /t (dry run)"]),
    (ev.SyncPlanned(local="/l", remote="/t", files=4, missing=0, missing_bytes=0), None, None,
     ["- SYNC: would upload all 4 file(s) already there from /l to /t (dry run)"]),
    (ev.SyncUploading(local="/l", remote="/t", host="h", files=6, missing=5, missing_bytes=65 << 20), None, None,
     ["→ SYNC: upload 5 of 6 file(s), 65.0 MiB from /l to /t on h"]),
    (ev.Synced(role="model", local="/l", remote="/t", files=6, bytes=2 << 30, copied=0, seconds=1.5, notes=(),
               dry_run=False), "sync", ("role", "local", "remote", "files", "bytes", "copied", "seconds", "notes",
                                        "dry_run"),
     ["✓ SYNC: /t holds the 6 file(s) of /l (2.00 GiB), checked by size and SHA-256"]),
    (ev.Synced(role="data", local="/l", remote="/t", files=1, bytes=1, copied=1, seconds=0, notes=(), dry_run=True),
     "sync", ("role", "local", "remote", "files", "bytes", "copied", "seconds", "notes", "dry_run"), []),
    (ev.DoctorVerdict(where="h", summary={"pass": 1}, summary_text="1 pass, 0 fail", failed=("disk.output",),
                      waived=(_check("gpu.present", detail="no GPU"),),
                      deferred=(_check("docker.present", detail="docker is not installed"),), blocking=True),
     "doctor", ("summary", "failed", "waived"),
     ["✗ PREFLIGHT: doctor on h: 1 pass, 0 fail", "  waived gpu.present: no GPU",
      "  to repair docker.present: docker is not installed -> the RUNTIME stage installs what is missing"]),
    (ev.SlurmFit(check=_check("slurm.fit", "pass", "2 node(s) fit")), "slurm_fit", ("status", "detail", "data"),
     ["✓ PREFLIGHT: slurm.fit: 2 node(s) fit"]),
    (ev.PlanText(text="the plan"), None, None, []),
    (ev.DryRun(stops_at="IMAGE"), "dry_run", ("stops_at",), []),
    (ev.SlurmDryRun(), "dry_run", (), []),
    (ev.Interrupted(reason="interrupted (Ctrl-C) before anything started on the host"), "interrupted", ("reason",),
     []),
    (ev.Failed(stage="PREFLIGHT", error="CheckFailed", message="m", fix="f", failed_checks=("a.b",)), "failed",
     ("stage", "error", "message", "fix", "failed_checks"), []),
    (ev.ResumeNote(note="--resume auto: from checkpoint-10"), "resume_note", ("note",),
     ["note: --resume auto: from checkpoint-10"]),
    (ev.StageSkipped(stage="RUNTIME", reason="a [b] reason"), "stage_skipped", ("stage", "reason"),
     ["- RUNTIME: skipped (a [b] reason)"]),
    (ev.StageStarted(stage="IMAGE"), "stage_start", ("stage",), []),
    (ev.StageDone(stage="IMAGE"), "stage_done", ("stage",), []),
    (ev.StepSatisfied(stage="IMAGE", step="image.pull", why="present [x]", title="image [/y]"), "step_satisfied",
     ("stage", "step", "why"), ["✓ IMAGE: image [/y] (already satisfied: present [x])"]),
    (ev.StepProbed(stage="RUNTIME", step="runtime.docker", probe=("docker", "info"), title="docker engine"),
     "step_satisfied", ("stage", "step", "why", "probe"), ["✓ RUNTIME: docker engine (already satisfied)"]),
    (ev.StepStarted(stage="TRAIN", step="train.create", command="docker create x"), "step_start",
     ("stage", "step", "command"), []),
    (ev.StepRunning(stage="TRAIN", title="create [/x] it"), None, None, ["→ TRAIN: create [/x] it"]),
    (ev.StepDone(stage="TRAIN", step="train.create", seconds=0.1), "step_done", ("stage", "step", "seconds"), []),
    (ev.StepFailed(stage="TRAIN", step="train.create", message="m", rc=125, output="o"), "step_failed",
     ("stage", "step", "message", "rc", "output"), []),
    (ev.ImageChecked(image="ktsft:amx", summary={"pass": 1}, summary_text="1 pass (1 waived)", failed=(),
                     waived=(_check("gpu.present", detail="no [GPU]", layer="container"),),
                     checks=(_check("gpu.present", detail="no [GPU]", layer="container"),)),
     "image_check", ("image", "summary", "failed", "waived", "checks"),
     ["  waived gpu.present (container): no [GPU]", "  image check: 1 pass (1 waived)"]),
    (ev.ImageChecked(image="i", summary={}, summary_text="1 fail", failed=("stack.torch",), waived=(), checks=()),
     "image_check", ("image", "summary", "failed", "waived", "checks"), []),
    (ev.StackRefused(stage="IMAGE", step="image.check", message="m",
                     findings=(Finding(severity="error", path="train.x", message="no"),)),
     "step_failed", ("stage", "step", "message", "findings"), []),
    (ev.ImageNotReady(stage="IMAGE", step="image.check", message="1 check(s) failed in i"), "step_failed",
     ("stage", "step", "message"), []),
    (ev.FetchMissing(step="fetch.x", remote="/out/x"), "fetch_missing", ("step", "remote"), []),
    (ev.FetchRefused(step="fetch.x", remote="/out/x.json", why="is a symbolic link", stage="FOLLOW"),
     "fetch_refused", ("step", "remote", "why"), ["! FOLLOW: not fetched: /out/x.json is a symbolic link"]),
    (ev.Fetched(stage="FOLLOW", name="a.png", dest="/r/artifacts/a.png"), None, None,
     ["✓ FOLLOW: fetched a.png -> /r/artifacts/a.png"]),
    (ev.ContainerRunning(stage="SERVE", container="job-serve"), None, None, ["✓ SERVE: job-serve is running"]),
    (ev.StepWaiting(stage="SERVE", title="job-serve answers /health"), None, None,
     ["→ SERVE: waiting for job-serve answers /health"]),
    (ev.EndpointReady(stage="SERVE", title="job-serve answers /health"), None, None,
     ["✓ SERVE: job-serve answers /health"]),
    (ev.FollowStarted(container="job"), None, None, []),
    (ev.ContainerStatus(status="running"), None, None, []),
    (ev.Progress(entry=ENTRY), "progress", ("current_steps", "total_steps", "loss", "remaining_time", "throughput"),
     ["  step 2/3  loss 0.5000  200 tok/s  eta 0:00:01"]),
    (ev.FollowEnded(), None, None, []),
    (ev.TrainExited(exit_code=0, oom_killed=False, status="exited"), "train_exited",
     ("exit_code", "oom_killed", "status"), []),
    (ev.AgentRecordRead(dir="/d", state="succeeded", rc=0, steady_tokens_per_s=9.5), "agent_record",
     ("dir", "state", "rc", "steady_tokens_per_s"), []),
    (ev.TrainingFinished(entry=ENTRY), None, None,
     ["✓ training finished: step 2/3  loss 0.5000  200 tok/s  eta 0:00:01"]),
    (ev.TrainingFinished(entry=None), None, None, ["✓ training finished: waiting for the first log line"]),
    (ev.Crashed(container="job", state=ContainerState(status="exited", exit_code=137), last_lines=("Killed",)),
     "crash", ("container", "state", "last_lines"), []),
    (ev.SlurmSubmitted(role="train", job_id="42", argv=("sbatch", "x")), "slurm_submitted",
     ("role", "job_id", "argv"), ["  submitted train job 42"]),
    (ev.SlurmJobState(role="train", job=JOB), "slurm_job", ("role", "job_id", "state", "nodes", "restarts", "reason"),
     ["  job 42 RUNNING on n1"]),
    (ev.SlurmStarted(role="train", job_id="42", nodes="n1", seconds_after_submit=1.0), "slurm_started",
     ("role", "job_id", "nodes", "seconds_after_submit"), []),
    (ev.SlurmReadMissed(role="train", job_id="42", attempt=1, error="lost"), "slurm_read_missed",
     ("role", "job_id", "attempt", "error"), []),
    (ev.SlurmTrainExited(job=JOB), "train_exited", ("job", "exit_code", "state"), []),
    (ev.SlurmJobFailed(role="train", job=JOB, last_lines=("x",)), "slurm_job_failed", ("role", "job", "last_lines"),
     []),
    (ev.SlurmTrainingFinished(job_id="42", nodes="n1"), None, None, ["✓ training job 42 finished on n1"]),
    (ev.SlurmWaiting(stage="CONVERT", role="convert"), None, None, ["→ CONVERT: waiting for the convert job"]),
    (ev.SlurmJobDone(stage="CONVERT", title="convert the adapter", job_id="43"), None, None,
     ["✓ CONVERT: convert the adapter (job 43)"]),
    (ev.Detached(reason="interrupted (Ctrl-C)", job="job", host="h", terminated=False), "detached", ("reason",),
     ["Stopped following; the training container job keeps running on h.\n  ktdeploy status --host h   |   "
      "ktdeploy logs -f --host h   |   ktdeploy up (same args) to go on"]),
    (ev.Detached(reason="terminated (SIGTERM)", job="job", host="h", terminated=True), "detached", ("reason",), []),
    (ev.StartedDetached(job="job", host="h"), None, None,
     ["Training started in job on h. Follow it: ktdeploy status --host h; ktdeploy logs -f --host h"]),
    (ev.Done(adapter_dir="/out/a", record_path="/r"), None, None, ["done: adapter /out/a; run record /r"]),
    (ev.Cancelled(reason="terminated (SIGTERM)", jobs={"train job 1": "cancelled", "convert job 2": "cancelled"}),
     "cancelled", ("reason", "jobs"), ["Terminated: cancelled train job 1: cancelled, convert job 2: cancelled."]),
    (ev.ContainerRemoved(container="job"), "down", ("container",), []),
    (ev.SlurmJobStopped(slurm_job="42", role="train", log="/j/train-42.out"), "down", ("slurm_job", "role", "log"),
     []),
]


def _event_types() -> set[type]:
    return {c for _, c in inspect.getmembers(ev, inspect.isclass) if issubclass(c, ev.Event) and c is not ev.Event}


def test_every_event_type_is_pinned_here():
    assert {type(e) for e, *_ in CASES} == _event_types()


def test_each_event_keeps_its_record_and_its_line(tmp_path):
    wrong = []
    for n, (event, kind, fields, shown) in enumerate(CASES):
        record = RunRecord.create(f"r{n}", root=tmp_path)
        Emitter(record).emit(event)
        written = [{k: v for k, v in e.items() if k != "ts"} for e in record.events()]
        expected = [{"event": kind, **event.record()}] if kind else []
        if (event.KIND, written, tuple(written[0])[1:] if written else None, plain_lines(event)) != \
                (kind, expected, fields, shown):
            wrong.append(f"{type(event).__name__}: record {written} (want {kind} {fields}), lines {plain_lines(event)}")
    assert not wrong, "\n".join(wrong)


def test_outside_values_are_escaped_once_in_the_renderer():
    e = ev.Fetched(stage="FOLLOW", name="[bold]x[/bold]", dest="/r/[/]")
    assert lines(e) == [r"[green]✓[/green] FOLLOW: fetched \[bold]x\[/bold] -> /r/\[/]"]
    assert plain_lines(e) == ["✓ FOLLOW: fetched [bold]x[/bold] -> /r/[/]"]


def test_every_event_is_recorded_or_shown():
    for event, kind, _fields, shown in CASES:
        assert kind or shown or isinstance(event, (ev.PlanText, ev.FollowStarted, ev.ContainerStatus, ev.FollowEnded)), \
            type(event).__name__


# -- the view: lines, the progress bar, the plan ------------------------------------------------------------------
def _console(terminal: bool = False) -> SafeConsole:
    return SafeConsole(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)


def _follow(view: EventView) -> None:
    view(ev.FollowStarted(container="job"))
    view(ev.ContainerStatus(status="running"))
    for step in (1, 2, 3):
        view(ev.Progress(entry=LogEntry(current_steps=step, total_steps=3, loss=1 / step, remaining_time="0:00:00")))
    view(ev.ContainerStatus(status="exited"))
    view(ev.FollowEnded())
    view(ev.TrainingFinished(entry=LogEntry(current_steps=3, total_steps=3, loss=1 / 3)))


def test_without_a_bar_progress_is_lines():
    con = _console()
    _follow(EventView(con))
    assert con.file.getvalue().splitlines() == ["  step 1/3  loss 1.0000  eta 0:00:00", "  step 2/3  loss 0.5000  eta 0:00:00",
                                                "  step 3/3  loss 0.3333  eta 0:00:00",
                                                "✓ training finished: step 3/3  loss 0.3333"]


def test_with_a_bar_progress_is_the_bar():
    con = _console(terminal=True)
    _follow(EventView(con, bar=True))
    out = con.file.getvalue()
    assert "3/3" in out and "loss 0.3333" in out and "exited" in out and "job" in out
    assert "  step 1/3" not in out and out.rstrip().endswith("✓ training finished: step 3/3  loss 0.3333")


def test_long_lines_wrap_at_spaces_with_their_continuation_indented():
    con = _console()
    view = EventView(con)
    view(ev.Done(adapter_dir="/out/" + "a" * 40, record_path="/r/" + "b" * 90))
    view(ev.PlanText(text="[red]plan[/red] " + "word " * 30))
    *done, plan = con.file.getvalue().splitlines()
    assert done == ["done: adapter /out/" + "a" * 40 + "; run record", "    /r/" + "b" * 90]   # a path stays whole
    assert plan == "[red]plan[/red] " + "word " * 30          # the plan is printed as it is
