"""`ktdeploy up-slurm LOGIN`: ``up_slurm(SlurmUpRequest)`` — the same recipe, record and stages as `up`, TRAIN and
CONVERT as batch jobs submitted on the login node. Nothing is queued when no node can ever run the job
(PREFLIGHT's slurm.fit, exit 1)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from ktdeploy.controller.connectors import Connector
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import job_lock, output_lock
from ktdeploy.controller.slurm_jobs import cluster_facts, cluster_nodes, queued_jobs
from ktdeploy.controller.up_inputs import check_up_arguments, load_up_recipe
from ktdeploy.controller.up_phases import apply_phase, connect_phase, gather_job_state
from ktdeploy.controller.up_record import UpResult, fail, interrupted, new_record
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.command_requests import SlurmUpRequest
from ktdeploy.core.errors import CheckFailed, KtdeployError, RunRecordError, StepError
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.plan import UpOptions, job_name, output_dir_of, plan_text, resolve_image
from ktdeploy.core.plan.host_plan import shipped_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sched import slurm as sl
from ktdeploy.core.sched.batch import convert_script, job_dir_of, train_script
from ktdeploy.core.sched.cluster import cgroup_check, choose_runtime, runtime_check
from ktdeploy.core.sched.features import LADDER
from ktdeploy.core.sched.job_files import launch_for
from ktdeploy.core.sched.request import JobRequest, request_for
from ktdeploy.core.sched.slurm_plan import build_slurm_plan


@dataclass(frozen=True)
class _SlurmRun:
    """One `up-slurm`: its request, the recipe, the login node as recorded (no password), the waivers."""

    req: SlurmUpRequest
    recipe: Recipe
    login: str
    waive: tuple[str, ...]


def slurm_variant(recipe: Recipe, nodes: list[sl.ClusterNode]) -> tuple[str, str | None, str]:
    """(image reference, variant, how) for a cluster: a named variant as is; ``auto`` the best variant a node can
    run the job with (features, memory, GPUs, CPUs); a full image reference has no known CPU needs."""
    deploy = recipe.require_deploy()
    if deploy.image == V.AUTO:
        fitting = [v for v in reversed(LADDER) if sl.fit(request_for(recipe, v), nodes).nodes]
        variant = fitting[0] if fitting else next((v for v in reversed(LADDER)
                                                   if any(v in n.features for n in nodes)), V.AVX2)
        how = f"auto: the best variant a node of the cluster runs this job with is {variant}"
    elif V.known(deploy.image):
        variant, how = V.canonical(deploy.image), "named in the recipe"
    else:
        return deploy.image, None, "full image reference from the recipe (no CPU constraint)"
    image, _v, _how = resolve_image(deploy.model_copy(update={"image": variant}), None)
    return image, variant, how


def up_slurm(request: SlurmUpRequest, *, on_event: ev.Sink | None = None,
             connector: Connector | None = None) -> UpResult:
    """``on_event``: the sink of the run's events; ``connector``: an open connector to the login node (tests)."""
    login = parse_host(request.login).redacted
    check_up_arguments(login, request.resume, request.dry_run, None)
    recipe = load_up_recipe(request.recipe, request.overrides)
    run = _SlurmRun(request, recipe, login, tuple(dict.fromkeys(request.waive)))
    # one run, one lock, as plain `up`: a second `up-slurm` of this job (or a `down` of it) is refused (exit 6)
    held = contextlib.ExitStack()
    if not request.dry_run:
        held.enter_context(job_lock(login, job_name(recipe)))
    with held:
        events = new_record(recipe, login, request, run.waive, on_event)
        events.record.set_status("planned", scheduler="slurm", job_dir=job_dir_of(recipe))
        conn, where = connect_phase(login, events, None, connector, request.ssh)
        assert conn is not None   # no recorded facts: connect_phase connected
        if not request.dry_run:
            try:
                held.enter_context(output_lock(conn, login, output_dir_of(recipe)))
            except RunRecordError:
                conn.close()
                raise
        try:
            return _submit(run, conn, where, events)
        except KeyboardInterrupt as stop:
            interrupted(events, stop, before="was submitted", nothing="submitted")
            raise
        finally:
            conn.close()


@dataclass(frozen=True)
class _Fit:
    image: str
    variant: str | None
    how: str                 # why this image (the plan's note)
    request: JobRequest
    detail: str              # slurm.fit's detail: the nodes that fit
    runtime: str             # how the job starts the image (slurm.runtime)


def _fit(run: _SlurmRun, conn: Connector, where: str, events: Emitter) -> _Fit:
    """PREFLIGHT on a cluster: its nodes, the image variant, the job's request and whether a node can ever run it
    (slurm.fit). Nothing is queued when none can."""
    record = events.record
    try:
        nodes = cluster_nodes(conn)
    except StepError as e:
        raise fail(events, "failed", e) from None
    record.write_json("cluster.json", [n.__dict__ for n in nodes])
    image, variant, how = slurm_variant(run.recipe, nodes)
    try:
        request = request_for(run.recipe, variant)
    except KtdeployError as e:
        raise fail(events, "failed", e) from None
    check = sl.fit_check(request, nodes)
    events.emit(ev.SlurmFit(check=check))
    cluster = cluster_facts(conn)
    record.write_json("cluster_setup.json", {"config": cluster.config, "runtimes": list(cluster.runtimes)})
    requested = run.recipe.require_deploy().scheduler.runtime
    rt_check = runtime_check(requested, cluster)
    runtime = choose_runtime(requested, cluster)
    setup = [rt_check] + ([cgroup_check(cluster, runtime, request.gpus)] if runtime is not None else [])
    for c in setup:
        events.emit(ev.SlurmCheck(check=c))
    record.write_json(rr.DOCTOR, {"checks": [c.model_dump(mode="json") for c in (check, *setup)],
                                  "request": request.__dict__})
    if check.status == "fail":
        raise fail(events, "failed", CheckFailed(
            f"slurm on {where}: no node can run this job; nothing was queued", results=[check], key=CheckName.SLURM_FIT,
            fix=check.fix or "See the reasons below."))
    if rt_check.status == "fail" or runtime is None:
        raise fail(events, "failed", CheckFailed(
            f"slurm on {where}: {rt_check.detail}; nothing was queued", results=[rt_check],
            key=CheckName.SLURM_RUNTIME, fix=rt_check.fix or "See the reasons below."))
    return _Fit(image, variant, how, request, check.detail, runtime)


def _submit(run: _SlurmRun, conn: Connector, where: str, events: Emitter) -> UpResult:
    """Fit, plan, write the batch scripts into the record, then (not a dry run) submit and follow."""
    recipe, record = run.recipe, events.record
    fit = _fit(run, conn, where, events)
    image, request = fit.image, fit.request
    state = gather_job_state(conn, recipe, image)
    record.write_json(rr.JOB_STATE, state.to_json())
    queued = queued_jobs(conn, job_name(recipe))
    opts = UpOptions(host=run.login, run_id=record.id, resume=run.req.resume, detach=run.req.detach, waive=run.waive,
                     preflight={"connect": f"connected ({where})"})
    plan = build_slurm_plan(recipe, state, opts, image=image, variant=fit.variant, queued=queued,
                            fit_detail=fit.detail)
    plan = dataclasses.replace(plan, rendered=_batch_files(run, record.id, fit, events),
                               notes=(*plan.notes, f"image: {fit.how}", f"runtime: {fit.runtime}"))
    record.write_json(rr.PLAN, plan.to_json())
    record.set_status("planned", image=image, adapter_dir=plan.adapter_dir,
                      slurm_request={"mem_mib": request.mem_mib, "cpus": request.cpus, "gpus": request.gpus,
                                     "constraint": request.constraint},
                      **({"slurm_jobs": queued} if queued else {}))
    result = UpResult(record=record, waived=list(run.waive), plan=plan,
                      text=plan_text(plan, run_dir=str(record.path)))
    if run.req.dry_run:
        return _dry_run(result, events)
    return apply_phase(conn, plan, recipe, None, result, events, host=run.login, detach=run.req.detach)


def _batch_files(run: _SlurmRun, run_id: str, fit: _Fit, events: Emitter) -> dict[str, str]:
    """The training and conversion batch scripts, written into the record (what is submitted)."""
    recipe, record = run.recipe, events.record
    gpus_waived = CheckName.DOCKER_NVIDIA_RUNTIME in run.waive or CheckName.GPU_PRESENT in run.waive
    try:
        launch = launch_for(recipe, fit.image, fit.runtime, gpus=not gpus_waived,
                            memlock=CheckName.DOCKER_MEMLOCK not in run.waive)
        train = train_script(recipe, shipped_recipe(recipe, None), run_id=run_id, request=fit.request, launch=launch)
        conv = convert_script(recipe, run_id=run_id, request=fit.request, launch=launch)
    except KtdeployError as e:
        raise fail(events, "failed", e) from None
    return {"slurm/train.sbatch": str(record.write_text(f"{rr.RENDERED}/slurm/train.sbatch", train.script)),
            "slurm/convert.sbatch": str(record.write_text(f"{rr.RENDERED}/slurm/convert.sbatch", conv.script))}


def _dry_run(result: UpResult, events: Emitter) -> UpResult:
    events.record.set_status("dry-run")
    events.emit(ev.SlurmDryRun())
    events.emit(ev.PlanText(text=result.text))
    result.state = "dry-run"
    return result
