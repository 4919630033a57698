"""Apply a Plan through a connector: each step is skipped when satisfied (known at plan time, or its probe exits
0), else run; every outcome is an event in the run record. The only module of ``up`` that changes a host."""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.eta_plan import planned_eta
from ktdeploy.controller.eval_stage import run_eval_step
from ktdeploy.controller.host_files import FETCHABLE_SH, MAX_FETCH, MISSING, fetch_checked  # noqa: F401 (FETCHABLE_SH: tests)
from ktdeploy.controller.image_check import image_doctor
from ktdeploy.controller.loss_plot import write_loss_png
from ktdeploy.controller.runs import RunRecord
from ktdeploy.controller.slurm_jobs import do_follow_job, do_submit, do_wait_job
from ktdeploy.core import events as ev
from ktdeploy.core import markers
from ktdeploy.core import run_record as rr
from ktdeploy.core.checkpoints import TRAINER_LOG
from ktdeploy.core.checks.gate import profile_hint
from ktdeploy.core.checks.stack import JUDGE
from ktdeploy.core.errors import CheckFailed, ConnectError, KtdeployError, RecipeError, StepError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.loss_curve import curve
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.params import (
    ContainerLogParams,
    CrashParams,
    FollowParams,
    ImageCheckParams,
    RunParams,
    SecretParams,
    WaitHttpParams,
    WaitRunningParams,
)
from ktdeploy.core.plan.state import ContainerState, parse_container_state
from ktdeploy.core.plan.steps import Plan, Stage, Step, StepAction
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.safeio import read_text, redact, write_file
from ktdeploy.core.trainer_log import LogEntry, describe, latest

# The snapshot's framing (FOLLOW_SH, parse_follow) lives in core/markers.py: every part is framed and the
# script ends with '@@end', so output cut short (the connection dropped mid-command) is told apart from a
# complete answer. docker inspect's own exit status and message come back too, so only a positive
# "No such container" from a live connection reads as "the container is gone".
FOLLOW_SCRIPT = markers.FOLLOW_SH

NO_SUCH_CONTAINER = ("no such container", "no such object")


@dataclass
class Snapshot:
    state: ContainerState | None      # None only when docker answered "No such container"
    entry: LogEntry | None


def parse_snapshot(rc: int, stdout: str, stderr: str = "", *, host: str = "the host",
                   timeout: float | None = None) -> Snapshot:
    """Classify one FOLLOW_SCRIPT answer (pure). Returns the container's state (None: docker said "No such
    container") and the last trainer_log entry. Raises ConnectError when the answer is not a complete one from a
    live connection (cut short, the channel closed without an exit status, the script's exit status non-zero) or
    when docker could not answer about the container (daemon down, permission): training may well still run,
    so neither is ever read as "the container was removed"."""
    lost_fix = "Training (if started) keeps running on the host; re-run `ktdeploy up` (same arguments) to follow it."
    if rc == 124 and not markers.is_complete(stdout):
        raise ConnectError(f"{host} did not answer within {timeout or 0:.0f}s (connection lost?)", fix=lost_fix)
    frame = markers.parse_follow(stdout)
    if rc != 0 or frame is None:
        why = (stderr.strip().splitlines() or [f"exit status {rc}, {len(stdout)} bytes of output"])[-1]
        raise ConnectError(f"connection to {host} lost while reading the training container's state ({why})",
                           fix=lost_fix)
    try:
        inspect_rc = int(frame.inspect_rc)
    except ValueError:
        raise ConnectError(f"unreadable answer from {host}: {stdout.splitlines()[0][:80]!r}", fix=lost_fix) from None
    text = "\n".join(frame.inspect).strip()
    entry = latest("\n".join(frame.log))
    if inspect_rc == 0:
        state = parse_container_state(text.splitlines()[0] if text else "")
        if state is None:
            raise ConnectError(f"docker on {host} gave an unreadable container state: {text[:120]!r}", fix=lost_fix)
        return Snapshot(state, entry)
    if any(m in text.lower() for m in NO_SUCH_CONTAINER):
        return Snapshot(None, entry)
    reason = (text.splitlines() or [f"docker inspect exited {inspect_rc}"])[-1]
    raise ConnectError(f"could not read the training container's state on {host}: {reason}",
                       fix="Check the docker daemon there (`docker info`). " + lost_fix)


def snapshot(conn: Connector, container: str, log: str, timeout: float | None = None) -> Snapshot:
    """Container state + last trainer_log entry in one round trip; a host silent for ``timeout`` seconds
    (KTDEPLOY_FOLLOW_TIMEOUT_S, default 60) is a lost connection (ConnectError, never "container removed")."""
    timeout = timeout or float(os.environ.get("KTDEPLOY_FOLLOW_TIMEOUT_S", 60))
    r = conn.run(["sh", "-c", FOLLOW_SCRIPT, "ktdeploy-follow", container, log], timeout=timeout)
    return parse_snapshot(r.rc, r.stdout, r.stderr, host=conn.name, timeout=timeout)


def agent_record(conn: Connector, output_dir: str, timeout: float = 60) -> tuple[str, rr.AgentRecord] | None:
    """The newest agent run record of ``output_dir`` (``ktdeploy train``'s, in the image: on the host when the
    output dir's parent is on the output volume) read through the connector: (its folder, the record), or None
    when there is none or the answer was cut short."""
    r = conn.run(["sh", "-c", markers.FILES_SH, "ktdeploy-files", JobLayout(output_dir).agent_runs, *rr.AGENT_FILES],
                 timeout=timeout)
    got = markers.parse_files(r.stdout) if r.rc == 0 else None
    if got is None:
        return None
    folder, files = got
    return folder, rr.read_agent_record(files)


def container_logs(conn: Connector, name: str, tail: int | None = 200) -> str:
    r = conn.run(dk.logs(name, tail=tail), timeout=120)
    return (r.stdout + r.stderr) if r.rc == 0 else ""


BOX = "│┃╭╮╰╯─━┌┐└┘═║ "
# how the agent's own refusals begin in its log (cli/output.print_error prints "TYPE: message" flat)
REFUSALS = {"CheckFailed": "check", "RecipeError": "recipe", "UsageError": "recipe", "RunRecordError": "output"}


def flat_lines(lines: list[str]) -> list[str]:
    """A container's last log lines without a rich panel's borders (an image older than the flat errors printed
    its error in one): a box inside the crash report folds every line at 80 columns."""
    out = []
    for ln in lines:
        core = ln.strip()
        if core and all(c in BOX for c in core):
            continue          # a border line
        if core.startswith(("╭", "┌")):   # a top border with the panel's title (the error's type): "TYPE:"
            title = core.strip(BOX)
            if title:
                out.append(f"{title}:")
            continue
        if core.startswith(("│", "┃")):
            ln = core.strip("│┃ ").rstrip()
        out.append(ln)
    return out


def _refusal(lines: list[str]) -> str | None:
    """'check' | 'recipe' | 'output' when the agent refused before training (its doctor, the recipe, the output
    dir), from the error it printed; None for a crash of the trainer itself."""
    for ln in lines:
        head = ln.strip().split(":", 1)[0]
        if head in REFUSALS:
            return REFUSALS[head]
        if "this host cannot run the recipe" in ln:   # the agent's doctor, printed in a panel by older images
            return "check"
    return None


def exit_advice(state: ContainerState, recipe: Recipe | None = None, facts: HostFacts | None = None, lines: list[str] | tuple[str, ...] = (),
                progressed: bool | None = None, role: str = "train", command: str | None = None,
                trainer_error: str | None = None) -> str:
    """What to do about a stopped container, by how it stopped: the agent's own refusal (its doctor, the recipe,
    the output dir) needs a fix, an OOM the planner's knobs; then, always, the same `up` with --resume auto, which
    replaces the stopped container (``progressed``: kept for callers; the advice no longer depends on it;
    ``command``: that `up` spelled out, where the caller knows it — `status` of a detached run; ``trainer_error``:
    the trainer's own last exception, as TrainerException.line() gives it)."""
    # One restart story: a stopped training container stays until an `up` with --resume replaces it (the same
    # command without --resume only reports the crash again, host_plan's train.crashed), so every crash says so.
    same = f"`{command}`" if command else "the same `ktdeploy up` with --resume auto"
    again = (f"then run {same} (it replaces the stopped container and goes on from the newest complete checkpoint, "
             "or starts fresh when there is none)")
    if role == "serve":
        return "the server stopped: see its log lines above (`ktdeploy logs`), fix the cause, then run the same " \
               "`ktdeploy up` again."
    code = state.exit_code
    why = _refusal(list(lines))
    if why == "check":
        return ("the training container's own doctor refused this host before training (its failed checks are in "
                "the log lines above; nothing was trained). Fix them — `ktdeploy doctor --image IMAGE` shows the "
                f"container's view — or waive them as `up` did (--cpu-only, --waive NAME), {again}.")
    if why == "recipe":
        return f"the training container refused the recipe (see the error above); fix the recipe, {again}."
    if why == "output":
        return f"the training container refused the output dir (see the error above); fix it, {again}."
    if state.oom_killed:
        tip = "the container ran out of memory (OOM-killed)."
        try:
            from ktdeploy.core.sizing import plan_recipe
            from ktdeploy.core.sizing.advice import advise

            if recipe is None:
                raise LookupError("no recipe to plan")
            _plan, arch, _where = plan_recipe(recipe)
            avail = (facts.memory.total_bytes or 0) / 2**30 if facts is not None else 0
            adv = [a for a in advise((recipe.train, recipe.accelerate), arch, "host", avail) if a.fits] if avail else []
            if adv:
                tip += " The planner says these fit this host: " + "; or ".join(a.text() for a in adv[:3]) + "."
            else:
                tip += " Lower cutoff_len / per_device_train_batch_size or use a smaller expert weight format."
        except Exception:  # the planner needs the model's config.json; advice stays generic without it
            tip += " Lower cutoff_len / per_device_train_batch_size or use a smaller expert weight format."
        return f"{tip} {again[0].upper()}{again[1:]}."
    if code == 137:
        return ("the container was killed (SIGKILL: docker kill, or the host's OOM killer outside the container's "
                f"cgroup). Check `dmesg` on the host, {again}.")
    if code == 132:
        return ("Illegal instruction: the image's kt-kernel variant is above this CPU's ISA (AMX listed but unusable?). "
                f"Run `ktdeploy doctor`, set deploy.image: auto (or avx512), {again}.")
    if code == 139:
        return f"segmentation fault in the training process: see the log lines above; {again}."
    if needs_a_gpu(facts, trainer_error):
        # `up --cpu-only` with the real image: no rerun on this host gets further, so no restart story here
        return ("this host has no GPU, and the trainer needs one (attention and the LoRA train on CUDA): on a host "
                "without a GPU the path ends here, in TRAIN (docs/walkthrough.md, section 7). Train on a GPU host: "
                "the same `ktdeploy up` with that host's --host, without --cpu-only.")
    return f"see the last log lines above; fix the cause, {again}."


# what the real trainer says when it finds no GPU (transformers' TrainingArguments, torch's CUDA init)
_NO_GPU_ERROR = re.compile(r"doesn't support bf16/gpu|Found no NVIDIA driver|no CUDA GPUs are available|"
                           r"Torch not compiled with CUDA")


def needs_a_gpu(facts: HostFacts | None, trainer_error: str | None) -> bool:
    """The trainer stopped because the host has no GPU (the facts say none, the trainer's exception says so)."""
    return (facts is not None and facts.gpu.nvidia_smi != "unknown" and facts.gpu.count == 0
            and bool(trainer_error) and _NO_GPU_ERROR.search(trainer_error or "") is not None)




class Executor:
    def __init__(self, conn: Connector, events: Emitter, plan: Plan, *, recipe: Recipe | None = None,
                 facts: HostFacts | None = None, poll_s: float = 2.0) -> None:
        self.conn, self.plan = conn, plan
        self.record: RunRecord = events.record
        self.emit: ev.Sink = events.emit
        self.recipe, self.facts = recipe, facts
        self.poll_s = float(os.environ.get("KTDEPLOY_POLL_S", poll_s))
        self.jobs: dict[str, str] = {}              # up-slurm: role -> Slurm job id
        self.submitted_at: dict[str, float] = {}

    # -- the loop -------------------------------------------------------------------------------
    def apply(self) -> None:
        for stage in self.plan.stages:
            if stage.skipped:
                self.emit(ev.StageSkipped(stage=stage.name, reason=stage.skipped))
                continue
            self.emit(ev.StageStarted(stage=stage.name))
            self.record.set_status("running", stage=stage.name)
            for step in stage.steps:
                self.step(stage, step)
            self.emit(ev.StageDone(stage=stage.name))

    def step(self, stage: Stage, s: Step) -> None:
        if s.satisfied:
            self.emit(ev.StepSatisfied(stage=stage.name, step=s.id, why=s.why, title=s.title))
            return
        if s.probe:
            r = self.conn.run(list(s.probe), timeout=120)
            if r.rc == 0:
                self.emit(ev.StepProbed(stage=stage.name, step=s.id, probe=tuple(s.probe), title=s.title))
                return
        self.emit(ev.StepStarted(stage=stage.name, step=s.id, command=s.command()))
        t0 = time.monotonic()
        handler = self.handlers()[s.action]
        try:
            handler(stage, s)
        except StepError as e:
            e.step = e.step or s.id
            self.emit(ev.StepFailed(stage=stage.name, step=s.id, message=e.message, rc=e.rc,
                                    output=e.output[-2000:] if e.output else ""))
            raise
        self.emit(ev.StepDone(stage=stage.name, step=s.id, seconds=round(time.monotonic() - t0, 3)))

    # -- actions --------------------------------------------------------------------------------
    def _do_image_check(self, stage: Stage, s: Step) -> None:
        """doctor in the image with the training flags (the one implementation: controller/image_check.py); its
        failed checks, less the plan's waivers, stop `up` with doctor's report (CheckFailed: exit 1). When the only
        failure is the stack refusing the recipe (stack.judge), `up` stops with the stack's findings (RecipeError:
        exit 2), the same report as `ktdeploy check --stack`."""
        p = s.typed(ImageCheckParams)
        self.emit(ev.Waiting("started", stage.name, f"checking {p.image} in a container started with the training "
                                                   "flags (doctor, then the stack's judgement of the recipe)"))
        try:
            report = image_doctor(self.conn, p.image, recipe=self.recipe, gpus=list(p.gpus),
                                  user=p.user or "", memlock=p.memlock, name=p.name,
                                  host_facts=self.facts, replace_stale=bool(p.name))
        finally:
            self.emit(ev.Waiting("ended", stage.name))
        report.waived = tuple(self.plan.waived)
        failed, waived = report.failed, report.waived_failures
        self.emit(ev.ImageChecked(image=p.image, summary=report.summary(), summary_text=report.summary_text(),
                                  failed=tuple(c.name for c in failed), waived=tuple(waived),
                                  checks=tuple(report.checks)))
        refused = [c for c in failed if c.name == JUDGE and c.data.get("findings")]
        if failed and len(refused) == len(failed):
            # the stack itself refuses the recipe: the same report as `ktdeploy check --stack` (exit 2)
            findings = [Finding(**f) for f in refused[0].data["findings"]]
            self.emit(ev.StackRefused(stage=stage.name, step=s.id,
                                      message=f"the stack in {p.image} refuses the recipe", findings=tuple(findings)))
            raise RecipeError(f"{stage.name}: the stack in {p.image} (accelerate, LlamaFactory, kt-kernel) refuses "
                              "the recipe; nothing was trained", findings=findings, key=JUDGE,
                              fix="Fix the keys listed below (`ktdeploy check RECIPE --stack` prints the same "
                                  "report), or --waive stack.judge if the stack's verdict is wrong for this host.")
        if failed:
            self.emit(ev.ImageNotReady(stage=stage.name, step=s.id,
                                       message=f"{len(failed)} check(s) failed in {p.image}"))
            raise CheckFailed(f"{stage.name}: {p.image} is not ready on {self.plan.host}: "
                              f"{report.summary_text()}; nothing was trained",
                              results=failed, key="image.check",
                              fix=(f"{failed[0].fix.rstrip()} Then run the same command again."
                                   if len(failed) == 1 and failed[0].fix else  # one check: its own fix first
                                   "Fix the checks listed below (the image: `ktdeploy image build`; the host: "
                                   "`ktdeploy doctor --image " + p.image + "`).")
                                  + profile_hint(failed, self.facts.gpu.count if self.facts is not None else None))

    def handlers(self) -> dict[StepAction, Callable[[Stage, Step], None]]:
        """One handler per StepAction (a test checks none is missing)."""
        return {StepAction.RUN: self._do_run, StepAction.PUT: self._do_put, StepAction.PUT_SECRET: self._do_put_secret,
                StepAction.FETCH: self._do_fetch, StepAction.FOLLOW: self._do_follow, StepAction.FAIL: self._do_fail,
                StepAction.WAIT_RUNNING: self._do_wait_running, StepAction.WAIT_HTTP: self._do_wait_http,
                StepAction.IMAGE_CHECK: self._do_image_check,
                StepAction.EVAL: lambda st, s: run_eval_step(self, st, s),
                StepAction.SUBMIT: lambda st, s: do_submit(self, st, s),
                StepAction.FOLLOW_JOB: lambda st, s: do_follow_job(self, st, s),
                StepAction.WAIT_JOB: lambda st, s: do_wait_job(self, st, s)}

    @staticmethod
    def _argv(s: Step) -> list[str]:
        if s.argv is None:
            raise StepError(f"plan step {s.id} ({s.action}) has no argv", step=s.id, fix="a plan builder bug; report it")
        return list(s.argv)

    @staticmethod
    def _path(s: Step, side: str) -> str:
        p = s.local if side == "local" else s.remote
        if p is None:
            raise StepError(f"plan step {s.id} ({s.action}) has no {side} path", step=s.id,
                            fix="a plan builder bug; report it")
        return p

    def _do_run(self, stage: Stage, s: Step) -> None:
        self.emit(ev.Said(ev.Mark.GO, s.title, stage.name))
        r = self.conn.run(self._argv(s), timeout=s.timeout or 600)
        if s.id in rr.STEP_LOGS:   # its container is gone once it ends: `ktdeploy logs --stage` reads this copy
            write_file(self.record.path / rr.ARTIFACTS, rr.STEP_LOGS[s.id], redact(r.stdout + r.stderr),
                       overwrite=True)
        if r.rc != 0:
            # what the failed step leaves behind (the serving key file), removed first
            if isinstance(s.params, RunParams) and s.params.cleanup:
                self.conn.run(list(s.params.cleanup), timeout=60)
            tail = "\n".join((r.stderr.strip() or r.stdout.strip()).splitlines()[-15:])
            raise StepError(f"{stage.name} step '{s.title}' failed on {self.plan.host} (exit {r.rc}):\n{tail}",
                            step=s.id, rc=r.rc, output=tail,
                            fix=s.fix or f"Run it by hand on the host to see why: {s.command()}")

    def _do_fail(self, stage: Stage, s: Step) -> None:
        # a second `up` finds the training container stopped: why, and what to do
        if isinstance(s.params, CrashParams) and s.params.crash:
            name = self.plan.job   # the crash an earlier run (or nobody: --detach) left: said as FOLLOW says it
            write_file(self.record.path / rr.ARTIFACTS, rr.TRAIN_LOG, redact(container_logs(self.conn, name, tail=None)),
                       overwrite=True)
            what, advice = self._crash_details(name)
            raise StepError(f"{stage.name}: {self._trainer_reason(name)}{what}", step=s.id, fix=advice)
        raise StepError(f"{stage.name}: {s.why}", step=s.id, fix=s.fix)

    def _local(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else self.record.path / p

    def _do_put(self, stage: Stage, s: Step) -> None:
        src = self._local(self._path(s, "local"))
        if not src.is_file():  # a FIFO or device would hang the upload
            raise StepError(f"{stage.name}: {src} does not exist on this machine or is not a plain file", step=s.id,
                            fix="Pass an existing file (e.g. the tarball `ktdeploy image save` wrote).")
        self.emit(ev.Said(ev.Mark.GO, s.title, stage.name))
        self.conn.put_file(str(src), self._path(s, "remote"))

    def _do_put_secret(self, stage: Stage, s: Step) -> None:
        name = s.typed(SecretParams).env
        value = os.environ.get(name)
        if not value:
            raise StepError(f"{stage.name}: deploy.serve.api_key_env names {name}, which is not set here", step=s.id,
                            fix=f"export {name}=<key> in the shell that runs ktdeploy up")
        self.emit(ev.Said(ev.Mark.GO, s.title, stage.name))
        remote = self._path(s, "remote")
        fd, tmp = tempfile.mkstemp(prefix="ktdeploy-key-")
        try:
            with os.fdopen(fd, "w") as f:  # the file mkstemp just made (O_EXCL, 0600): nothing to follow
                f.write(f"{name}={value}\n")
            os.chmod(tmp, 0o600)
            # create the target 0600 first, so the key is never readable by others on the host, even briefly
            # (a link planted there is removed, never written through: noclobber creates with O_EXCL)
            self.conn.run(["sh", "-c", 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && rm -f -- "$1" && set -C '
                           '&& : > "$1"', "ktdeploy-key", remote], check=True, timeout=60)
            self.conn.put_file(tmp, remote, mode=0o600)
        finally:
            os.unlink(tmp)

    def _do_wait_http(self, stage: Stage, s: Step) -> None:
        """Poll the readiness probe until it answers, the container dies, or the timeout passes."""
        name = s.typed(WaitHttpParams).container
        self.emit(ev.Said(ev.Mark.GO, f"waiting for {s.title}", stage.name))
        deadline = time.monotonic() + (s.timeout or 1800)
        while True:
            if self.conn.run(self._argv(s), timeout=60).rc == 0:
                self.emit(ev.Said(ev.Mark.OK, s.title, stage.name))
                return
            snap = snapshot(self.conn, name, "/dev/null")
            if snap.state is None or not snap.state.running:
                what, advice = self._crash_details(name, role="serve")
                raise StepError(f"{stage.name}: {what}", step=s.id, fix=f"{s.fix} Also: {advice}" if s.fix else advice)
            if time.monotonic() > deadline:
                raise StepError(f"{stage.name}: {name} did not answer /health within {s.timeout:.0f} s", step=s.id,
                                fix=s.fix)
            time.sleep(2)

    def _do_fetch(self, stage: Stage, s: Step) -> None:
        dst = self._local(self._path(s, "local"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(s.params, ContainerLogParams) and s.params.docker_logs:
            write_file(dst.parent, dst.name, container_logs(self.conn, self._path(s, "remote"), tail=None), overwrite=True)
            return
        # a regular file, not a link (the trainer writes the output folder and could link ~/.ssh/id_* there; FETCH
        # runs after the training container exited, so nothing swaps it between this check and the copy), bounded
        why = fetch_checked(self.conn, self._path(s, "remote"), dst, MAX_FETCH)
        if why is not None:
            if s.optional and why == MISSING:
                self.emit(ev.FetchMissing(step=s.id, remote=s.remote))
                return
            if s.optional:
                self.emit(ev.FetchRefused(step=s.id, remote=s.remote, why=why, stage=stage.name))
                return
            raise StepError(f"{stage.name}: {s.remote} {why} on the host", step=s.id)
        self.emit(ev.Said(ev.Mark.OK, f"fetched {os.path.basename(self._path(s, 'remote'))} -> {dst}", stage.name))
        if dst.name == TRAINER_LOG:   # the run record's loss curve (artifacts/loss.png; matplotlib: the plot extra)
            png = write_loss_png(dst.parent, curve(read_text(dst, MAX_FETCH, TRAINER_LOG)), self.plan.job)
            if png is not None:
                self.emit(ev.Said(ev.Mark.OK, f"fetched {png.name} -> {png}", stage.name))

    def _fetch_agent_record(self, output_dir: str) -> None:
        """Best effort: the agent's own record of the run (state, rc, summary) into the run record."""
        try:
            got = agent_record(self.conn, output_dir)
        except (KtdeployError, OSError):
            return
        if got is None:
            return
        folder, rec = got
        data = {"dir": folder, "state": rec.state, "rc": rec.rc, "launch_mode": rec.launch_mode,
                "summary": rec.summary, "ranks": rec.ranks}
        self.record.write_json(f"{rr.ARTIFACTS}/agent_record.json", data)
        self.emit(ev.AgentRecordRead(dir=folder, state=rec.state, rc=rec.rc,
                                     steady_tokens_per_s=rec.summary.get("steady_tokens_per_s")))

    def _do_wait_running(self, stage: Stage, s: Step) -> None:
        wait = s.typed(WaitRunningParams)
        name = wait.container
        time.sleep(float(wait.seconds))
        snap = snapshot(self.conn, name, "/dev/null")
        if snap.state is None or not snap.state.running:
            what, advice = self._crash_details(name, role="serve")
            raise StepError(f"{stage.name}: {what}", step=s.id, fix=advice)
        self.emit(ev.Said(ev.Mark.OK, f"{name} is running", stage.name))

    def _do_follow(self, stage: Stage, s: Step) -> None:
        follow = s.typed(FollowParams)
        name, log = follow.container, follow.log
        self.record.set_status("training", stage=stage.name)
        last_step, last_status = None, None
        eta = planned_eta(self.recipe, self.facts)
        if eta.planned_step_s:
            self.emit(ev.Said(ev.Mark.GO, f"{eta.planned_step_s:.2f} s per step, "
                                          f"{eta.planned_tokens_per_s or 0:.0f} tokens/s", stage.name, lead="plan:"))
        self.emit(ev.Following("started", container=name))
        try:
            while True:
                snap = snapshot(self.conn, name, log)
                st = snap.state
                if snap.entry is not None and snap.entry.current_steps != last_step:
                    last_step = snap.entry.current_steps
                    self.emit(ev.Progress(entry=snap.entry))
                    eta.update(last_step, time.monotonic())
                    self.record.set_status("training", progress=snap.entry.to_json(), eta=eta.record())
                    line = eta.line(last_step, snap.entry.total_steps)
                    if line and eta.due(last_step, snap.entry.total_steps):
                        self.emit(ev.Said(ev.Mark.GO, line, stage.name, lead="ETA"))
                status = st.status if st else "missing"
                if status != last_status:
                    last_status = status
                    self.emit(ev.Following("status", status=status))
                if st is None or not st.running:
                    break
                time.sleep(self.poll_s)
        finally:
            self.emit(ev.Following("ended"))
        if st is None:
            raise StepError(f"FOLLOW: the training container {name} disappeared", step=s.id,
                            fix="Someone removed it (docker rm); re-run ktdeploy up --resume auto.")
        self.record.write_json("eta.json", eta.record())
        self.emit(ev.TrainExited(exit_code=st.exit_code, oom_killed=st.oom_killed, status=st.status))
        self._fetch_agent_record(posixpath.dirname(log))
        write_file(self.record.path / rr.ARTIFACTS, rr.TRAIN_LOG, container_logs(self.conn, name, tail=None),
                   overwrite=True)
        if not st.succeeded:
            what, advice = self._crash_details(name, st, progressed=last_step is not None)
            raise StepError(f"FOLLOW: {self._trainer_reason(name)}{what}", step=s.id, rc=st.exit_code, fix=advice)
        self.emit(ev.Said(ev.Mark.OK, f"training finished: {describe(snap.entry)}"))

    def _trainer_reason(self, name: str) -> str:
        """The trainer's own last exception (not the launcher's boilerplate), with the full log's place in the
        record: the first line of the failure, of `status` and of status.json's error."""
        from ktdeploy.core.trainer_exception import last_exception

        exc = last_exception(container_logs(self.conn, name, tail=2000))
        if exc is None:
            return ""
        log = self.record.path / rr.ARTIFACTS / rr.TRAIN_LOG
        return f"the trainer crashed: {exc.line()}; full log: {log}\n"

    def _crash_details(self, name: str, st: ContainerState | None = None, *, progressed: bool | None = None,
                       role: str = "train") -> tuple[str, str]:
        """(what happened to the container: state, exit code, its last log lines — flat; the advice that fits)."""
        if st is None:
            st = snapshot(self.conn, name, "/dev/null").state
        lines = flat_lines(container_logs(self.conn, name, tail=15).rstrip().splitlines())
        self.emit(ev.Crashed(container=name, state=st, last_lines=tuple(lines)))
        if role == "train":
            self.record.set_status("crashed", exit_code=st.exit_code if st else None,
                                   oom_killed=st.oom_killed if st else None)
        what = f"container {name} " + (st.describe() if st else "is missing")
        if st is not None and not st.running and st.status in ("exited", "dead"):
            what += f"\nexit code: {st.exit_code}   OOM-killed: {'yes' if st.oom_killed else 'no'}"
        if lines:
            what += "\nlast log lines:\n" + "\n".join(f"  {ln}" for ln in lines[-15:])
        from ktdeploy.core.trainer_exception import last_exception

        exc = last_exception(container_logs(self.conn, name, tail=2000)) if role == "train" else None
        advice = exit_advice(st, self.recipe, self.facts, lines, progressed, role,
                             trainer_error=exc.line() if exc is not None else None) \
            if st is not None and not st.running \
            else "see `ktdeploy logs`; fix the cause, then run the same `ktdeploy up` again."
        return what, advice

