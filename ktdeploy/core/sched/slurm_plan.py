"""The plan of ``ktdeploy up-slurm`` (pure): the same record, stages and step semantics as ``up --host``, with
TRAIN and CONVERT submitted as batch jobs on the login node (CONVERT after TRAIN: ``--dependency=afterok``).

A second ``up`` finds its jobs by name in the queue (or the output dir finished / the adapter converted) and
submits nothing again. Nothing is queued when no node can ever run the job (``slurm.fit``: PREFLIGHT stops).
"""

from __future__ import annotations

import dataclasses
import posixpath

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan.host_plan import ARTIFACTS, UpOptions, _volumes_stage, job_name, output_dir_of
from ktdeploy.core.plan.params import FollowJobParams, SubmitAfterParams, SubmitParams, WaitJobParams
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.plan.steps import Plan, Stage, StageName, Step, StepAction
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.sched.batch import job_dir_of


def build_slurm_plan(recipe: Recipe, state: JobState, opts: UpOptions, *, image: str, variant: str | None,
                     queued: dict[str, str], fit_detail: str) -> Plan:
    """``queued``: role (train/convert) -> the job id of this job name already in the queue."""
    name, out, job_dir = job_name(recipe), output_dir_of(recipe), job_dir_of(recipe)
    layout = JobLayout(out)
    adapter = layout.adapter_dir
    pf = opts.preflight or {}
    stages = [Stage(StageName.PREFLIGHT, "connect to the login node, read the cluster, fit the job", (
        Step("preflight.connect", f"connect to {opts.host}", satisfied=True, why=pf.get("connect", "done")),
        Step("preflight.fit", "a node can run the job (features, memory, GPUs, CPUs)", satisfied=True,
             why=fit_detail)))]
    # the output dir is ours when our job is queued: then it is neither refused nor resumed by hand
    vol_state = dataclasses.replace(state, top_level=[]) if "train" in queued else state
    stages.append(_volumes_stage(recipe, vol_state, opts))
    finished = state.finished and "train" not in queued
    sub: list[Step] = [Step("submit.stage", f"stage the job folder {job_dir}", argv=("mkdir", "-p", "--", job_dir),
                            probe=("test", "-d", job_dir))]
    if "train" in queued:
        sub.append(Step("submit.train", f"training job {name}", action=StepAction.SUBMIT, satisfied=True,
                        why=f"job {queued['train']} is in the queue",
                        params=SubmitParams(role="train", job_id=queued["train"])))
    elif finished:
        sub.append(Step("submit.train", f"training job {name}", action=StepAction.SUBMIT, satisfied=True,
                        why=f"{out} holds a finished run", params=SubmitParams(role="train")))
    else:
        sub.append(Step("submit.train_script", "upload the training job's script", action=StepAction.PUT,
                        local="rendered/slurm/train.sbatch", remote=f"{job_dir}/train.sbatch"))
        sub.append(Step("submit.train", f"sbatch the training job {name}", action=StepAction.SUBMIT,
                        argv=("sbatch", "--parsable", "--", f"{job_dir}/train.sbatch"),
                        params=SubmitParams(role="train"),
                        fix="See sbatch's message: the cluster refused the request ktdeploy checked against sinfo."))
    if "convert" in queued:
        sub.append(Step("submit.convert", f"conversion job {name}-convert", action=StepAction.SUBMIT, satisfied=True,
                        why=f"job {queued['convert']} is in the queue",
                        params=SubmitParams(role="convert", job_id=queued["convert"])))
    elif state.adapter_present:
        sub.append(Step("submit.convert", "conversion job", action=StepAction.SUBMIT, satisfied=True,
                        why="already converted", params=SubmitParams(role="convert")))
    else:
        sub.append(Step("submit.convert_script", "upload the conversion job's script", action=StepAction.PUT,
                        local="rendered/slurm/convert.sbatch", remote=f"{job_dir}/convert.sbatch"))
        sub.append(Step("submit.convert", f"sbatch the conversion job {name}-convert (after training succeeds)",
                        action=StepAction.SUBMIT, argv=("sbatch", "--parsable", "--", f"{job_dir}/convert.sbatch"),
                        params=SubmitAfterParams(role="convert", after=None if finished else "train")))
    stages.append(Stage(StageName.SUBMIT, "batch jobs on the login node", tuple(sub)))
    if opts.detach:
        stages.append(Stage(StageName.FOLLOW, "follow training", skipped="--detach: the jobs run on; `ktdeploy status` / "
                                                                 "`ktdeploy logs -f` / `ktdeploy up` follow them"))
        stages.append(Stage(StageName.CONVERT, "wait for the conversion job", skipped="--detach"))
    else:
        fs = [Step("follow.train", f"follow {layout.trainer_log} until the training job ends",
                   action=StepAction.FOLLOW_JOB, satisfied=finished,
                   why="finished" if finished else "",
                   params=FollowJobParams(role="train", log=layout.trainer_log, job_dir=job_dir,
                                          job_id=queued.get("train")))]
        for a in ARTIFACTS:
            fs.append(Step(f"follow.fetch.{a}", f"fetch {a}", action=StepAction.FETCH, remote=f"{out}/{a}",
                           local=f"artifacts/{a}", optional=True))
        stages.append(Stage(StageName.FOLLOW, "follow the training job, fetch the loss plot and summary", tuple(fs)))
        stages.append(Stage(StageName.CONVERT, "the conversion job", (
            Step("convert.wait", f"{out} -> {adapter}", action=StepAction.WAIT_JOB,
                 satisfied=state.adapter_present, why="already converted" if state.adapter_present else "",
                 params=WaitJobParams(role="convert", job_dir=job_dir, job_id=queued.get("convert"))),)))
    notes = [f"Slurm: jobs on the login node {opts.host}; the output volume must be shared by login and compute "
             "nodes (scripts, logs and the output live there)"]
    if CheckName.DOCKER_NVIDIA_RUNTIME in opts.waive or CheckName.GPU_PRESENT in opts.waive:
        notes.append("GPU checks waived (--waive): the containers start WITHOUT --gpus. Test clusters only.")
    return Plan(host=opts.host, recipe=recipe.name, job=name, image=image, variant=variant, output_dir=out,
                adapter_dir=adapter, job_dir=job_dir, stages=tuple(stages), waived=tuple(opts.waive),
                notes=tuple(notes))


def log_path(job_dir: str, role: str, job_id: str) -> str:
    return posixpath.join(job_dir, f"{role}-{job_id}.out")
