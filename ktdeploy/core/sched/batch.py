"""The sbatch scripts of a Slurm job (pure): the header from ktdeploy's request (``request.py``), the body one
container of the image started by the job's runtime (``runtimes.py``: podman, pyxis, apptainer, or docker on
request), watched by the supervising shell (``supervise.py``), with what only the node knows at run time — the job
id, its CPUs, GPUs and memory, the user — filled in by the shell from Slurm's variables and the job's cgroup.

Every fixed value is shell-quoted; the recipe travels inside the script as base64 (no user text unquoted).
The training script:
  * names its container ``<job>-j<SLURM_JOB_ID>``; TERM/INT (scancel, a requeue by hand, the time limit itself) stop
    it at once and exit 143 (a user's stop is never requeued);
  * asks Slurm for USR1 ``N`` seconds before the time limit (``signal_time.py``: from the step time): the trap writes
    the stop request, the trainer saves a checkpoint at its next step boundary and exits, the script requeues the
    job (``scontrol requeue``) and the next run resumes from exactly that checkpoint;
  * reads the job's CPUs from its cgroup (else the shell's mask) and hands them to the container
    (``KTDEPLOY_CPUSET``): the agent stays on them and derives kt_num_threads from their physical cores;
  * resumes with ``train --resume auto`` (the agent picks the newest complete checkpoint, same world size) when
    the output dir holds a checkpoint — a job requeued after a node failure goes on where it stopped.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.host_plan import job_name, output_dir_of
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.recipe.schema import Scheduler
from ktdeploy.core.sched import runtimes as rt
from ktdeploy.core.sched.request import JobRequest
from ktdeploy.core.sched.runtimes import CNAME, STOP_SECONDS, Job, words
from ktdeploy.core.sched.supervise import CPUSET_FN, Supervision, epilogue, prologue, wait_lines

JOBS_FOLDER = ".ktdeploy-jobs"
CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def job_dir_of(recipe: Recipe) -> str:
    """Where a job's scripts, recipe and Slurm logs live: on the output volume, which login and compute nodes
    share (the container writes its output there too)."""
    return posixpath.join(recipe.require_deploy().volumes.output, JOBS_FOLDER, job_name(recipe))


@dataclass(frozen=True)
class BatchJob:
    name: str          # the Slurm job name (= up's container name)
    role: str          # train | convert
    script: str


@dataclass(frozen=True)
class Launch:
    """How the job's containers start: the runtime, the image (a reference, and the file the runtime reads when
    deploy.scheduler.image_file names one), how early the job is warned, and the test clusters' waivers."""

    runtime: str
    image: str
    image_file: str | None = None
    signal_seconds: int = 120
    gpus: bool = True          # False: GPU checks waived, the container starts without the job's GPUs
    memlock: bool = True


def sbatch_line(option: str, value: object | None = None) -> str:
    """One ``#SBATCH`` directive, its token shell-quoted: sbatch's own reader of these lines splits on blanks,
    honours quotes and stops at an unquoted ``#``, so a value with a blank, quote or ``#`` (a path) stays one
    option and can never add another. A newline or other control character cannot be expressed on one line:
    the recipe's checks refuse them (``paths.control_chars``); here it is a bug, never a directive."""
    token = option if value is None else f"{option}={value}"
    if CONTROL_OR_NEWLINE.search(token):
        raise ValueError(f"control character in #SBATCH {option}")
    if HETJOB_WORD.search(token):
        raise ValueError(f"hetjob/packjob in #SBATCH {option}")
    return f"#SBATCH {shlex.quote(token)}"


# sbatch reads any #SBATCH line holding one of these words (any case, anywhere, quoted or not) as the boundary of
# a heterogeneous job's components (src/sbatch/opt.c, _opt_batch_script): the options after it would be another job
HETJOB_WORD = re.compile(r"hetjob|packjob", re.IGNORECASE)


def sbatch_output_path(job_dir: str, role: str) -> str:
    """The --output file pattern: ``%`` in the folder doubled (Slurm's filename patterns read ``%x``, ``%u``…);
    only our ``%j`` is a pattern. A backslash would switch Slurm's patterns off (the log would be named
    ``train-%j.out``): refused by ``sbatch_values``."""
    return f"{job_dir.replace('%', '%%')}/{role}-%j.out"


def sbatch_values(recipe: Recipe) -> None:
    """Refuse (RecipeError naming the key) what no ``#SBATCH`` line can carry as is: a backslash in the output
    volume (sbatch reads it as an escape and Slurm's filename patterns as "no patterns"), a control character."""
    from ktdeploy.core.errors import RecipeError
    from ktdeploy.core.terminal_text import terminal_safe

    deploy = recipe.require_deploy()
    for key, value in (("deploy.volumes.output", deploy.volumes.output),
                       ("train.output_dir", output_dir_of(recipe))):
        if "\\" in value or CONTROL_OR_NEWLINE.search(value):
            raise RecipeError(f"{terminal_safe(value)!r} cannot be written into a Slurm batch script's #SBATCH lines "
                              "(a backslash is an escape to sbatch and switches off Slurm's %j; control characters "
                              "end the line)", key=key,
                              fix="Use a folder whose name has no backslash or control character for the Slurm path.")
    sched = deploy.scheduler
    directive_values = (("the recipe's file name", recipe.name, "Rename the recipe file (its name is the job's name)."),
                        ("deploy.volumes.output", deploy.volumes.output, "Use another folder for the Slurm output."),
                        ("train.output_dir", output_dir_of(recipe), "Use another folder for the Slurm output."),
                        ("deploy.scheduler.partition", sched.partition or "",
                         "Name the partition by another name (ask the cluster's admin)."),
                        ("deploy.scheduler.account", sched.account or "",
                         "Name the account by another name (ask the cluster's admin)."))
    for key, value, fix in directive_values:
        if (word := HETJOB_WORD.search(value)) is not None:
            raise RecipeError(f"{terminal_safe(value)!r} holds {word.group(0)!r}: sbatch takes any "
                              "#SBATCH line with 'hetjob' or 'packjob' in it (any case) as the start of another "
                              "component of a heterogeneous job, so the job ktdeploy submits would not be the one it "
                              "meant", key=key, fix=fix)



def _header(name: str, role: str, job_dir: str, *, request: JobRequest, sched: Scheduler, launch: Launch) -> list[str]:
    d = sbatch_line
    train = role == "train"
    time, mem_mib, cpus, gpus = ((request.time, request.mem_mib, request.cpus, request.gpus) if train
                                 else ("02:00:00", 4096, 1, 0))
    lines = ["#!/bin/bash", d("--job-name", name + ("" if train else f"-{role}")),
             d("--output", sbatch_output_path(job_dir, role)), d("--open-mode", "append"), d("--time", time),
             d("--mem", f"{int(mem_mib)}M"), d("--cpus-per-task", int(cpus)), d("--hint", "nomultithread")]
    if gpus:
        lines.append(d("--gres", f"gpu:{int(gpus)}"))
    if request.constraint:
        lines.append(d("--constraint", request.constraint))
    if sched.partition:
        lines.append(d("--partition", sched.partition))
    if sched.account:
        lines.append(d("--account", sched.account))
    if train:
        lines += [d("--requeue"), d("--signal", f"B:USR1@{int(launch.signal_seconds)}")]
    else:
        lines.append(d("--no-requeue"))
    return lines


def _node_lines(cname_prefix: str, launch: Launch) -> list[str]:
    """The container's name, the job's CPUs, the runtime present on this node, the line that says it all."""
    need = {"pyxis": "srun", "apptainer": "apptainer"}.get(launch.runtime, launch.runtime)
    return [
        "set -u",
        f"cname={shlex.quote(cname_prefix)}-j\"$SLURM_JOB_ID\"",
        CPUSET_FN,
        # the job's cores: its cgroup's cpuset (ConstrainCores), else this shell's mask (task/affinity, or the node)
        "job_cgroup_cpus=$(ktd_cgroup_cpus)",
        "job_cpus=${job_cgroup_cpus:-$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)}",
        'echo "ktdeploy: job $SLURM_JOB_ID on $(hostname) restart ${SLURM_RESTART_COUNT:-0} runtime '
        f'{launch.runtime} CPUs $job_cpus (cgroup cpuset: ${{job_cgroup_cpus:-none}}) GPUs ${{SLURM_JOB_GPUS:-none}} '
        'memory ${SLURM_MEM_PER_NODE:-?}M container $cname"',
        f"command -v {shlex.quote(need)} >/dev/null 2>&1 || {{ echo \"ktdeploy: {launch.runtime} is not installed "
        f"on $(hostname): install it on every node or set deploy.scheduler.runtime\"; exit 4; }}",
        # the supervising shell owns the stop request (agent/stop_request.py): the agent leaves it alone
        'export KTDEPLOY_CPUSET="$job_cgroup_cpus" KTDEPLOY_SUPERVISED=1',
    ]


def _dyn(launch: Launch) -> list[str]:
    """Per-job flags only the node knows (an array the container's argv expands)."""
    lines = ['dyn=(--label "ktdeploy.slurm_job=$SLURM_JOB_ID")']
    if launch.runtime == rt.DOCKER:
        # docker's container is not the job's: give it the job's cores as a cpuset (a --cpus quota is CPU time on
        # any core), its memory and its GPUs, and run it as the job's user
        lines += ['dyn+=(--user "$(id -u):$(id -g)" --cpuset-cpus "$job_cpus" --env KTDEPLOY_CPUSET="$job_cpus" '
                  '--env KTDEPLOY_SUPERVISED)',
                  '[ -n "${SLURM_MEM_PER_NODE:-}" ] && dyn+=(--memory "${SLURM_MEM_PER_NODE}m")',
                  '[ "$(id -u)" -eq 0 ] || dyn+=(--env HOME=/tmp)']
        if launch.gpus:
            lines.append('[ -n "${SLURM_JOB_GPUS:-}" ] && dyn+=(--gpus "\\"device=$SLURM_JOB_GPUS\\"")')
    elif launch.runtime == rt.PODMAN:
        lines += ['dyn+=(--env KTDEPLOY_CPUSET --env KTDEPLOY_SUPERVISED --env SLURM_JOB_ID --env SLURM_CPU_BIND)',
                  '[ "$(id -u)" -eq 0 ] || dyn+=(--env HOME=/tmp)']
        if launch.gpus:   # CDI names (nvidia-ctk cdi generate): the job's GPUs by index
            lines.append('gpus=${SLURM_JOB_GPUS:-}; for g in ${gpus//,/ }; do dyn+=(--device "nvidia.com/gpu=$g"); done')
    if not launch.gpus:
        lines.append("# GPU checks waived: the container starts without the job's GPUs (test clusters only)")
    return lines


def _stop_lines(runtime: str) -> tuple[str, ...]:
    if runtime == rt.DOCKER:
        return (f'docker stop --time {STOP_SECONDS} -- "$cname" >/dev/null 2>&1',
                'docker rm --force -- "$cname" >/dev/null 2>&1')
    if runtime == rt.PODMAN:
        return (f'podman stop --time {STOP_SECONDS} -- "$cname" >/dev/null 2>&1',
                'podman rm --force --ignore -- "$cname" >/dev/null 2>&1')
    return ('kill -TERM "$pid" 2>/dev/null',)   # srun passes it to the step


def _start(runtime: str, job: Job, ship: str | None) -> tuple[list[str], str, list[str]]:
    """(lines before the start, the line that runs the container in the foreground, lines after it ends)."""
    if runtime == rt.DOCKER:
        before = ['docker rm --force -- "$cname" >/dev/null 2>&1 || true',   # a container left by an earlier run
                  words(rt.docker_create(job)) + " >/dev/null || exit 4"]
        if ship:
            before.append(words(dk.copy_job(ship, CNAME)) + " || exit 4")
        return before, 'docker start --attach -- "$cname"', ['docker rm --force -- "$cname" >/dev/null 2>&1']
    if runtime == rt.PODMAN:
        before = ['podman rm --force --ignore -- "$cname" >/dev/null 2>&1 || true', *rt.podman_image_lines(job)]
        return before, words(rt.podman_run(job)), []
    env = ["export KTDEPLOY_RUN=" + shlex.quote(job.run_id) + " PYTHONUNBUFFERED=1"]
    if runtime == rt.PYXIS:
        # enroot's NVIDIA hook mounts the driver for these GPUs (the image sets no NVIDIA_VISIBLE_DEVICES of its own)
        env.append('export NVIDIA_VISIBLE_DEVICES="${SLURM_JOB_GPUS:-void}" NVIDIA_DRIVER_CAPABILITIES=compute,utility')
        return env, words(rt.pyxis_srun(job)), []
    return env, words(rt.apptainer_exec(job)), []


def require_image(recipe: Recipe, launch: Launch) -> None:
    """RecipeError naming the key when the runtime cannot read the image it is given."""
    suffixes = {rt.PYXIS: (".sqsh", ".squashfs", ".sqfs"), rt.APPTAINER: (".sif",), rt.PODMAN: (".tar",)}
    fmt = {rt.PYXIS: "squashfs", rt.APPTAINER: "sif", rt.PODMAN: "docker"}
    if launch.runtime == rt.DOCKER:
        return
    file = launch.image_file
    if file is not None and not file.endswith(suffixes[launch.runtime]):
        raise RecipeError(f"deploy.scheduler.image_file {file!r} is not what {launch.runtime} reads "
                          f"({' or '.join(suffixes[launch.runtime])})", key="deploy.scheduler.image_file",
                          fix=f"ktdeploy image save --format {fmt[launch.runtime]} --isa VARIANT -o FILE, on a folder "
                              "every node sees.")
    if file is None and launch.runtime != rt.PODMAN and not rt.has_registry(launch.image):
        raise RecipeError(f"{launch.runtime} cannot find the image {launch.image!r}: it is a local tag, and neither a "
                          "registry nor an image file is named", key="deploy.scheduler.image_file",
                          fix=f"ktdeploy image save --format {fmt[launch.runtime]} --isa VARIANT -o FILE on a folder "
                              f"every node sees and set deploy.scheduler.image_file: FILE, or push the image and set "
                              "deploy.registry.")
    vol = recipe.require_deploy().volumes
    mountable = {"deploy.volumes.model": vol.model, "deploy.volumes.data": vol.data, "deploy.volumes.output": vol.output}
    if file:
        mountable["deploy.scheduler.image_file"] = file
    rt.require_mountable(launch.runtime, mountable)


def train_script(recipe: Recipe, shipped: dict[str, Any], *, run_id: str, request: JobRequest,
                 launch: Launch) -> BatchJob:
    """The training job: the image's ``train`` in the job's runtime, watched for the time limit's warning."""
    sbatch_values(recipe)
    require_image(recipe, launch)
    name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
    deploy = recipe.require_deploy()
    ship = posixpath.join(job_dir, "ship")
    job = Job(role="train", image=launch.image, image_file=launch.image_file, volumes=deploy.volumes,
              output_dir=out, run_id=run_id, agent_args=("train", dk.CONTAINER_RECIPE), ship=ship,
              gpus=launch.gpus, memlock=launch.memlock)
    recipe_b64 = base64.b64encode(dump_yaml(shipped).encode()).decode()
    layout = JobLayout(out)
    sup = Supervision(save_on=("USR1",), stop_on=("TERM", "INT"), stop_request=layout.stop_request,
                      stopped_marker=layout.stopped_marker, stop_lines=_stop_lines(launch.runtime),
                      after_save=('echo "ktdeploy: requeueing job $SLURM_JOB_ID: it resumes from that checkpoint"',
                                  'scontrol requeue "$SLURM_JOB_ID" && exit 0',
                                  'echo "ktdeploy: scontrol requeue failed: run ktdeploy up-slurm again to resume"'),
                      who="Slurm (the time limit is near, or a preemption)")
    before, start, after = _start(launch.runtime, job, ship)
    lines = _header(name, "train", job_dir, request=request, sched=deploy.scheduler, launch=launch)
    lines += ["# Written by `ktdeploy up-slurm` / `ktdeploy render --slurm`: the recipe's training job.",
              f"# runtime: {launch.runtime}; USR1 {int(launch.signal_seconds)} s before the time limit: the trainer "
              "saves at its next step, the job is requeued and resumes there.",
              f"# submit by hand: mkdir -p {shlex.quote(job_dir)} && sbatch THIS_FILE", ""]
    lines += _node_lines(name, launch)
    lines += [f"out={shlex.quote(out)}",
              f"ship={shlex.quote(ship)}",
              'mkdir -p -- "$ship"',
              f"echo {shlex.quote(recipe_b64)} | base64 -d > \"$ship/recipe.yaml\"",
              "resume=()",
              # which checkpoint is the agent's choice (newest complete, same world size); the shell only asks
              'if compgen -G "$out/checkpoint-*" >/dev/null; then resume=(--resume auto); '
              'echo "ktdeploy: checkpoints in $out: resuming"; fi']
    lines += _supervised(launch, sup, before, start, after)
    return BatchJob(name=name, role="train", script="\n".join(lines) + "\n")


def _supervised(launch: Launch, sup: Supervision, before: list[str], start: str,
                after: list[str]) -> list[str]:
    """The part every job script shares: the runtime's settings, then the container started and waited on inside
    the supervising shell's prologue and epilogue."""
    return [*_dyn(launch), *prologue(sup), *before, *wait_lines(start), *after, *epilogue(sup)]


def convert_script(recipe: Recipe, *, run_id: str, request: JobRequest, launch: Launch) -> BatchJob:
    """The conversion job (after the training job: --dependency=afterok): CPU only, the variant's CPU needs."""
    sbatch_values(recipe)
    require_image(recipe, launch)
    name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
    adapter = JobLayout(out).adapter_dir
    cl = Launch(runtime=launch.runtime, image=launch.image, image_file=launch.image_file,
                signal_seconds=launch.signal_seconds, gpus=False, memlock=launch.memlock)
    job = Job(role="convert", image=launch.image, image_file=launch.image_file, volumes=recipe.require_deploy().volumes,
              output_dir=out, run_id=run_id, agent_args=("convert", out, "-o", adapter), gpus=False)
    sup = Supervision(save_on=(), stop_on=("TERM", "INT"), stop_lines=_stop_lines(launch.runtime))
    before, start, after = _start(launch.runtime, job, None)
    if launch.runtime == rt.DOCKER:   # `docker run --rm` in the foreground, as before
        before, start, after = ['docker rm --force -- "$cname" >/dev/null 2>&1 || true'], words(rt.docker_create(job)), []
    lines = _header(name, "convert", job_dir, request=request, sched=recipe.require_deploy().scheduler, launch=cl)
    lines += ["# Written by `ktdeploy up-slurm`: converts the training output for sglang-kt.", ""]
    lines += _node_lines(f"{name}-convert", cl)
    lines += [f"adapter={shlex.quote(adapter)}",
              'if [ -f "$adapter/ktdeploy_convert.json" ]; then echo "ktdeploy: already converted"; exit 0; fi',
              "resume=()"]
    lines += _supervised(cl, sup, before, start, after)
    return BatchJob(name=name, role="convert", script="\n".join(lines) + "\n")
