"""``ktdeploy train``: validate -> doctor -> render -> launch LlamaFactory with KT, on this host.

This is what the image's entrypoint runs (and what ``ktdeploy up`` runs inside the container).
Each run gets a record folder, ansible-runner style, beside the output directory:
``<dirname(output_dir)>/.ktdeploy-runs/<basename(output_dir)>/<UTC time>/`` with the rendered
``train.yaml`` / ``accelerate.yaml`` / ``launch.sh``, ``command.json``, ``stdout.log``,
``metrics.jsonl`` (one line per step), ``rc``, ``status`` and ``summary.json``. The record lives
outside ``output_dir`` because LlamaFactory refuses a non-empty output directory it did not write.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ktdeploy.agent.stop_request import StopRequest
from ktdeploy.core import run_record as rr
from ktdeploy.core.checkpoints import CHECKPOINT_RE, FINISHED_MARKERS, choose_resume, finished_markers
from ktdeploy.core.checks.gate import AGENT_DEFERRED, gate, profile_hint
from ktdeploy.core.checks.threads import derived_kt_threads
from ktdeploy.core.errors import CheckFailed, RecipeError, RunRecordError, StepError, UsageError
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.kt_weights import needed_by
from ktdeploy.core.safeio import parse_json, printable, read_text, write_file
from ktdeploy.core.trainer_log import steady_rate

if TYPE_CHECKING:   # imported where used: the monitor when a run launches, the recipe modules by plan_train
    from ktdeploy.agent.monitor import RunOutcome
    from ktdeploy.core.recipe.document import Recipe
    from ktdeploy.core.recipe.render import Rendered

ENTRY_MODULE = "ktdeploy.agent.lf_entry"


@dataclass
class TrainPlan:
    """Everything ``ktdeploy train`` will do, computed before anything starts (``--dry-run`` prints it)."""

    recipe_path: str
    output_dir: str
    run_dir: str
    argv: list[str]
    env: dict[str, str]
    derived: dict[str, Any]
    resume_from: str | None
    train_yaml: str
    accelerate_yaml: str
    launch_sh: str
    warnings: list[str] = field(default_factory=list)
    doctor: dict[str, Any] | None = None
    tuned: dict[str, Any] | None = None       # the `ktdeploy tune` choice applied to train.yaml (--tuned), with its source
    env_defaults: dict[str, str] = field(default_factory=dict)   # used where the environment does not set them
    # kt-kernel's ephemeral INT8 root this run stages in /dev/shm just before the launch (prepare-weights --ephemeral)
    stage_weights: dict[str, Any] | None = None
    holdout: dict[str, Any] | None = None   # deploy.eval.holdout: carve()'s arguments, written before the launch

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """The checkpoint-N folders of a local output dir, oldest first (core/checkpoints.py reads a listing of them)."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def _entries(ckpt: Path) -> list[str]:
    """The names inside one checkpoint folder as ktdeploy.core.checkpoints expects them: files by name, a sub-folder as
    'sub/file' when it holds at least one file (an empty one does not count)."""
    entries = []
    for p in ckpt.iterdir():
        if p.is_dir():
            entries += [f"{p.name}/{q.name}" for q in p.iterdir()][:1]
        else:
            entries.append(p.name)
    return entries


def _listing(output_dir: Path) -> dict[str, list[str]]:
    """{checkpoint-N: entries inside} for every checkpoint of an output dir."""
    return {ck.name: _entries(ck) for ck in checkpoint_dirs(output_dir)}


def resolve_resume(output_dir: Path, resume: str | None, world_size: int = 1) -> str | None:
    """Refuse to overwrite a finished run; with checkpoints present, require an explicit --resume; resume only
    from a complete checkpoint saved by the same number of processes (cookbook §3(6)), checked before loading.

    LlamaFactory would otherwise resume silently (or refuse with a ValueError deep in its startup).
    """
    finished = finished_markers(p.name for p in output_dir.iterdir()) if output_dir.is_dir() else []
    ckpts = checkpoint_dirs(output_dir)
    if finished:
        raise RunRecordError(
            f"{output_dir} holds a finished run ({', '.join(finished)}); ktdeploy never overwrites a training output",
            key="train.output_dir",
            fix="set train.output_dir to a new directory (--set train.output_dir=...) or convert/serve this one")
    if resume is None:
        if ckpts:
            raise RunRecordError(
                f"{output_dir} already holds {len(ckpts)} checkpoint(s), the last {ckpts[-1].name}",
                key="train.output_dir",
                fix="pass --resume auto to continue from the last checkpoint, or choose a new train.output_dir")
        if output_dir.is_dir() and any(output_dir.iterdir()):
            raise RunRecordError(f"{output_dir} exists and is not empty, and holds no checkpoint to resume",
                                 key="train.output_dir", fix="choose a new, empty train.output_dir")
        return None
    if resume == "auto":
        if not ckpts:
            raise RunRecordError(f"--resume auto: no checkpoint-* in {output_dir}",
                                 fix="start a fresh run without --resume")
        choice = choose_resume(_listing(output_dir), "auto", world_size)
        if choice.checkpoint is None:
            raise RunRecordError(f"--resume auto: no complete checkpoint in {output_dir} (each was cut off mid-save)",
                                 fix="start a fresh run in a new train.output_dir")
        best = choice.checkpoint
        path = output_dir / best.name
    else:
        path = Path(resume)
        if not CHECKPOINT_RE.match(path.name) or not path.is_dir():
            raise UsageError(f"--resume {resume}: not an existing checkpoint-* directory",
                             fix="pass --resume auto or the path of a checkpoint-N directory")
        choice = choose_resume({path.name: _entries(path)}, path.name, world_size)
        if choice.checkpoint is None:  # the listing holds exactly this name, so choose_resume finds it
            raise UsageError(f"--resume {resume}: not a checkpoint-* directory",
                             fix="pass --resume auto or the path of a checkpoint-N directory")
        best = choice.checkpoint
        if choice.problem == "incomplete":
            raise RunRecordError(f"{path} is an incomplete checkpoint (missing {', '.join(best.missing)})",
                                 fix="resume from an earlier checkpoint-* (or --resume auto, which skips cut-off ones)")
    if choice.problem == "world_size":
        raise RunRecordError(
            f"{path.name} was saved by {best.world_size} process(es) but this run has {world_size} "
            f"(accelerate.num_processes); resuming needs the same world size",
            key="accelerate.num_processes",
            fix=f"resume on {best.world_size} GPU(s): set accelerate.num_processes: {best.world_size} and list "
                f"{best.world_size} GPU(s) in deploy.gpus")
    return str(path.resolve())


def run_doctor(recipe: Recipe, skip: bool, diagnose: Callable[[Recipe], Any] | None = None,
               topology: Callable[[], Any] | None = None, waive: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Doctor this host for the recipe; returns (derived kt_config values, report JSON, warnings).

    Derived values (kt_num_threads / kt_threadpool_count from physical cores and NUMA nodes) are
    applied only where the recipe leaves the key unset. Skipping the doctor skips its checks, not the
    derivation: ``topology`` (-> this host's facts, gathered without probes) still sets the threads, since
    kt-kernel's own default ran the GPU machine's medium tiny MoE 5x slower (160-190 vs 930 tokens/s).
    """
    kt = recipe.kt_config
    want = [k for k in ("kt_num_threads", "kt_threadpool_count") if k not in kt]
    reserve = recipe.deploy.reserve_cores if recipe.deploy else 2
    if skip:
        warns = ["doctor skipped (--skip-doctor): host checks not run"]
        if want and topology is not None:
            return derived_kt_threads(recipe.train, topology(), reserve), None, warns
        return {}, None, warns + [f"kt_config.{k} left to kt-kernel's default (doctor skipped)" for k in want]
    if diagnose is None:  # the agent never reaches into the controller: the CLI hands the doctor in
        raise ValueError("run_doctor needs diagnose= (recipe -> DoctorReport of this host), or skip=True")
    report = diagnose(recipe)
    report.waived = tuple(dict.fromkeys([*report.waived, *waive]))   # what `up` waived (or --waive / --cpu-only)
    data = report.to_json()
    # The agent trains right here (inside the image, or on a bare host): the docker engine checks
    # concern `ktdeploy up`, not this process, so they never block it.
    blocking = gate(report.checks, report.waived, defer=AGENT_DEFERRED).blocking
    if blocking:
        raise CheckFailed("this host cannot run the recipe: doctor found failing checks",
                          results=blocking,
                          fix="fix the failing checks listed below, or run `ktdeploy doctor` for the full report."
                              + profile_hint(blocking, report.facts.gpu.count))
    derived: dict[str, Any] = derived_kt_threads(recipe.train, report.facts, reserve)
    warns = [f"{r.name}: {r.detail}" for r in report.checks if r.status == "warn"]
    return derived, data, warns


def stack_judgement(recipe: Recipe, rendered: Rendered, judge: Callable[[Rendered], Any], report: dict[str, Any] | None,
                    waive: Sequence[str] = ()) -> dict[str, Any] | None:
    """The stack's verdict on the rendered files (stack.judge): a refusal is the recipe's error (RecipeError, with
    the stack's findings: what `ktdeploy check --stack` reports), no verdict a failed check (both pass when
    ``--waive stack.judge``, on the record); the verdict joins the doctor's report (agent_doctor.json)."""
    from ktdeploy.core.checks.stack import judge_check
    from ktdeploy.core.recipe.stack_judge_payload import findings

    result = judge(rendered)
    found = findings(result, recipe.train, recipe.accelerate, recipe.raw.source.where) \
        if result.status == "refused" else []
    check = judge_check(result, found)
    if check.status == "fail" and check.name in waive:
        report = report if report is not None else {}
        return {**report, "checks": [*report.get("checks", []), check.model_dump(mode="json")],
                "waived": sorted({*report.get("waived", []), check.name})}
    if result.status == "refused":
        raise RecipeError(f"the stack (accelerate, LlamaFactory, kt-kernel) refuses {recipe.name}; nothing was started",
                          findings=found, key=check.name,
                          fix="Fix the keys listed below (`ktdeploy check RECIPE --stack` prints the same report).")
    if check.status == "fail":
        raise CheckFailed(f"the stack could not judge the recipe here: {check.detail}", results=[check],
                          key=check.name, fix=check.fix)
    if report is not None:
        report = {**report, "checks": [*report.get("checks", []), check.model_dump(mode="json")]}
    return report


def _run_dir(output_dir: Path, root: str | None) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    base = Path(root) if root else Path(JobLayout(str(output_dir)).agent_runs)
    d = base / stamp
    n = 1
    while d.exists():
        d = base / f"{stamp}-{n}"
        n += 1
    return d


@dataclass(frozen=True)
class ThisHost:
    """What ``ktdeploy train`` may ask of the host it trains on, handed in by the CLI (the agent never imports the
    controller): ``diagnose`` (recipe -> this host's DoctorReport), ``topology`` (-> this host's facts without
    probes: the threads when the doctor is skipped), or ``doctor`` in place of the whole doctor step (recipe,
    skip -> (derived values, report JSON, warnings); tests)."""

    diagnose: Callable[[Recipe], Any] | None = None
    topology: Callable[[], Any] | None = None
    doctor: Callable[[Recipe, bool], tuple[dict[str, Any], dict[str, Any] | None, list[str]]] | None = None


def plan_train(recipe_path: str, overrides: Sequence[str] = (), *, resume: str | None = None,
               skip_doctor: bool = False, run_root: str | None = None, host: ThisHost = ThisHost(),
               tuned: dict[str, Any] | None = None, waive: Sequence[str] = (), recipe: Recipe | None = None,
               judge: Callable[[Rendered], Any] | None = None) -> TrainPlan:
    """Validate, doctor, render and (``judge``: rendered files -> core.recipe.stack_judge_payload.JudgeResult) let the
    stack judge exactly what will be launched; raises a KtdeployError with the fix when anything is wrong. Writes
    nothing: the held-out split and ephemeral weights are made by ``execute`` just before the launch."""
    from ktdeploy.core.recipe import load_recipe, render, require_valid

    path = Path(recipe_path)
    if recipe is None:   # else loaded already (the native --train/--accelerate pair)
        if not path.is_file():
            raise UsageError(f"recipe {recipe_path} not found",
                             fix="pass the path of a recipe YAML (see `ktdeploy check`)")
        recipe = load_recipe(path, list(overrides))
    findings = require_valid(recipe)
    warnings = [f"{f.path}: {f.message}" for f in findings]
    if host.doctor is None:
        derived, report, warns = run_doctor(recipe, skip_doctor, host.diagnose, host.topology, waive)
    else:
        derived, report, warns = host.doctor(recipe, skip_doctor)
    warnings += warns
    output_dir = recipe.keys.output_dir
    if not isinstance(output_dir, str):   # require_valid refuses such a recipe: never reached
        raise RecipeError("train.output_dir is not a path", key="train.output_dir")
    out_dir = Path(output_dir)
    world = recipe.accelerate.get("num_processes", 1)
    recipe_resume = recipe.keys.resume_from_checkpoint
    if resume is None and isinstance(recipe_resume, str):
        resume = recipe_resume  # the recipe names its checkpoint: check it the same way
    resume_from = resolve_resume(out_dir, resume, world if isinstance(world, int) else 1)
    if resume_from:
        derived["resume_from_checkpoint"] = resume_from
    holdout = _holdout_args(recipe, str(out_dir))
    if holdout:   # the trainer reads the training rows less the held-out ones (deploy.eval.holdout)
        recipe.train["dataset_dir"] = derived["dataset_dir"] = carve_target(str(out_dir))
    rendered = render(recipe, derived=derived, header=f"rendered by ktdeploy train from {printable(path.name)}")
    if judge is not None and not skip_doctor:
        report = stack_judgement(recipe, rendered, judge, report, waive)
    run_dir = _run_dir(out_dir, run_root)
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", "0",
            "--config_file", str(run_dir / rr.ACCELERATE_YAML), "-m", ENTRY_MODULE, str(run_dir / rr.TRAIN_YAML)]
    env = dict(rendered.env)
    env["KTDEPLOY_METRICS"] = str(run_dir / rr.METRICS)
    env.update(StopRequest.for_output(str(out_dir)).env())   # lf_entry's SaveOnStopRequest looks for it each step
    need = needed_by(recipe.weight_setup(), {**recipe.keys.kt_config, **_derived_kt(derived)},
                     recipe.keys.model_name_or_path, recipe.keys.kt_weight_path)
    stage = asdict(need) if need is not None and need.ephemeral_run_id is not None else None
    return TrainPlan(recipe_path=str(path.resolve()), output_dir=str(out_dir), run_dir=str(run_dir), argv=argv,
                     env=env, derived=derived, resume_from=resume_from, train_yaml=rendered.train_yaml,
                     accelerate_yaml=rendered.accelerate_yaml, launch_sh=rendered.launch_sh, warnings=warnings,
                     doctor=report, tuned=tuned, env_defaults=dict(rendered.env_defaults), stage_weights=stage,
                     holdout=holdout)


def _derived_kt(derived: dict[str, Any]) -> dict[str, Any]:
    """The kt_config values train derived (``kt_config.kt_threadpool_count`` -> ``kt_threadpool_count``)."""
    return {k.split(".", 1)[1]: v for k, v in derived.items() if k.startswith("kt_config.")}


def stage_ephemeral_weights(plan: TrainPlan, say: Callable[[str], None]) -> None:
    """kt-kernel's ephemeral INT8 root, staged from the model by prepare-weights right before the launch (the
    trainer consumes it layer by layer; a crash leaves kt-kernel's own cleanup to remove it)."""
    if not plan.stage_weights:
        return
    from ktdeploy.agent.prepare_weights import prepare

    w = plan.stage_weights
    threads = _derived_kt(plan.derived).get("kt_num_threads") or os.cpu_count() or 1
    say(f"staging ephemeral INT8 experts from {w['model']} in /dev/shm/kt-int8-{w['ephemeral_run_id']}")
    prepare(w["model"], None, "int8", pools=int(w["pools"]), threads=int(threads),
            ephemeral_run_id=str(w["ephemeral_run_id"]), say=say)


def _holdout_args(recipe: Recipe, output_dir: str) -> dict[str, Any] | None:
    """deploy.eval.holdout: what ``carve`` needs to make the split the trainer reads (agent/holdout.py), or None."""
    ev = recipe.deploy.eval if recipe.deploy is not None else None
    if ev is None or not ev.holdout:
        return None
    from ktdeploy.core.eval.dataset import names_of

    return {"data_dir": str(recipe.train.get("dataset_dir")), "names": list(names_of(recipe.train.get("dataset"))),
            "output_dir": output_dir, "holdout": ev.holdout, "seed": ev.seed}


def carve_target(output_dir: str) -> str:
    return JobLayout(output_dir).holdout_dir


def carve_holdout(plan: TrainPlan) -> None:
    """The held-out split, written (or the same one found) before the launch; a different one is refused."""
    if plan.holdout:
        from ktdeploy.agent.holdout import carve

        h = plan.holdout
        carve(h["data_dir"], h["names"], h["output_dir"], h["holdout"], h["seed"], write=True)


def write_record(plan: TrainPlan) -> Path:
    d = Path(plan.run_dir)
    d.mkdir(parents=True, exist_ok=False)
    write_file(d, rr.TRAIN_YAML, plan.train_yaml)
    write_file(d, rr.ACCELERATE_YAML, plan.accelerate_yaml)
    write_file(d, rr.LAUNCH_SH, plan.launch_sh, mode=0o755)
    write_file(d, rr.COMMAND, json.dumps({"argv": plan.argv, "env": plan.env, "env_defaults": plan.env_defaults,
                                          "derived": plan.derived, "resume_from": plan.resume_from,
                                          "recipe": plan.recipe_path, "tuned": plan.tuned}, indent=2) + "\n")
    if plan.tuned is not None:
        write_file(d, rr.TUNED, json.dumps(plan.tuned, indent=2) + "\n")
    if plan.doctor is not None:
        write_file(d, rr.AGENT_DOCTOR, json.dumps(plan.doctor, indent=2, default=str) + "\n")
    _put(d, rr.STATUS, rr.status_text("starting"))
    return d


def _put(run_dir: Path, name: str, text: str) -> None:
    """A record file (re)written through the safe writer: the trainer (and whatever it runs) shares the output
    volume, so a link planted in the record is never followed."""
    write_file(run_dir, name, text, overwrite=True)


def _summarise(run_dir: Path, outcome: RunOutcome, output_dir: Path) -> dict[str, Any]:
    steps, losses, peak_gpu, peak_reserved = [], [], 0, 0
    gc_frozen = None
    mp = run_dir / rr.METRICS
    if mp.exists():
        for row in rr.parse_metrics(read_text(mp, 256 << 20, "metrics record")):
            if "gc_frozen" in row:
                gc_frozen = bool(row["gc_frozen"])
            if "loss" in row and "step_s" not in row:
                losses.append((row["step"], row["loss"]))
            if "step_s" in row:
                steps.append(row)
                peak_gpu = max(peak_gpu, row.get("peak_gpu_mem_bytes", 0))
                peak_reserved = max(peak_reserved, row.get("peak_gpu_reserved_bytes", 0))
    tokens_per_s = None
    if len(steps) > 2:  # steady state: leave out the first step (compilation, KT buffer setup)
        tokens_per_s = steady_rate((steps[0]["tokens_seen"], 0.0),
                                   (steps[-1]["tokens_seen"], sum(r["step_s"] for r in steps[1:])))
    results = {}
    for name in FINISHED_MARKERS:
        p = output_dir / name
        if p.exists():
            try:  # the trainer's file on the shared output volume: bounded, and never a crash after training
                results = parse_json(read_text(p, 16 << 20, name))
            except (UsageError, ValueError) as e:
                results = {"unreadable": str(getattr(e, "message", e))[:200]}
            break
    return {"rc": outcome.rc, "wall_s": round(outcome.wall_s, 2), "peak_host_rss_gib": round(outcome.peak_rss_gib, 3),
            "peak_host_rss_hwm_gib": round(outcome.hwm_rss_bytes / 2**30, 3),
            "peak_gpu_mem_gib": round(peak_gpu / 2**30, 3) if peak_gpu else None,
            "peak_gpu_reserved_gib": round(peak_reserved / 2**30, 3) if peak_reserved else None,
            "steady_tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
            "loss_first": losses[0][1] if losses else None, "loss_last": losses[-1][1] if losses else None,
            "steps": len(steps), "train_results": results,
            # the garbage collector's share of the steps (lf_entry's GcClock); frozen: the heap before step 1
            "gc_s": round(sum(r.get("gc_s", 0.0) for r in steps), 3), "gc_full": sum(r.get("gc_full", 0) for r in steps),
            "gc_frozen": gc_frozen,
            "artifacts": sorted(p.name for p in output_dir.iterdir()) if output_dir.is_dir() else []}


def finish_record(run_dir: Path, output_dir: Path, rc: int, wall_s: float, peak_rss_bytes: int,
                  hwm_rss_bytes: int) -> dict[str, Any]:
    """Write rc, summary.json and status into a run record (both launch modes end here)."""
    from ktdeploy.agent.monitor import RunOutcome

    outcome = RunOutcome(rc=rc, wall_s=wall_s, peak_rss_bytes=peak_rss_bytes, hwm_rss_bytes=hwm_rss_bytes)
    _put(run_dir, rr.RC, rr.rc_text(rc))
    summary = _summarise(run_dir, outcome, output_dir)
    _put(run_dir, rr.SUMMARY, rr.summary_text(summary))
    _put(run_dir, rr.STATUS, rr.status_text(rr.final_state(rc)))
    return summary


def exec_trainer(plan: TrainPlan, run_dir: Path, env: dict[str, str]) -> None:
    """Become the launcher (os.execve): no ktdeploy process stays beside the trainer. The trainer's output goes
    where this process's went (the terminal, or the container's log); the trainer-side entry point
    (``lf_entry``) writes rc, status and summary.json into the record when training ends, and a run killed
    outright (OOM killer, SIGKILL) leaves status ``running`` with the exit code in the container's state."""
    import time

    env = {**env, "KTDEPLOY_RUN_DIR": str(run_dir), "KTDEPLOY_OUTPUT_DIR": plan.output_dir,
           "KTDEPLOY_T0": repr(time.time())}
    _put(run_dir, rr.LAUNCH_MODE, rr.LAUNCH_EXEC + "\n")
    _put(run_dir, rr.STATUS, rr.status_text("running"))
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(trainer_workdir(plan))
    os.execve(plan.argv[0], plan.argv, env)


def trainer_workdir(plan: TrainPlan) -> Path:
    """The trainer's working directory (the same for every run into this output root: JobLayout.trainer_workdir says
    why), made when missing; a run given its own ``--run-root`` still runs there."""
    d = Path(JobLayout(plan.output_dir).trainer_workdir)
    d.mkdir(parents=True, exist_ok=True)
    return d


def trainer_env(plan: TrainPlan) -> dict[str, str]:
    """The trainer's environment: this process's, the plan's, unbuffered output, CUDA's JIT cache on the output
    volume and the plan's defaults (the caching allocator's setting) unless the environment already names them."""
    env = {**plan.env_defaults, **os.environ, **plan.env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("CUDA_CACHE_PATH", JobLayout(plan.output_dir).cuda_jit_cache)
    return env


def execute(plan: TrainPlan, echo: IO[str] | None = sys.stdout, *, exec_launch: bool = False) -> dict[str, Any]:
    """Write the run record, launch, stream, record rc/status/summary; StepError on a non-zero exit.
    With ``exec_launch`` this process becomes the launcher instead (see exec_trainer) and never returns."""
    from ktdeploy.agent.monitor import run_streaming

    carve_holdout(plan)   # a refused split (other data under the same output) leaves no run record
    d = write_record(plan)
    StopRequest.for_output(plan.output_dir).clear()   # a request left by an earlier run is not this run's
    env = trainer_env(plan)
    stage_ephemeral_weights(plan, lambda m: print(m, file=sys.stderr, flush=True))
    if exec_launch:
        exec_trainer(plan, d, env)
    _put(d, rr.STATUS, rr.status_text("running"))
    try:
        # The trainer writes stdout.log itself; this process samples RSS and echoes the log once a second at
        # SCHED_IDLE (a line relay at nice +5 cost ~10 % tokens/s against a hand launch on the GPU machine).
        outcome = run_streaming(plan.argv, env=env, cwd=str(trainer_workdir(plan)), log_path=d / rr.STDOUT_LOG, echo=echo,
                                interval=1.0, yield_cpu=True)
    except KeyboardInterrupt:
        _put(d, rr.STATUS, rr.status_text("interrupted"))
        raise
    summary = finish_record(d, Path(plan.output_dir), outcome.rc, outcome.wall_s, outcome.peak_rss_bytes,
                            outcome.hwm_rss_bytes)
    if outcome.rc != 0:
        raise StepError(f"training exited with code {outcome.rc} (log: {d / rr.STDOUT_LOG})", step="train",
                        rc=outcome.rc, output="\n".join(outcome.tail[-15:]),
                        fix="read the last lines of the log above; fix the cause and rerun with --resume auto")
    return summary
