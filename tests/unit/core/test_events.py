"""Every event a run of `up` tells (core/events.py): its run-record name and fields — the ones `ktdeploy
status`/`logs`, the tests and people read in events.jsonl, as the controller wrote them before the events were
typed — and the line(s) it shows as (cli/events_view.py; checked there). A new event type fails here until it is
added to the table."""

from __future__ import annotations

import inspect

from ktdeploy.core import events as ev
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.sched.slurm import JobInfo
from ktdeploy.core.trainer_log import LogEntry, describe


def _check(name: str, status: str = "fail", detail: str = "", layer: str | None = None) -> CheckResult:
    return CheckResult(name=name, status=status, detail=detail, layer=layer)


ENTRY = LogEntry(current_steps=2, total_steps=3, loss=0.5, throughput=200.0, remaining_time="0:00:01")
JOB = JobInfo(job_id="42", state="RUNNING", nodes="n1")
# (event, record name, record fields, shown lines): the lines as `up` printed them (markup gone)
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
    # what is only shown: a Said line as its emitter writes it (controller/up_host.py, sync.py, executor.py,
    # slurm_jobs.py, up_phases.py), each as `up` printed the event it replaces
    (ev.Said(ev.Mark.NOT, "/l -> /t happens at the real run (not connected)", "SYNC"), None, None,
     ["- SYNC: /l -> /t happens at the real run (not connected)"]),
    (ev.SyncStarted(role="model"), "stage_start", ("stage", "role"), []),
    (ev.Said(ev.Mark.NOT, f"would upload {ev.files_text(4, 4, 3 << 20)} from /l to /t (dry run)", "SYNC"), None, None,
     ["- SYNC: would upload 4 of 4 file(s), 3.0 MiB from /l to /t (dry run)"]),
    (ev.Said(ev.Mark.NOT, f"would upload {ev.files_text(4, 0, 0)} from /l to /t (dry run)", "SYNC"), None, None,
     ["- SYNC: would upload all 4 file(s) already there from /l to /t (dry run)"]),
    (ev.Said(ev.Mark.GO, f"upload {ev.files_text(6, 5, 65 << 20)} from /l to /t on h", "SYNC"), None, None,
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
    (ev.SlurmCheck(check=CheckResult(name="slurm.cgroup", status="warn", detail="ConstrainCores is not set",
                                     fix="set ConstrainCores=yes in cgroup.conf")), "slurm_check",
     ("name", "status", "detail", "data"),
     ["! PREFLIGHT: slurm.cgroup: ConstrainCores is not set", "  fix: set ConstrainCores=yes in cgroup.conf"]),
    (ev.SlurmCheck(check=_check("slurm.runtime", "pass", "podman 4.3.1")), "slurm_check",
     ("name", "status", "detail", "data"), ["✓ PREFLIGHT: slurm.runtime: podman 4.3.1"]),
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
    (ev.Said(ev.Mark.GO, "create [/x] it", "TRAIN"), None, None, ["→ TRAIN: create [/x] it"]),
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
    (ev.Said(ev.Mark.OK, "fetched a.png -> /r/artifacts/a.png", "FOLLOW"), None, None,
     ["✓ FOLLOW: fetched a.png -> /r/artifacts/a.png"]),
    (ev.Said(ev.Mark.OK, "job-serve is running", "SERVE"), None, None, ["✓ SERVE: job-serve is running"]),
    (ev.Said(ev.Mark.GO, "waiting for job-serve answers /health", "SERVE"), None, None,
     ["→ SERVE: waiting for job-serve answers /health"]),
    (ev.Said(ev.Mark.OK, "job-serve answers /health", "SERVE"), None, None, ["✓ SERVE: job-serve answers /health"]),
    (ev.Following("started", container="job"), None, None, []),
    (ev.Following("status", status="running"), None, None, []),
    (ev.Progress(entry=ENTRY), "progress", ("current_steps", "total_steps", "loss", "remaining_time", "throughput"),
     ["  step 2/3  loss 0.5000  200 tok/s  eta 0:00:01"]),
    (ev.Following("ended"), None, None, []),
    (ev.Waiting("started", "IMAGE", "checking ktsft:amx in a container"), None, None, []),   # EventView draws it
    (ev.Waiting("ended", "IMAGE"), None, None, []),
    (ev.TrainExited(exit_code=0, oom_killed=False, status="exited"), "train_exited",
     ("exit_code", "oom_killed", "status"), []),
    (ev.AgentRecordRead(dir="/d", state="succeeded", rc=0, steady_tokens_per_s=9.5), "agent_record",
     ("dir", "state", "rc", "steady_tokens_per_s"), []),
    (ev.Said(ev.Mark.OK, f"training finished: {describe(ENTRY)}"), None, None,
     ["✓ training finished: step 2/3  loss 0.5000  200 tok/s  eta 0:00:01"]),
    (ev.Said(ev.Mark.OK, f"training finished: {describe(None)}"), None, None,
     ["✓ training finished: waiting for the first log line"]),
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
    (ev.Said(ev.Mark.OK, "training job 42 finished on n1"), None, None, ["✓ training job 42 finished on n1"]),
    (ev.Said(ev.Mark.GO, "waiting for the convert job", "CONVERT"), None, None,
     ["→ CONVERT: waiting for the convert job"]),
    (ev.Said(ev.Mark.OK, "convert the adapter (job 43)", "CONVERT"), None, None,
     ["✓ CONVERT: convert the adapter (job 43)"]),
    (ev.EvalStarted(samples=3, url="http://h:1/v1", tuned="m:l", base="m", source="holdout"), "eval_start",
     ("samples", "url", "tuned", "base", "source", "base_why"),
     ["→ EVAL: 3 sample(s) from holdout against http://h:1/v1 (tuned m:l, base m)"]),
    (ev.EvalStarted(samples=3, url="u", tuned="m", base=None, source="holdout", base_why="merged"), "eval_start",
     ("samples", "url", "tuned", "base", "source", "base_why"),
     ["→ EVAL: 3 sample(s) from holdout against u (tuned m; no base: merged)"]),
    (ev.EvalProgressed(done=2, total=4, eta_s=3.2, failed=1), None, None, ["  eval 2/4, eta 3 s, 1 failed"]),
    (ev.EvalFinished(summary_file="/r/eval/t/summary.json", samples_file="/r/eval/t/samples.jsonl",
                     tuned={"rouge-l": 60.0}, base={"rouge-l": 10.0}, failed=0, below=None), "eval",
     ("summary_file", "samples_file", "tuned", "base", "failed", "below"),
     ["✓ EVAL: tuned rouge-l 60.0; base rouge-l 10.0 -> /r/eval/t/summary.json"]),
    (ev.EvalFinished(summary_file="/s", samples_file="/x", tuned={"rouge-l": 5.0}, base=None, failed=2,
                     below="tuned rouge-l 5.00 < deploy.eval.fail_below 20"), "eval",
     ("summary_file", "samples_file", "tuned", "base", "failed", "below"),
     ["✗ EVAL: tuned rouge-l 5.0 (2 failed) -> /s",
      "tuned rouge-l 5.00 < deploy.eval.fail_below 20; the server keeps running"]),
    (ev.EvalNotRun(why="connection refused", fix="start it"), "eval_failed", ("why", "fix"),
     ["! EVAL did not finish: connection refused (the server keeps running)", "  fix: start it"]),
    (ev.Detached(reason="interrupted (Ctrl-C)", job="job", host="h", terminated=False), "detached", ("reason",),
     ["Stopped following; the training container job keeps running on h.\n  ktdeploy status --host h   |   "
      "ktdeploy logs -f --host h   |   ktdeploy up (same args) to go on"]),
    (ev.Detached(reason="terminated (SIGTERM)", job="job", host="h", terminated=True), "detached", ("reason",), []),
    (ev.Said(ev.Mark.STARTED, "Follow it: ktdeploy status --host h; ktdeploy logs -f --host h",
             lead="Training started in job on h."), None, None,
     ["Training started in job on h. Follow it: ktdeploy status --host h; ktdeploy logs -f --host h"]),
    (ev.Said(ev.Mark.DONE, "adapter /out/a; run record /r", lead="done:"), None, None,
     ["done: adapter /out/a; run record /r"]),
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


def test_each_event_keeps_its_record_name_and_fields():
    wrong = [f"{type(e).__name__}: {e.KIND} {tuple(e.record())} (want {kind} {fields})" for e, kind, fields, _ in CASES
             if (e.KIND, tuple(e.record()) if kind else None) != (kind, fields)]
    assert not wrong, "\n".join(wrong)


def test_a_record_holds_plain_json_values():
    import json

    for e, kind, _fields, _shown in CASES:
        if kind:
            assert json.loads(json.dumps(e.record())) == e.record(), type(e).__name__
