"""What the CLI and the tests call: up(), up_slurm(), status(), logs(), down().

``up`` runs the stages in order: connect -> facts + doctor -> plan (pure) -> apply (executor). Every run keeps a
record folder on the controller (ktdeploy.controller.runs)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ktdeploy.controller import slurm as slurm_run
from ktdeploy.controller.connectors import Connector, DockerExecConnector, LocalConnector, connect
from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.controller.doctor import doctor as run_doctor
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor, container_logs, snapshot
from ktdeploy.controller.image_check import image_doctor, stack_probe_checks
from ktdeploy.controller.local_host import local_raw
from ktdeploy.controller.runs import RunRecord, all_runs, job_lock, latest_run, lock_key, output_lock, same_target
from ktdeploy.controller.slurm_jobs import cluster_nodes, queued_jobs
from ktdeploy.controller.stack_judge import stack_judge_check
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import CPU_ONLY, RUNTIME_FIXABLE, gate, profile_hint, with_profile
from ktdeploy.core.checks.isa import variant_check
from ktdeploy.core.checks.threads import derived_kt_threads
from ktdeploy.core.errors import (
    CheckFailed,
    ConnectError,
    KtdeployError,
    RecipeError,
    RunRecordError,
    StepError,
    Terminated,
    UsageError,
)
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.host_target import HostTarget, parse_host
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import UpOptions, build_plan, job_name, output_dir_of, parse_state, plan_text, resolve_image
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.build import MEMLOCK_WAIVER, shipped_recipe
from ktdeploy.core.plan.state import STATE_SCRIPT, JobState
from ktdeploy.core.plan.steps import Plan, StageName
from ktdeploy.core.recipe import builtin_recipe, load_native, load_recipe, require_valid
from ktdeploy.core.recipe import render as render_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.safeio import MAX_JSON, NAME, load_json, printable, redact, write_file
from ktdeploy.core.sched import slurm as sl
from ktdeploy.core.sched.batch import convert_script, job_dir_of, train_script
from ktdeploy.core.sched.features import LADDER
from ktdeploy.core.sched.plan import build_slurm_plan
from ktdeploy.core.sched.request import JobRequest, request_for


def doctor(host: str = "localhost", recipe_path: str | Path | None = None, overrides: Sequence[str] = (), *, image: str | None = None,
           variant: str | None = None, gpus: str | None = None, stack: bool = False, container: str | None = None,
           waive: Sequence[str] = (), cpu_only: bool = False, ssh: dict | None = None) -> DoctorReport:
    """`ktdeploy doctor`: the host's facts and every check (with a recipe, its checks too); ``image`` runs them in
    that image's training container, ``container`` compares with a running one, ``stack`` adds the stack probe
    where doctor runs, ``variant`` checks that a kt-kernel build runs here. The report's ``waived`` holds
    ``waive`` (+ the --cpu-only profile). Bad arguments are a UsageError before anything is reached."""
    rec = None
    if recipe_path is not None:
        rec = load_recipe(recipe_path, list(overrides))
    elif overrides:
        raise UsageError("--set needs --recipe", fix="Pass the recipe the overrides apply to: --recipe FILE --set ...")
    if image is not None and V.known(image):   # the former meaning of --image: an ISA variant
        variant, image = variant or image, None
    if variant is not None and not V.known(variant):
        raise UsageError(f"--variant {variant!r} is not a kt-kernel build", fix=f"Use one of {', '.join(V.NAMES)}.")
    if image and container:
        raise UsageError("--image and --container both name the container to check",
                         fix="Pass --image IMAGE (started for the check) or --container NAME (already running).")
    gpu_list = None
    if gpus is not None:
        if not image:
            raise UsageError("--gpus is the GPUs the --image container gets", fix="Pass --image IMAGE with it.")
        try:
            gpu_list = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            raise UsageError(f"--gpus {gpus!r} is not a list of GPU indices", fix="e.g. --gpus 0,1") from None
    target = parse_host(host)   # a password in ssh://user:PW@host is never used, shown or recorded
    conn = connect(target, **((ssh or {}) if target.kind == "ssh" else {}))
    try:
        report = _doctor_report(conn, target, rec, image=image, gpus=gpu_list, container=container,
                                memlock=MEMLOCK_WAIVER not in waive)
        if stack and not image:   # --image already ran it inside the container
            checks = stack_probe_checks(conn, report.facts.gpu.count)
            if rec is not None:   # the stack where doctor runs judges the recipe (stack.judge)
                checks.append(stack_judge_check(conn, rec, in_container=False))
            for c in checks:
                c.layer = report.facts.layer
                report.checks.append(c)
        if variant:
            vc = variant_check(report.facts, variant)
            vc.name, vc.layer = CheckName.IMAGE_VARIANT, report.facts.layer
            report.checks.append(vc)
    finally:
        conn.close()
    report.waived = with_profile(waive, cpu_only)
    return report


def _doctor_report(conn: Connector, target: HostTarget, rec: Recipe | None, *, image: str | None, gpus: list[int] | None,
                   container: str | None, memlock: bool) -> DoctorReport:
    if image:
        return image_doctor(conn, image, recipe=rec, gpus=gpus, memlock=memlock)
    inner = DockerExecConnector(container, via=None if target.is_local else conn) if container else None
    # this host: the facts the image's entrypoint already gathered for its ISA gate (gathered here otherwise)
    return run_doctor(conn, rec, container=inner, host_raw=local_raw() if target.is_local else None)


@dataclass
class UpResult:
    record: RunRecord
    plan: object | None = None
    state: str = "planned"
    text: str = ""
    waived: list = field(default_factory=list)
    stops_at: str | None = None     # a dry run: the stage where the real run would stop (the CLI exits 4)


def load_up_recipe(recipe_path: str | Path | None = None, overrides: Sequence[str] = (),
                   native: tuple[str, str, str | None] | None = None) -> Recipe:
    """The recipe `up` runs: a RECIPE file (default: the shipped tiny one), or the native LlamaFactory pair
    (--train/--accelerate, and --deploy or the deploy section derived from them: core/recipe/from_lf.py)."""
    if native is not None:
        for flag, p in zip(("--train", "--accelerate", "--deploy"), native, strict=True):
            if p is not None and not Path(p).is_file():
                raise UsageError(f"{flag} {printable(p)}: no such file", key=flag, fix="Give the YAML file's path.")
        recipe = load_native(*native, overrides=list(overrides), derive=True)
    else:
        path = Path(str(recipe_path)) if recipe_path else Path(str(builtin_recipe()))
        if not path.exists():
            raise UsageError(f"recipe {path} does not exist", key="RECIPE",
                             fix="Give a recipe file, e.g. recipes/tiny-moe-lora.yaml.")
        recipe = load_recipe(path, list(overrides))
    require_valid(recipe)
    return recipe


def gather_job_state(conn: Connector, recipe: Recipe, image: str) -> JobState:
    name = job_name(recipe)
    out = output_dir_of(recipe)
    r = conn.run(["sh", "-c", STATE_SCRIPT, "ktdeploy-state", name, f"{name}-serve", image, out,
                  JobLayout(out).adapter_dir], timeout=120)
    if r.rc != 0 and not r.stdout:
        raise StepError(f"could not read the job state on {conn.name}: {r.stderr.strip()[-300:]}", step="preflight.state")
    return parse_state(r.stdout)


def doctor_phase(report: DoctorReport, where: str, waive: Sequence[str], emit: ev.Sink) -> tuple[list, str]:
    """up's PREFLIGHT verdict on a doctor report: (blocking failed checks, the one-line summary); emits it with
    the waived and deferred checks (core/checks/gate.py decides which is which)."""
    report.waived = tuple(waive)
    g = gate(report.checks, waive, defer=RUNTIME_FIXABLE)
    doc_line = report.summary_text(RUNTIME_FIXABLE)  # the same count as `ktdeploy doctor` and the panel below
    emit(ev.DoctorVerdict(where=where, summary=report.summary(RUNTIME_FIXABLE), summary_text=doc_line,
                          failed=tuple(c.name for c in report.failed), waived=tuple(g.waived),
                          deferred=tuple(g.deferred), blocking=bool(g.blocking)))
    return g.blocking, doc_line


def up(host: str = "localhost", recipe_path: str | Path | None = None, *, dry_run: bool = False, resume: str | None = None,
       detach: bool = False, waive: Sequence[str] = (), image_tar: str | None = None, overrides: Sequence[str] = (),
       ssh: dict | None = None,
       tune: bool = False, tune_budget_minutes: float = 20.0, facts_file: str | None = None,
       on_event: ev.Sink | None = None, connector: Connector | None = None, cpu_only: bool = False,
       native: tuple[str, str, str | None] | None = None,
       name: str | None = None, sync_model: str | None = None, sync_data: str | None = None) -> UpResult:
    """Phases: arguments -> lock -> record -> connect (or recorded facts) -> sync -> facts + doctor -> plan -> apply.
    ``on_event``: what the run tells (core/events.py; each is in the run record too), e.g. the CLI's
    renderer; none shown by default. ``connector``: an already open Connector to use instead of connecting to
    ``host`` (tests: FakeConnector)."""
    target = parse_host(host)  # a --host that is none of the forms is a usage error, before anything is recorded
    host = target.redacted     # a password in ssh://user:PW@host is never used, shown or recorded
    _check_up_arguments(host, resume, dry_run, facts_file)
    recorded_facts = load_facts_file(facts_file) if facts_file is not None else None
    recipe = load_up_recipe(recipe_path, overrides, native)
    _check_api_key(recipe, detach=detach, dry_run=dry_run)
    if image_tar:
        _check_image_tar(image_tar, recipe)
    if name is not None:
        check_run_name(name, host, job_name(recipe))
    waive = with_profile(waive, cpu_only)
    # one run, one lock (not for a dry run: it changes nothing): a second `up` of this job is refused here,
    # before it records or touches anything
    with contextlib.nullcontext() if dry_run else job_lock(host, job_name(recipe)):
        return _up_locked(host, recipe, dry_run=dry_run, resume=resume, detach=detach, waive=waive,
                          image_tar=image_tar, ssh=ssh, tune=tune, tune_budget_minutes=tune_budget_minutes,
                          facts_file=facts_file, recorded_facts=recorded_facts, on_event=on_event,
                          connector=connector, cpu_only=cpu_only, name=name, sync_model=sync_model,
                          sync_data=sync_data)


def _up_locked(host: str, recipe: Recipe, *, dry_run: bool, resume: str | None, detach: bool, waive: tuple[str, ...],
               image_tar: str | None, ssh: dict | None, tune: bool, tune_budget_minutes: float, facts_file: str | None,
               recorded_facts: HostFacts | None, on_event: ev.Sink | None,
               connector: Connector | None, cpu_only: bool, name: str | None, sync_model: str | None,
               sync_data: str | None) -> UpResult:
    events: Emitter | None = None
    conn = None
    held = contextlib.ExitStack()
    try:
        events = _new_record(recipe, host, waive, dry_run, facts_file, on_event, cpu_only=cpu_only, name=name)
        record = events.record
        result = UpResult(record=record, waived=list(waive))
        conn, where = _connect_phase(host, events, recorded_facts, facts_file, connector, ssh)
        if conn is not None and not dry_run:
            held.enter_context(output_lock(conn, host, output_dir_of(recipe)))
        _sync_phase(conn, recipe, events, sync_model, sync_data, dry_run=dry_run)
        report, blocking, doc_line = _doctor_phase(conn, recipe, recorded_facts, where, waive, events)
        if cpu_only and report.facts.gpu.count:
            raise _fail(events, "failed", UsageError(
                f"--cpu-only is for a host without a GPU; {where} has {report.facts.gpu.count} GPU(s)", key="--cpu-only",
                fix="Drop --cpu-only: on a GPU host the containers get their GPUs and every GPU check gates."),
                stage=StageName.PREFLIGHT)
        opts = UpOptions(host=host, run_id=record.id, resume=resume, detach=detach, waive=waive, tune=tune,
                         tune_budget_minutes=tune_budget_minutes,
                         image_tar=str(Path(image_tar).resolve()) if image_tar else None,
                         local=isinstance(conn, LocalConnector),
                         preflight={"connect": f"connected ({where})" if conn is not None else
                                    f"not connected: facts recorded in {facts_file}", "doctor": doc_line})
        plan = _plan_phase(conn, recipe, report, opts, record)
        result.plan = plan
        result.text = plan_text(plan, run_dir=str(record.path))
        if blocking:
            if dry_run:
                events.emit(ev.PlanText(text=result.text))
            raise _fail(events, "failed", CheckFailed(
                f"doctor on {where}: {doc_line}; nothing was started",
                results=report.failed, key="doctor",
                fix="Fix the failed checks (listed with their fixes), then run the same command again."
                    + profile_hint(blocking, report.facts.gpu.count)), stage=StageName.PREFLIGHT)
        if dry_run:
            stop = plan.stop()
            result.stops_at = stop[0].name if stop else None
            record.set_status("dry-run", **({"stops_at": stop[0].name, "stop_reason": stop[1].why} if stop else {}))
            events.emit(ev.DryRun(stops_at=result.stops_at))
            events.emit(ev.PlanText(text=result.text))
            result.state = "dry-run"
            return result
        assert conn is not None   # recorded facts only plan (--dry-run: _check_up_arguments)
        return _apply_phase(conn, plan, recipe, report, result, events, host=host, detach=detach)
    except KeyboardInterrupt as stop:
        # Ctrl-C or SIGTERM before the executor took over (it handles its own): nothing was started; say so in
        # the record (a SIGTERM used to leave it "planned")
        if events is not None and (events.record.path / rr.STATUS_JSON).exists():
            how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted (Ctrl-C)"
            events.emit(ev.Interrupted(reason=f"{how} before anything started on the host"))
            events.record.set_status("stopped", note=f"{how} during preflight/planning; nothing was started")
        raise
    finally:
        held.close()
        if conn is not None:
            conn.close()


def slurm_variant(recipe: Recipe, nodes: list[sl.ClusterNode]) -> tuple[str, str | None, str]:
    """(image reference, variant, how) for a cluster: a named variant as is; ``auto`` the best variant a node can
    run the job with (features, memory, GPUs, CPUs); a full image reference has no known CPU needs."""
    deploy = recipe.require_deploy()
    if deploy.image == V.AUTO:
        fitting = [v for v in reversed(LADDER) if sl.fit(_request(recipe, v), nodes).nodes]
        variant = fitting[0] if fitting else next((v for v in reversed(LADDER)
                                                   if any(v in n.features for n in nodes)), V.AVX2)
        how = f"auto: the best variant a node of the cluster runs this job with is {variant}"
    elif V.known(deploy.image):
        variant, how = V.canonical(deploy.image), "named in the recipe"
    else:
        return deploy.image, None, "full image reference from the recipe (no CPU constraint)"
    image, _v, _how = resolve_image(deploy.model_copy(update={"image": variant}), None)
    return image, variant, how


def _request(recipe: Recipe, variant: str | None) -> JobRequest:
    return request_for(recipe, variant)


def up_slurm(login: str, recipe_path: str | Path | None = None, *, dry_run: bool = False, detach: bool = False, resume: str | None = None,
             waive: Sequence[str] = (), overrides: Sequence[str] = (), ssh: dict | None = None,
             on_event: ev.Sink | None = None, connector: Connector | None = None) -> UpResult:
    """`ktdeploy up --slurm LOGIN`: the same recipe, record and stages, TRAIN and CONVERT as batch jobs submitted on
    the login node. Nothing is queued when no node can ever run the job (PREFLIGHT's slurm.fit, exit 1)."""
    login = parse_host(login).redacted
    _check_up_arguments(login, resume, dry_run, None)
    recipe = load_up_recipe(recipe_path, overrides)
    waive = tuple(dict.fromkeys(waive))
    # one run, one lock, as plain `up`: a second `up --slurm` of this job (or a `down` of it) is refused (exit 6)
    held = contextlib.ExitStack()
    if not dry_run:
        held.enter_context(job_lock(login, job_name(recipe)))
    with held:
        events = _new_record(recipe, login, waive, dry_run, None, on_event)
        record = events.record
        record.set_status("planned", scheduler="slurm", job_dir=job_dir_of(recipe))
        result = UpResult(record=record, waived=list(waive))
        conn, where = _connect_phase(login, events, None, None, connector, ssh)
        assert conn is not None   # no recorded facts: _connect_phase connected
        if not dry_run:
            try:
                held.enter_context(output_lock(conn, login, output_dir_of(recipe)))
            except RunRecordError:
                conn.close()
                raise
        try:
            try:
                nodes = cluster_nodes(conn)
            except StepError as e:
                raise _fail(events, "failed", e) from None
            record.write_json("cluster.json", [n.__dict__ for n in nodes])
            image, variant, how = slurm_variant(recipe, nodes)
            try:
                request = _request(recipe, variant)
            except KtdeployError as e:
                raise _fail(events, "failed", e) from None
            check = sl.fit_check(request, nodes)
            events.emit(ev.SlurmFit(check=check))
            record.write_json(rr.DOCTOR, {"checks": [check.model_dump(mode="json")], "request": request.__dict__})
            if check.status == "fail":
                raise _fail(events, "failed", CheckFailed(
                    f"slurm on {where}: no node can run this job; nothing was queued", results=[check], key=CheckName.SLURM_FIT,
                    fix=check.fix or "See the reasons below."))
            state = gather_job_state(conn, recipe, image)
            record.write_json(rr.JOB_STATE, state.to_json())
            queued = queued_jobs(conn, job_name(recipe))
            opts = UpOptions(host=login, run_id=record.id, resume=resume, detach=detach, waive=waive,
                             preflight={"connect": f"connected ({where})"})
            plan = build_slurm_plan(recipe, state, opts, image=image, variant=variant, queued=queued,
                                    fit_detail=check.detail)
            gpus_waived = CheckName.DOCKER_NVIDIA_RUNTIME in waive or CheckName.GPU_PRESENT in waive
            train = train_script(recipe, shipped_recipe(recipe, None), image=image, run_id=record.id, request=request,
                                 gpus_waived=gpus_waived, memlock=CheckName.DOCKER_MEMLOCK not in waive)
            conv = convert_script(recipe, image=image, run_id=record.id, request=request)
            files = {"slurm/train.sbatch": str(record.write_text(f"{rr.RENDERED}/slurm/train.sbatch", train.script)),
                     "slurm/convert.sbatch": str(record.write_text(f"{rr.RENDERED}/slurm/convert.sbatch", conv.script))}
            plan = dataclasses.replace(plan, rendered=files, notes=(*plan.notes, f"image: {how}"))
            record.write_json(rr.PLAN, plan.to_json())
            record.set_status("planned", image=image, adapter_dir=plan.adapter_dir,
                              slurm_request={"mem_mib": request.mem_mib, "cpus": request.cpus, "gpus": request.gpus,
                                             "constraint": request.constraint},
                              **({"slurm_jobs": queued} if queued else {}))
            result.plan = plan
            result.text = plan_text(plan, run_dir=str(record.path))
            if dry_run:
                record.set_status("dry-run")
                events.emit(ev.SlurmDryRun())
                events.emit(ev.PlanText(text=result.text))
                result.state = "dry-run"
                return result
            return _apply_phase(conn, plan, recipe, None, result, events, host=login, detach=detach)
        except KeyboardInterrupt as stop:
            how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted (Ctrl-C)"
            events.emit(ev.Interrupted(reason=f"{how} before anything was submitted"))
            record.set_status("stopped", note=f"{how} during preflight/planning; nothing was submitted")
            raise
        finally:
            if conn is not None:
                conn.close()


def _check_up_arguments(host: str, resume: str | None, dry_run: bool, facts_file: str | None) -> None:
    if resume not in (None, "auto") and not str(resume).startswith("/") and not str(resume).startswith("checkpoint-"):
        raise UsageError(f"--resume {resume!r}: give 'auto', a checkpoint-N name or an absolute checkpoint path",
                         key="--resume", fix="ktdeploy up --resume auto ...")
    if facts_file is not None and not dry_run:
        raise UsageError("--facts plans from recorded facts and changes nothing: it needs --dry-run", key="--facts",
                         fix=f"ktdeploy up --host {host} RECIPE --dry-run --facts {facts_file}")


def _check_image_tar(image_tar: str, recipe: Recipe) -> None:
    """--image-tar is loaded on the host with `docker load`, which applies every name in it: only an archive whose
    every name is one of the recipe's images (deploy.image_repo:<variant>, or deploy.image) is shipped."""
    from ktdeploy.controller.images.archive import require_only
    from ktdeploy.controller.images.variants import ISA_VARIANTS, image_tag

    if not Path(image_tar).is_file():
        raise UsageError(f"--image-tar {image_tar}: no such file", key="--image-tar",
                         fix="Give the tarball `ktdeploy image save` wrote.")
    deploy = recipe.require_deploy()
    allowed = {image_tag(deploy.image_repo, v) for v in ISA_VARIANTS} | {deploy.image}
    require_only(image_tar, allowed, f"{deploy.image_repo}:<variant> or deploy.image")


def _check_api_key(recipe: Recipe, *, detach: bool, dry_run: bool) -> None:
    """Checked before anything starts: the serve stage comes hours later, after training."""
    serve = recipe.deploy.serve if recipe.deploy is not None else None
    if serve is not None and serve.enabled and serve.api_key_env and not detach and not dry_run \
            and not os.environ.get(serve.api_key_env):
        raise UsageError(f"deploy.serve.api_key_env names {serve.api_key_env}, which is not set in this shell",
                         key="deploy.serve.api_key_env",
                         fix=f"export {serve.api_key_env}=<key>, then run ktdeploy up again")


def check_run_name(name: str, host: str, container: str) -> None:
    """--name: a name (the run id's rules), and one job's: a run of another host or job already named so is
    refused (the same job again — the same `up` re-run — keeps its name)."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name or len(name) > 64:
        raise UsageError(f"--name {printable(name)}: letters, digits, '.', '_' and '-' only, at most 64",
                         key="--name", fix="e.g. --name qwen-lora-v2")
    # --run takes an id, a name or an id's prefix, the id first: a name that reads as (the start of) an id would
    # name another run, or the next one (ids start with their UTC date)
    if not name[0].isalpha():
        raise UsageError(f"--name {printable(name)}: a run name starts with a letter (run ids start with their date, "
                         "and `--run` would take it for one)", key="--name", fix="e.g. --name qwen-lora-v2")
    for rec in all_runs():
        if rec.id.startswith(name):
            raise UsageError(f"--name {name}: it is (the start of) the id of run {rec.id}, which `--run {name}` "
                             "would name", key="--name",
                             fix="Choose another name; `ktdeploy status --all` lists the runs and their names.")
        try:
            st = rec.status()
        except RunRecordError:
            continue
        if st.get("name") == name and not (same_target(st.get("host"), host) and st.get("container") == container) \
                and not st.get("dry_run"):
            raise UsageError(f"--name {name}: run {rec.id} (host {st.get('host')}, recipe {st.get('recipe')}) has "
                             "that name", key="--name",
                             fix="Choose another name; `ktdeploy status --all` lists the runs and their names.")


def _sync_phase(conn: Connector | None, recipe: Recipe, events: Emitter, sync_model: str | None, sync_data: str | None,
                *, dry_run: bool) -> None:
    """--sync-model / --sync-data: the local folders onto the host (controller/sync.py), before doctor reads
    them; with recorded facts (no connection) only announced."""
    keys = recipe.keys
    jobs = [(role, local, target) for role, local, target in
            (("model", sync_model, keys.model_name_or_path), ("data", sync_data, keys.dataset_dir)) if local]
    for role, local, target in jobs:
        if not isinstance(target, str) or not target.startswith("/"):
            key = "model_name_or_path" if role == "model" else "dataset_dir"
            raise _fail(events, "failed", UsageError(
                f"--sync-{role} needs train.{key} to be an absolute host path, not {printable(target)}",
                key=f"--sync-{role}", fix=f"Set train.{key} to the folder the upload goes to."), stage=StageName.SYNC)
        if conn is None:
            events.emit(ev.SyncDeferred(local=local, target=target))
            continue
        from ktdeploy.controller.sync import sync_folder

        events.emit(ev.SyncStarted(role=role))
        try:
            sync_folder(conn, local, target, role=role, dry_run=dry_run, emit=events.emit)
        except KtdeployError as e:
            raise _fail(events, "failed", e, stage=StageName.SYNC) from None


def _new_record(recipe: Recipe, host: str, waive: tuple[str, ...], dry_run: bool, facts_file: str | None,
                on_event: ev.Sink | None, *, cpu_only: bool = False, name: str | None = None) -> Emitter:
    """The run's record, and the emitter of its events."""
    record = RunRecord.create(name or recipe.name)
    events = Emitter(record, on_event)
    record.write_text(rr.RECIPE, dump_yaml(recipe.to_document()))
    record.set_status("planned", host=host, recipe=recipe.name, recipe_path=str(recipe.path), created=time.time(),
                      container=job_name(recipe), serve_container=f"{job_name(recipe)}-serve",
                      lock=lock_key(host, job_name(recipe)),
                      output_dir=output_dir_of(recipe), waived=list(waive), dry_run=dry_run,
                      profile=CPU_ONLY if cpu_only else None, name=name,
                      **({"facts_file": str(facts_file)} if facts_file is not None else {}))
    if waive:   # --cpu-only is a waiver profile: it always waives
        also = tuple(w for w in waive if not cpu_only or w not in with_profile((), True))
        events.emit(ev.WaiversRecorded(checks=tuple(waive), profile=CPU_ONLY if cpu_only else None, also=also,
                                       status_file=f"{record.path}/{rr.STATUS_JSON}"))
    return events


def _fail(events: Emitter, state: str, err: KtdeployError, stage: str | None = None) -> KtdeployError:
    """Record a failure — the stage it happened in, the error, its fix, the failed checks, the exit code — in the
    event log and status.json (what `ktdeploy status` shows, and `down` keeps), and hand the error back."""
    record = events.record
    stage = stage or _current_stage(record)
    checks = [c.name for c in getattr(err, "results", None) or []]
    events.emit(ev.Failed(stage=stage, error=type(err).__name__, message=err.message, fix=err.fix,
                          failed_checks=tuple(checks)))
    record.set_status(state, failed_stage=stage, error=err.message, error_type=type(err).__name__, fix=err.fix,
                      failed_checks=checks, exit_code=err.exit_code)
    return err


def _current_stage(record: RunRecord) -> str:
    """The stage the executor was in (status.json's "stage"), else PREFLIGHT (connect, doctor, planning)."""
    try:
        stage = record.status().get("stage")
    except RunRecordError:
        stage = None
    return stage if isinstance(stage, str) and stage else StageName.PREFLIGHT


def _connect_phase(host: str, events: Emitter, recorded_facts: HostFacts | None, facts_file: str | None,
                   connector: Connector | None, ssh: dict | None) -> tuple[Connector | None, str]:
    """(connector or None, where): None when planning from recorded facts (a plan before the host exists)."""
    events.emit(ev.ConnectStarted(host=host))
    if recorded_facts is not None:
        events.emit(ev.PlanningFromFacts(path=str(facts_file), host=host))
        return None, f"{host} (facts recorded in {facts_file})"
    try:
        conn = connector if connector is not None else connect(host, **(ssh or {}))
    except ConnectError as e:
        raise _fail(events, "failed", e, stage=StageName.PREFLIGHT) from None
    events.emit(ev.Connected(connector=conn.name))
    return conn, conn.name


def _doctor_phase(conn: Connector | None, recipe: Recipe, recorded_facts: HostFacts | None, where: str,
                  waive: Sequence[str], events: Emitter) -> tuple[DoctorReport, list[CheckResult], str]:
    """Facts + doctor (live, or on recorded facts): (report, blocking failed checks, summary line)."""
    if recorded_facts is not None:
        report = DoctorReport(recorded_facts, run_checks(recorded_facts, recipe))
    else:
        assert conn is not None   # _connect_phase connects unless facts were recorded
        report = run_doctor(conn, recipe)
    events.record.write_json(rr.FACTS, report.facts.model_dump(mode="json"))
    events.record.write_json(rr.DOCTOR, report.to_json())
    blocking, doc_line = doctor_phase(report, where, waive, events.emit)
    return report, blocking, doc_line


def planned_user(host: str) -> str:
    """The --user of a plan made without reaching the host: root's ids, else a placeholder the real run fills."""
    t = parse_host(host)
    return "0:0" if t.user == "root" or (t.is_local and os.getuid() == 0) else "<uid>:<gid>"


def _plan_phase(conn: Connector | None, recipe: Recipe, report: DoctorReport, opts: UpOptions,
                record: RunRecord) -> Plan:
    """The job's state on the host, the plan (pure), and the files the run record keeps for reading (the
    container renders its own from the shipped recipe)."""
    image, _variant, _how = resolve_image(recipe.require_deploy(), report.facts)
    # with recorded facts nothing is known about the host's containers, image and output dir: a first run, as the
    # SSH user the real run reads on the host (its uid:gid; root is 0:0), so the argv is the real run's
    state = JobState(home="<home>", user=planned_user(opts.host)) if conn is None else \
        gather_job_state(conn, recipe, image)
    record.write_json(rr.JOB_STATE, state.to_json())
    plan = build_plan(recipe, report.facts, state, opts)
    derived = derived_kt_threads(recipe.train, report.facts, recipe.require_deploy().reserve_cores)
    rendered = render_recipe(recipe, derived).write(record.path / rr.RENDERED)
    ship = record.write_text(f"{rr.RENDERED}/ship/recipe.yaml", dump_yaml(shipped_recipe(recipe, plan.resume_from)))
    files = {k: str(v) for k, v in rendered.items()}
    files["ship/recipe.yaml"] = str(ship)
    plan = dataclasses.replace(plan, rendered=files)
    record.write_json(rr.PLAN, plan.to_json())
    record.set_status("planned", job_dir=plan.job_dir, image=plan.image, adapter_dir=plan.adapter_dir,
                      resume_from=plan.resume_from)
    return plan


def _apply_phase(conn: Connector, plan: Plan, recipe: Recipe, report: DoctorReport | None, result: UpResult,
                 events: Emitter, *, host: str, detach: bool) -> UpResult:
    """Run the plan on the host; Ctrl-C detaches (training keeps running), a lost connection is exit 3."""
    record = result.record
    for note in plan.notes:   # what --resume found: said before anything starts, and kept in the record
        if note.startswith("--resume"):
            events.emit(ev.ResumeNote(note=note))
    executor = Executor(conn, events, plan, recipe=recipe, facts=report.facts if report is not None else None)
    try:
        executor.apply()
    except KeyboardInterrupt as stop:
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted (Ctrl-C)"
        if isinstance(stop, Terminated) and executor.submitted_at:
            _cancel_submitted(conn, events, executor)   # up --slurm: a terminated submitter takes its jobs back
            raise
        if executor.jobs:
            record.set_status("detached", slurm_jobs=dict(executor.jobs))
        events.emit(ev.Detached(reason=how, job=plan.job, host=host, terminated=isinstance(stop, Terminated)))
        record.set_status("detached", note=f"controller {how}; training keeps running on the host")
        if isinstance(stop, Terminated):
            raise   # exit 143: the record already says what happened
        result.state = "detached"
        return result
    except ConnectError as e:
        if "keeps running" not in (e.fix or ""):
            e.fix = (e.fix or "") + " Training (if started) keeps running on the host; re-run `ktdeploy up` " \
                                    "(same arguments) to follow it."
        e.fix = (e.fix or "") + f" See it now: `ktdeploy status --host {host}`."
        raise _fail(events, "detached", e) from None
    except CheckFailed as e:   # IMAGE's image.check: doctor in the image failed (exit 1, like PREFLIGHT's)
        raise _fail(events, "failed", e) from None
    except RecipeError as e:   # IMAGE's image.check: the stack in the image refuses the recipe (exit 2)
        raise _fail(events, "failed", e) from None
    except StepError as e:
        cur = record.status().get("state")
        raise _fail(events, "crashed" if cur == "crashed" else "failed", e) from None
    if detach:
        record.set_status("detached", note="--detach: training runs on the host")
        result.state = "detached"
        events.emit(ev.StartedDetached(job=plan.job, host=host))
    else:
        record.set_status("finished")
        result.state = "finished"
        events.emit(ev.Done(adapter_dir=plan.adapter_dir, record_path=str(record.path)))
    return result


def _cancel_submitted(conn: Connector, events: Emitter, executor: Executor) -> None:
    """SIGTERM during ``up --slurm``: scancel the jobs this run submitted (not ones an earlier run left queued) —
    their batch scripts' traps stop the containers — and say so in the record: "stopped"; exit 143."""
    import signal

    ids = {role: executor.jobs[role] for role in executor.submitted_at if role in executor.jobs}
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if threading_main() else None
    try:
        done = {}
        for role, job_id in ids.items():
            try:
                r = conn.run(["scancel", "--", job_id], timeout=60)
                done[f"{role} job {job_id}"] = "cancelled" if r.rc == 0 else f"scancel exit {r.rc}"
            except ConnectError as e:
                done[f"{role} job {job_id}"] = f"not cancelled ({e.message})"
        events.emit(ev.Cancelled(reason="terminated (SIGTERM)", jobs=done))
        events.record.set_status("stopped", slurm_jobs=dict(executor.jobs), down=done,
                                 note="controller terminated (SIGTERM): the jobs it submitted were cancelled "
                                      "(scancel)")
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def load_facts_file(path: str | Path) -> HostFacts:
    """Host facts recorded earlier: `ktdeploy doctor --json` output ({"facts": ...}) or a bare facts.json
    (HostFacts, as tests/golden/*/facts.json). Bad input is a UsageError naming the file."""
    from pydantic import ValidationError

    p = Path(str(path))
    if not os.path.lexists(p):
        raise UsageError(f"--facts {p}: no such file", key="--facts",
                         fix="Record one on the host: ktdeploy doctor --json > facts.json")
    try:  # bounded, and a FIFO or device is refused rather than read
        data = load_json(p, MAX_JSON, "facts file")
    except UsageError as e:
        raise UsageError(e.message, key="--facts",
                         fix="Give the output of `ktdeploy doctor --json` or a facts.json.") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict) and "checks" in data:
        data = data["facts"]
    try:
        return HostFacts.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "(top level)"
        raise UsageError(f"--facts {p}: not host facts: {where}: {first.get('msg')}", key="--facts",
                         fix="Give the output of `ktdeploy doctor --json` or a facts.json.") from None


# -- status / logs / down ------------------------------------------------------------------------
def _host_filter(host: str | None) -> str | None:
    """--host of status/logs/down: the runs recorded for it (as `up` recorded it: its password dropped); a value
    that is no host is a usage error."""
    if host is None:
        return None
    return parse_host(host).redacted


def _connect_for(rec: RunRecord, st: dict, ssh: dict | None) -> Connector:
    host = rec.status_text("host", st, empty_ok=True)  # "" is this machine, as for `up`
    try:
        target = parse_host(host)
    except UsageError as e:
        raise RunRecordError(f"run record {rec.id}: {e.message}",
                             fix=f"Inspect or remove {rec.path}; `ktdeploy status --all` lists the others.") from None
    return connect(target, **(ssh or {}))


def _container(rec: RunRecord, st: dict, key: str = "container") -> str:
    name = rec.status_text(key, st)
    if not NAME.match(name):
        raise RunRecordError(f"run record {rec.id}: {key} {printable(name)} is not a container name",
                             fix=f"Inspect or remove {rec.path}.")
    return name


def status(host: str | None = None, run_id: str | None = None, *, ssh: dict | None = None, live: bool = True) -> dict:
    host = _host_filter(host)
    rec = latest_run(host, run_id=run_id)
    st = dict(rec.status())
    st["record"] = str(rec.path)
    if not st.get("lock"):   # a record of an older ktdeploy: the key its job's lock has now
        with contextlib.suppress(KtdeployError):
            st["lock"] = lock_key(rec.status_text("host", st, empty_ok=True), _container(rec, st))
    if live and slurm_run.is_slurm(st):
        try:
            conn = _connect_for(rec, st, ssh)
        except ConnectError as e:
            st["live"] = {"error": e.message}
            return st
        try:
            st["live"] = slurm_run.status(conn, rec, st)
        except ConnectError as e:
            st["live"] = {"error": e.message}
        finally:
            conn.close()
        return st
    if live:
        job, serve_job, log = _container(rec, st), _container(rec, st, "serve_container"), rec.status_text("output_dir", st)
        try:
            conn = _connect_for(rec, st, ssh)
        except ConnectError as e:
            st["live"] = {"error": e.message}
            return st
        try:
            snap = snapshot(conn, job, JobLayout(log).trainer_log)
            serve = snapshot(conn, serve_job, "/dev/null").state
        except ConnectError as e:
            st["live"] = {"error": e.message}
            return st
        finally:
            conn.close()
        st["live"] = {"container": snap.state.__dict__ if snap.state else None,
                      "progress": snap.entry.to_json() if snap.entry else None,
                      "serve": serve.__dict__ if serve else None}
    return st


def logs(host: str | None = None, run_id: str | None = None, *, follow: bool = False, tail: int = 100,
         ssh: dict | None = None, write: Callable[[str], None] = print, poll_s: float = 2.0) -> None:
    host = _host_filter(host)
    rec = latest_run(host, run_id=run_id)
    st = rec.status()
    if slurm_run.is_slurm(st):
        conn = _connect_for(rec, st, ssh)
        try:
            slurm_run.logs(conn, rec, st, follow=follow, tail=tail, write=write, poll_s=poll_s)
        except KeyboardInterrupt:
            pass
        finally:
            conn.close()
        return
    name = _container(rec, st)
    conn = _connect_for(rec, st, ssh)
    try:
        r = conn.run(dk.logs(name, tail=tail, timestamps=True), timeout=120)
        if r.rc != 0:
            raise StepError(f"no logs for {name} on {conn.name}: {r.stderr.strip()[-300:]}",
                            fix="The container was removed (ktdeploy down?) — its log is in the run record's artifacts/.")
        last = _emit(r.stdout + r.stderr, None, write)
        while follow:
            snap = snapshot(conn, name, "/dev/null")
            r = conn.run(dk.logs(name, timestamps=True, since=last), timeout=120)
            last = _emit(r.stdout + r.stderr, last, write) or last
            if snap.state is None or not snap.state.running:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()


def _emit(text: str, after: str | None, write: Callable[[str], None]) -> str | None:
    """Write docker log lines (RFC3339Nano timestamp first) newer than ``after``; return the newest timestamp."""
    newest = after
    for line in sorted(text.splitlines()):
        ts, _, msg = line.partition(" ")
        if after and ts <= after:
            continue
        write(msg)
        newest = ts
    return newest


def down(host: str | None = None, run_id: str | None = None, *, ssh: dict | None = None) -> dict:
    """Stop and remove the job's containers (training and serving); the output dir and checkpoints stay.
    Holds the job's lock: while an `up` of the job runs, `down` is refused (it would race the containers up
    creates); stop that `up` first (Ctrl-C detaches it), then run down."""
    host = _host_filter(host)
    rec = latest_run(host, run_id=run_id)
    st = rec.status()
    if slurm_run.is_slurm(st):
        conn = _connect_for(rec, st, ssh)
        try:
            done = slurm_run.down(conn, rec, st)
        finally:
            conn.close()
        rec.set_status("stopped", down=done)
        return done
    names = [_container(rec, st, key) for key in ("serve_container", "container") if st.get(key)]
    with job_lock(rec.status_text("host", st, empty_ok=True), _container(rec, st)):
        return _down_locked(rec, st, names, ssh)


def _down_locked(rec: RunRecord, st: dict, names: list[str], ssh: dict | None) -> dict:
    conn = _connect_for(rec, st, ssh)
    done = {}
    try:
        for name in names:
            if conn.run(dk.exists_probe(name), timeout=60).rc != 0:
                done[name] = "absent"
                continue
            # the container's last words, kept in the record (never through a link, never outside artifacts/)
            write_file(rec.path / rr.ARTIFACTS, f"{name}.log", redact(container_logs(conn, name, tail=None)),
                       overwrite=True)
            conn.run(dk.stop(name), timeout=120)
            r = conn.run(dk.remove(name), timeout=120)
            if r.rc != 0:
                raise StepError(f"could not remove {name}: {r.stderr.strip()[-300:]}")
            done[name] = "removed"
            Emitter(rec).emit(ev.ContainerRemoved(container=name))
    finally:
        conn.close()
    # down stops a job; it never rewrites how a run ended (a failed or crashed run keeps its stage, error and fix)
    state = st.get("state")
    keep = isinstance(state, str) and state in ("failed", "crashed", "finished", "dry-run")
    rec.set_status(state if keep and isinstance(state, str) else "stopped", down=done, down_at=time.time())
    return done


__all__ = ["RunRecordError", "UpResult", "down", "logs", "status", "up", "up_slurm"]
