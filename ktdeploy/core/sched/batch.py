"""The sbatch scripts of a Slurm job (pure): the header from ktdeploy's request (``request.py``), the body the same
container commands as ``up --host`` (``core/plan/docker_argv.py``), with what only the node knows at run time —
the job id, its GPUs, CPUs and memory, the user — filled in by the shell from Slurm's variables.

Every fixed value is shell-quoted; the recipe travels inside the script as base64 (no user text unquoted).
The training script:
  * names its container ``<job>-j<SLURM_JOB_ID>`` and traps TERM/INT (scancel, requeue, the --signal before the
    time limit) to stop and remove it: killing the docker client alone leaves the container running;
  * gives the container the allocation: ``--cpus`` = SLURM_CPUS_PER_TASK (the agent derives kt_num_threads from
    this quota), ``--memory`` = SLURM_MEM_PER_NODE, ``--gpus device=SLURM_JOB_GPUS``;
  * resumes with ``train --resume auto`` (the agent picks the newest complete checkpoint, same world size) when
    the output dir holds a checkpoint — a requeued job goes on where it stopped.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.host_plan import job_name, output_dir_of
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.recipe.schema import Scheduler
from ktdeploy.core.sched.request import JobRequest

JOBS_FOLDER = ".ktdeploy-jobs"
CNAME = "\0cname\0"      # placeholders in an argv, written as shell expansions (never user text)
DYNAMIC = "\0dynamic\0"
CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
STOP_SECONDS = 20        # docker stop's grace period inside the trap; slurm.conf's KillWait must exceed it


def job_dir_of(recipe: Recipe) -> str:
    """Where a job's scripts, recipe and Slurm logs live: on the output volume, which login and compute nodes
    share (the container writes its output there too)."""
    return posixpath.join(recipe.require_deploy().volumes.output, JOBS_FOLDER, job_name(recipe))


@dataclass(frozen=True)
class BatchJob:
    name: str          # the Slurm job name (= up's container name)
    role: str          # train | convert
    script: str


def _words(argv: list[str]) -> str:
    out = []
    for a in argv:
        if a == DYNAMIC:
            out.append('"${dyn[@]}"')
        else:  # the container name inside an item (a label, NAME:PATH) becomes "$cname" next to quoted text
            out.append('"$cname"'.join(shlex.quote(p) if p else "" for p in a.split(CNAME)))
    return " ".join(out)


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


def _header(name: str, role: str, job_dir: str, *, time: str, mem_mib: int, cpus: int, gpus: int,
            constraint: str | None, sched: Scheduler, requeue: bool) -> list[str]:
    d = sbatch_line
    lines = ["#!/bin/bash", d("--job-name", name + ("" if role == "train" else f"-{role}")),
             d("--output", sbatch_output_path(job_dir, role)), d("--open-mode", "append"), d("--time", time),
             d("--mem", f"{int(mem_mib)}M"), d("--cpus-per-task", int(cpus)), d("--hint", "nomultithread")]
    if gpus:
        lines.append(d("--gres", f"gpu:{int(gpus)}"))
    if constraint:
        lines.append(d("--constraint", constraint))
    if sched.partition:
        lines.append(d("--partition", sched.partition))
    if sched.account:
        lines.append(d("--account", sched.account))
    if requeue:
        lines += [d("--requeue"), d("--signal", f"B:TERM@{int(sched.signal_seconds)}")]
    else:
        lines.append(d("--no-requeue"))
    return lines


def _prologue(cname_prefix: str, *, gpus: bool) -> list[str]:
    return [
        "set -u",
        f"cname={shlex.quote(cname_prefix)}-j\"$SLURM_JOB_ID\"",
        'echo "ktdeploy: job $SLURM_JOB_ID on $(hostname) restart ${SLURM_RESTART_COUNT:-0} '
        'GPUs ${SLURM_JOB_GPUS:-none} CPUs ${SLURM_CPUS_PER_TASK:-?} memory ${SLURM_MEM_PER_NODE:-?}M container $cname"',
        # the user the job runs as owns the output (up --host: the SSH user); a non-root uid gets a writable HOME
        'dyn=(--user "$(id -u):$(id -g)" --label "ktdeploy.slurm_job=$SLURM_JOB_ID")',
        '[ "$(id -u)" -eq 0 ] || dyn+=(--env HOME=/tmp)',
        'dyn+=(--cpus "${SLURM_CPUS_PER_TASK:-1}")',
        '[ -n "${SLURM_MEM_PER_NODE:-}" ] && dyn+=(--memory "${SLURM_MEM_PER_NODE}m")',
        *(['[ -n "${SLURM_JOB_GPUS:-}" ] && dyn+=(--gpus "\\"device=$SLURM_JOB_GPUS\\"")'] if gpus else
          ["# GPU checks waived: the container starts without --gpus (test clusters only)"]),
        "stop() {",
        '  echo "ktdeploy: signal received, stopping $cname"',
        f'  docker stop --time {STOP_SECONDS} -- "$cname" >/dev/null 2>&1',
        '  docker rm --force -- "$cname" >/dev/null 2>&1',
        "  exit 143",
        "}",
        "trap stop TERM INT",
        # an earlier run of this job (requeued from a node that died) may have left its container behind
        'docker rm --force -- "$cname" >/dev/null 2>&1 || true',
    ]


def _run_and_wait() -> list[str]:
    # in the background + wait: the trap runs as soon as the signal arrives, not when the container exits
    return ['docker start --attach -- "$cname" &',
            "wait $!",
            "rc=$?",
            'docker rm --force -- "$cname" >/dev/null 2>&1',
            'echo "ktdeploy: $cname exited $rc"',
            'exit "$rc"']


def train_script(recipe: Recipe, shipped: dict[str, Any], *, image: str, run_id: str, request: JobRequest, gpus_waived: bool = False,
                 memlock: bool = True) -> BatchJob:
    """The training job: ``docker create`` (up's argv, allocation added), recipe copied in, started attached."""
    sbatch_values(recipe)
    name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
    vol = recipe.require_deploy().volumes
    create = dk.create_train(name=CNAME, image=image, run_id=run_id, volumes=vol, output_dir=out, gpus=None,
                             memlock=memlock, user=None)
    create = [*create[:2], DYNAMIC, *create[2:]]
    ship = posixpath.join(job_dir, "ship")
    recipe_b64 = base64.b64encode(dump_yaml(shipped).encode()).decode()
    lines = _header(name, "train", job_dir, time=request.time, mem_mib=request.mem_mib, cpus=request.cpus,
                    gpus=request.gpus, constraint=request.constraint, sched=recipe.require_deploy().scheduler, requeue=True)
    lines += ["# Written by `ktdeploy up-slurm` / `ktdeploy render --slurm`: the recipe's training job.",
              f"# submit by hand: mkdir -p {shlex.quote(job_dir)} && sbatch THIS_FILE", ""]
    lines += _prologue(name, gpus=not gpus_waived)
    lines += [f"out={shlex.quote(out)}",
              f"ship={shlex.quote(ship)}",
              'mkdir -p -- "$ship"',
              f"echo {shlex.quote(recipe_b64)} | base64 -d > \"$ship/recipe.yaml\"",
              "resume=()",
              # which checkpoint is the agent's choice (newest complete, same world size); the shell only asks
              'if compgen -G "$out/checkpoint-*" >/dev/null; then resume=(--resume auto); '
              'echo "ktdeploy: checkpoints in $out: resuming"; fi',
              _words(create) + ' "${resume[@]}" >/dev/null || exit 4',
              _words(dk.copy_job(ship, CNAME)) + " || exit 4",
              *_run_and_wait()]
    return BatchJob(name=name, role="train", script="\n".join(lines) + "\n")


def convert_script(recipe: Recipe, *, image: str, run_id: str, request: JobRequest) -> BatchJob:
    """The conversion job (after the training job: --dependency=afterok): CPU only, the variant's CPU needs."""
    sbatch_values(recipe)
    name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
    adapter = JobLayout(out).adapter_dir
    run = dk.run_convert(name=CNAME, image=image, run_id=run_id, volumes=recipe.require_deploy().volumes, output_dir=out,
                         adapter_dir=adapter, user=None)
    run = [*run[:3], DYNAMIC, *run[3:]]
    lines = _header(name, "convert", job_dir, time="02:00:00", mem_mib=4096, cpus=1, gpus=0,
                    constraint=request.constraint, sched=recipe.require_deploy().scheduler, requeue=False)
    lines += ["# Written by `ktdeploy up-slurm`: converts the training output for sglang-kt.", ""]
    lines += _prologue(f"{name}-convert", gpus=False)
    lines += [f"adapter={shlex.quote(adapter)}",
              'if [ -f "$adapter/ktdeploy_convert.json" ]; then echo "ktdeploy: already converted"; exit 0; fi',
              _words(run) + " &", "wait $!", "rc=$?", 'echo "ktdeploy: convert exited $rc"', 'exit "$rc"']
    return BatchJob(name=name, role="convert", script="\n".join(lines) + "\n")
