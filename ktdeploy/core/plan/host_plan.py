"""build_plan(recipe, facts, state, options) -> Plan: pure. Each stage's steps, with what is already satisfied
on the host marked, so a second ``up`` of a running or finished job changes nothing."""

from __future__ import annotations

import copy
import hashlib
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core import checkpoints as ckpt
from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.checkpoints import TRAINER_LOG
from ktdeploy.core.checks.isa import best_variant
from ktdeploy.core.checks.threads import derive_threads
from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.eval.target import controller_url, eval_data, models, served_model
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.kt_weights import manifest_name, needed_by
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.params import (
    ContainerLogParams,
    CrashParams,
    EvalParams,
    FollowParams,
    ImageCheckParams,
    RunParams,
    SecretParams,
    WaitHttpParams,
    WaitRunningParams,
)
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.plan.steps import Plan, Stage, StageName, Step, StepAction
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.schema import Deploy, Evaluation, Volumes
from ktdeploy.core.safeio import norm_path
from ktdeploy.core.served import Served

MEMLOCK_WAIVER = CheckName.DOCKER_MEMLOCK
START_FIX = ("If docker says 'error setting rlimit type 8', the daemon may not raise RLIMIT_MEMLOCK (rootless or nested "
             "docker without CAP_SYS_RESOURCE): run it with that capability, or --waive docker.memlock (test hosts). "
             "Otherwise see `docker logs` of the container.")


def container_waivers(waive: tuple[str, ...]) -> tuple[str, ...]:
    """The waivers the training container's own doctor gets: every doctor check `up` waived (docker.memlock is
    no check but how the containers start, and stays on the controller)."""
    return tuple(w for w in waive if w != MEMLOCK_WAIVER)
ARTIFACTS = ("training_loss.png", "train_results.json", "all_results.json", "trainer_state.json", TRAINER_LOG)

INSTALL_DOCKER = r"""set -e
S=; [ "$(id -u)" -eq 0 ] || S="sudo -n"
command -v apt-get >/dev/null 2>&1 || { echo "no apt-get on this host: install docker by hand" >&2; exit 3; }
$S apt-get update -qq
$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io
$S systemctl enable --now docker 2>/dev/null || $S service docker start
"""

INSTALL_NVIDIA_TOOLKIT = r"""set -e
S=; [ "$(id -u)" -eq 0 ] || S="sudo -n"
command -v apt-cache >/dev/null 2>&1 || { echo "no apt on this host: install nvidia-container-toolkit by hand" >&2; exit 3; }
cand=$(apt-cache policy nvidia-container-toolkit 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
  echo "no apt source on this host provides nvidia-container-toolkit" >&2; exit 3
fi
$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-container-toolkit
$S nvidia-ctk runtime configure --runtime=docker
$S systemctl restart docker 2>/dev/null || $S service docker restart
"""

NVIDIA_RUNTIME_PROBE = ["sh", "-c", "docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '\"nvidia\"'"]


@dataclass(frozen=True)
class UpOptions:
    host: str = "localhost"
    run_id: str = "dry-run"
    resume: str | None = None            # None | "auto" | a checkpoint path
    detach: bool = False
    waive: tuple[str, ...] = ()
    image_tar: str | None = None          # a `ktdeploy image save` tarball on the controller
    tune: bool = False                    # run `ktdeploy tune` before training and train with its choice
    tune_budget_minutes: float = 20.0
    local: bool = False                   # the host is this machine (no upload needed)
    preflight: dict[str, Any] = field(default_factory=dict)   # summary of connect/facts/doctor for the plan text


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "job"


def output_dir_of(recipe: Recipe) -> str:
    out = recipe.keys.output_dir
    if not isinstance(out, str) or not out.startswith("/"):
        raise RecipeError("train.output_dir must be an absolute host path for `ktdeploy up`", key="train.output_dir",
                          fix="Set train.output_dir under deploy.volumes.output, e.g. /srv/ktdeploy/output/my-run.")
    return norm_path(out)   # one spelling per folder: '//srv/o/./run/' is '/srv/o/run' (one container name, one lock)


def job_name(recipe: Recipe) -> str:
    """Deterministic container name: recipe name + a hash of the output dir (one job per output dir)."""
    out = output_dir_of(recipe)
    return f"ktd-{_slug(recipe.name)}-{hashlib.sha256(out.encode()).hexdigest()[:8]}"


def resolve_image(deploy: Deploy, facts: HostFacts | None) -> tuple[str, str | None, str]:
    """(image reference, variant or None, how it was chosen)."""
    img = deploy.image
    if img == V.AUTO:
        variant = best_variant(facts) if facts is not None else None
        if variant is None:
            raise UsageError("deploy.image is auto but no kt-kernel build fits this CPU (no AVX2 found)",
                             key="deploy.image", fix=f"Name an image explicitly: deploy.image: {' | '.join(V.NAMES)} | REF.")
        how = f"auto: the best kt-kernel build this CPU proves is {variant}"
    elif V.known(img):
        variant = V.canonical(img)
        how = "named in the recipe" + (f" (old name {img!r})" if img != variant else "")
    else:
        return img, None, "full image reference from the recipe"
    ref = f"{deploy.image_repo}:{variant}"
    if deploy.registry:
        ref = f"{deploy.registry.rstrip('/')}/{ref}"
    return ref, variant, how


def shipped_recipe(recipe: Recipe, resume_from: str | None) -> dict[str, Any]:
    """The recipe the container runs: GPUs renumbered as the container sees them (--gpus device=... makes the
    chosen GPUs 0..n-1 inside) and the checkpoint to resume from."""
    assert recipe.deploy is not None   # up's recipes have a deploy section (load_up_recipe)
    doc = copy.deepcopy(recipe.to_document())
    d = doc.setdefault("deploy", {})
    d["gpus"] = list(range(len(recipe.deploy.gpus)))
    if resume_from:
        doc.setdefault("train", {})["resume_from_checkpoint"] = resume_from
    return doc


def _world_size(recipe: Recipe) -> int:
    try:
        return int(recipe.accelerate.get("num_processes") or 1)
    except (TypeError, ValueError):
        return 1


def _resume_target(recipe: Recipe, state: JobState, resume: str | None, out: str) -> tuple[str | None, list[Step], list[str]]:
    """(checkpoint to resume from, steps (moving partial checkpoints aside / failing), notes)."""
    notes: list[str] = []
    steps: list[Step] = []
    cps = state.checkpoints
    partial = [c for c in cps if not c.complete]
    if resume is None:
        return None, steps, notes
    ws = _world_size(recipe)
    if resume == "auto":
        choice = ckpt.choose_resume(state.listing, "auto", ws)
    else:
        name = posixpath.basename(posixpath.normpath(resume))
        if posixpath.isabs(resume) and posixpath.dirname(posixpath.normpath(resume)) != out:
            steps.append(Step("train.resume", f"resume from {resume}", action=StepAction.FAIL,
                              why=f"{resume} is not a checkpoint of {out}",
                              fix=f"Name a checkpoint-N folder inside {out}, or use --resume auto."))
            return None, steps, notes
        choice = ckpt.choose_resume(state.listing, name, ws)
        chosen = choice.checkpoint
        if choice.problem in ("missing", "incomplete"):
            steps.append(Step("train.resume", f"resume from {resume}", action=StepAction.FAIL,
                              why=(f"{name} is incomplete (missing {', '.join(chosen.missing)})" if chosen
                                   else f"{name} does not exist in {out}"),
                              fix="Use --resume auto to take the newest complete checkpoint."))
            return None, steps, notes
    chosen = choice.checkpoint
    for c in partial:
        if chosen is None or c.step > chosen.step:
            notes.append(f"--resume: {c.name} is incomplete (missing {', '.join(c.missing)}); never resumed from")
    if chosen is None:
        notes.append(f"--resume {resume}: no complete checkpoint in {out}: training starts fresh, from step 0")
    else:
        if choice.problem == "world_size":
            steps.append(Step("train.resume", f"resume from {chosen.name}", action=StepAction.FAIL,
                              why=f"{chosen.name} was saved by {chosen.world_size} processes; the recipe runs {ws} "
                                  "(resume needs the same world size, cookbook §2.6)",
                              fix=f"Set accelerate.num_processes: {chosen.world_size} and {chosen.world_size} GPUs in "
                                  "deploy.gpus, or start a new output_dir."))
            return None, steps, notes
    # LlamaFactory (and HF's get_last_checkpoint) would pick a newer, incomplete checkpoint folder by name;
    # move those aside (renamed, never deleted) so only the chosen one can be loaded.
    for c in partial:
        if chosen is None or c.step > chosen.step:
            src, dst = f"{out}/{c.name}", f"{out}/incomplete-{c.name}"
            steps.append(Step(f"train.set_aside.{c.name}", f"rename the incomplete {c.name} to incomplete-{c.name}",
                              argv=("mv", "-n", "--", src, dst), probe=("sh", "-c", '[ ! -e "$1" ]', "ktdeploy-probe", src),
                              why="an incomplete checkpoint must not be resumed from"))
    return (f"{out}/{chosen.name}" if chosen else None), steps, notes


def _preflight_stage(opts: UpOptions) -> Stage:
    """PREFLIGHT: done by the executor before planning (connect, facts, doctor); recorded here."""
    pf = opts.preflight or {}
    return Stage(StageName.PREFLIGHT, "connect, gather facts, doctor", (
        Step("preflight.connect", f"connect to {opts.host}", action=StepAction.RUN, satisfied=True,
             why=pf.get("connect", "done before planning")),
        Step("preflight.doctor", "gather host facts and run doctor", action=StepAction.RUN, satisfied=True,
             why=pf.get("doctor", "done before planning")),
    ))


def _runtime_stage(facts: HostFacts, nvidia_waived: bool) -> Stage:
    """RUNTIME: docker and the NVIDIA container runtime (installed when missing)."""
    rt: list[Step] = []
    d = facts.docker
    if not d.present:
        rt.append(Step("runtime.docker", "install docker (docker.io from the host's apt sources)",
                       argv=("sh", "-c", INSTALL_DOCKER), probe=("docker", "info"), timeout=900,
                       why="docker is not installed",
                       fix="Install docker by hand (https://docs.docker.com/engine/install/) and re-run."))
    elif not d.reachable:
        rt.append(Step("runtime.docker", "reach the docker daemon", action=StepAction.FAIL, probe=("docker", "info"),
                       why=f"the docker daemon does not answer: {d.error}",
                       fix="Start docker (sudo systemctl start docker) and add the SSH user to the docker group."))
    else:
        rt.append(Step("runtime.docker", "docker engine", satisfied=True, probe=("docker", "info"),
                       why=f"docker {d.server_version} present"))
    if nvidia_waived:
        rt.append(Step("runtime.nvidia", "nvidia container runtime", satisfied=True, why="waived (--waive)"))
    elif d.present and d.nvidia_runtime:
        rt.append(Step("runtime.nvidia", "nvidia container runtime", satisfied=True, probe=tuple(NVIDIA_RUNTIME_PROBE),
                       why=f"runtimes: {', '.join(d.runtimes)}"))
    else:
        rt.append(Step("runtime.nvidia", "install nvidia-container-toolkit and register the nvidia runtime "
                                         "(restarts the docker daemon)",
                       argv=("sh", "-c", INSTALL_NVIDIA_TOOLKIT), probe=tuple(NVIDIA_RUNTIME_PROBE), timeout=900,
                       why="docker has no nvidia runtime: containers would start with no GPU",
                       fix="Add NVIDIA's apt repository to the host (https://docs.nvidia.com/datacenter/cloud-native/"
                           "container-toolkit/latest/install-guide.html), or install nvidia-container-toolkit and run "
                           "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`; "
                           "then re-run ktdeploy up."))
    return Stage(StageName.RUNTIME, "container runtime", tuple(rt))


def _volumes_stage(recipe: Recipe, state: JobState, opts: UpOptions) -> Stage:
    """VOLUMES: model (read-only) and data exist, the output volume is made; an output dir that is not ours and
    not empty stops `up` unless --resume."""
    assert recipe.deploy is not None   # up's recipes have a deploy section (load_up_recipe)
    vol = recipe.deploy.volumes
    out = output_dir_of(recipe)
    vs: list[Step] = [
        Step("volumes.model", f"model dir {vol.model} exists (mounted read-only)", action=StepAction.FAIL,
             probe=("test", "-d", vol.model), why=f"deploy.volumes.model {vol.model} does not exist on the host",
             fix=f"Copy the model to {vol.model} on the host, or fix deploy.volumes.model."),
        Step("volumes.data", f"data dir {vol.data} exists", action=StepAction.FAIL, probe=("test", "-d", vol.data),
             why=f"deploy.volumes.data {vol.data} does not exist on the host",
             fix=f"Copy the dataset to {vol.data} on the host, or fix deploy.volumes.data."),
        Step("volumes.output", f"output volume {vol.output}", argv=("mkdir", "-p", "--", vol.output),
             probe=("test", "-d", vol.output)),
    ]
    ours = state.container is not None
    if not ours and state.output_exists and state.top_level and not opts.resume:
        if state.finished:
            why = f"{out} already holds a finished training run"
            fix = "Choose a new train.output_dir, or pass --resume auto to go on from it (convert, serve)."
        elif state.checkpoints:
            why = f"{out} holds checkpoints of an earlier run ({', '.join(c2.name for c2 in state.checkpoints[-3:])})"
            fix = "Pass --resume auto to continue it, or choose a new train.output_dir."
        else:
            why = f"{out} exists and is not empty ({', '.join(state.top_level[:5])})"
            fix = "Choose a new train.output_dir (ktdeploy never overwrites an output dir)."
        vs.append(Step("volumes.output_dir", f"output dir {out} is free", action=StepAction.FAIL, why=why, fix=fix))
    return Stage(StageName.VOLUMES, "model (read-only), data, output", tuple(vs))


@dataclass(frozen=True)
class _Job:
    """What every stage of one plan shares, derived once from (recipe, facts, state, opts)."""

    recipe: Recipe
    deploy: Deploy
    state: JobState
    opts: UpOptions
    out: str                 # train.output_dir on the host
    name: str                # the training container
    full: bool               # a full fine-tune (served as weights, not an adapter)
    adapter: str             # what sglang-kt serves: the sibling <output_dir>-sglang
    merged: str | None       # deploy.serve.merge: the merged model <output_dir>-merged, served instead
    model_bytes: int | None  # du of the base model on the host (sizes the merge's timeout)
    job_dir: str
    image: str
    variant: str | None
    image_how: str
    gpus: list[int] | None   # None: GPU checks waived, containers start without --gpus
    memlock: bool

    @property
    def vol(self) -> Volumes:
        return self.deploy.volumes

    @property
    def serve_name(self) -> str:
        return f"{self.name}-serve"

    @property
    def user(self) -> str | None:
        return self.state.user or None


def _served(j: _Job) -> Served:
    """The merged model when the recipe merges, else a full fine-tune's model, else the converted adapter."""
    if j.merged:
        return Served("merged", j.merged)
    return Served("weights", j.adapter) if j.full else Served("adapter", j.adapter)


def _job(recipe: Recipe, facts: HostFacts, state: JobState, opts: UpOptions) -> _Job:
    deploy = recipe.require_deploy()
    out = output_dir_of(recipe)
    # What sglang-kt serves goes to the sibling <output_dir>-sglang (the rule `ktdeploy convert` enforces, one
    # function): a LoRA run's adapter, or a full fine-tune's model (HF weights + kt-kernel's KT Full experts
    # regrouped per expert), served with --weights.
    layout = JobLayout(out)
    adapter = layout.adapter_dir
    vol_out = posixpath.normpath(deploy.volumes.output)
    if not adapter.startswith(vol_out.rstrip("/") + "/"):
        raise RecipeError(f"the adapter directory {adapter} (sibling of train.output_dir) lies outside "
                          f"deploy.volumes.output {vol_out}", key="train.output_dir",
                          fix=f"Put train.output_dir in a folder below {vol_out}, e.g. {vol_out}/my-run.")
    merged = layout.merged_dir if deploy.serve.merge and not recipe.keys.is_full else None
    if deploy.serve.merge:
        base = recipe.keys.model_name_or_path
        vol_model = posixpath.normpath(deploy.volumes.model)
        if not isinstance(base, str) or not (posixpath.normpath(base) + "/").startswith(vol_model.rstrip("/") + "/"):
            raise RecipeError(f"deploy.serve.merge merges into train.model_name_or_path {base!r}, which lies outside "
                              f"deploy.volumes.model {vol_model} (the merge container sees that volume only)",
                              key="deploy.serve.merge", fix=f"Put the base model below {vol_model}, or serve the adapter "
                                                            "(deploy.serve.merge: false).")
    name = job_name(recipe)
    home = state.home.rstrip("/") or "/tmp"
    image, variant, image_how = resolve_image(deploy, facts)
    gpu_waived = CheckName.DOCKER_NVIDIA_RUNTIME in opts.waive or CheckName.GPU_PRESENT in opts.waive
    return _Job(recipe=recipe, deploy=deploy, state=state, opts=opts, out=out, name=name,
                full=recipe.keys.is_full, adapter=adapter, merged=merged,
                model_bytes=_model_bytes(facts, recipe), job_dir=f"{home}/.cache/ktdeploy/jobs/{name}",
                image=image, variant=variant, image_how=image_how, gpus=None if gpu_waived else list(deploy.gpus),
                memlock=MEMLOCK_WAIVER not in opts.waive)


def _model_bytes(facts: HostFacts | None, recipe: Recipe) -> int | None:
    model = recipe.keys.model_name_or_path
    pf = facts.path(model) if facts is not None and isinstance(model, str) else None
    return pf.used_bytes if pf is not None else None


MERGE_MIN_TIMEOUT_S = 3600
MERGE_BYTES_PER_S = 50e6        # 10x below the merge's measured rate (bench/results/merge): a slow disk still fits
MERGE_UNKNOWN_TIMEOUT_S = 48 * 3600
# a 1T model's experts stream layer by layer through kt-kernel's quantizer: hours; the step resumes when cut
WEIGHTS_TIMEOUT_S = 48 * 3600


def merge_timeout(model_bytes: int | None) -> float:
    """How long CONVERT waits for `ktdeploy merge`: the base's size at 50 MB/s (at least an hour), 48 h when the
    size is unknown. A merge stopped by it resumes where it was at the next `up`."""
    if not model_bytes:
        return MERGE_UNKNOWN_TIMEOUT_S
    return max(MERGE_MIN_TIMEOUT_S, model_bytes / MERGE_BYTES_PER_S)


def build_plan(recipe: Recipe, facts: HostFacts, state: JobState, opts: UpOptions) -> Plan:
    """The whole plan: one function per stage, each a pure function of the shared job values."""
    j = _job(recipe, facts, state, opts)
    notes: list[str] = []
    if not j.memlock:
        notes.append("docker.memlock waived: containers start without --ulimit memlock=-1 (pinned memory limited).")
    if j.gpus is None:
        notes.append("GPU checks waived (--waive): the containers start WITHOUT --gpus. Test hosts only.")
    # in stage order, so the first refusal a host or recipe earns is the one reported
    stages = [_preflight_stage(opts), _runtime_stage(facts, CheckName.DOCKER_NVIDIA_RUNTIME in opts.waive), _image_stage(j),
              _volumes_stage(recipe, state, opts)]
    train, resume_from, resume_notes, skip_training = _train_stage(j)
    notes.extend(resume_notes)
    serve, serve_note = _serve_stage(j)
    if serve_note:
        notes.append(serve_note)
    weights = _weights_stage(j, facts)
    stages += [*([weights] if weights is not None else []), train, _follow_stage(j, skip_training), _convert_stage(j),
               serve]
    if j.deploy.eval is not None:   # a recipe without deploy.eval plans as before: no EVAL stage at all
        stages.append(_eval_stage(j, j.deploy.eval))
    return Plan(host=opts.host, recipe=recipe.name, job=j.name, image=j.image, variant=j.variant, output_dir=j.out,
                adapter_dir=j.adapter, job_dir=j.job_dir, stages=tuple(stages), resume_from=resume_from,
                waived=tuple(opts.waive), notes=tuple(notes))


def _weights_stage(j: _Job, facts: HostFacts) -> Stage | None:
    """WEIGHTS, for an INT8/AMXINT4 recipe whose persistent kt_weight_path is not there yet: `ktdeploy
    prepare-weights` in the image (kt-kernel's own quantizer) converts the model's experts into it. Present and
    already converted: satisfied (prepare-weights would only re-verify it). An ephemeral run stages its /dev/shm tree
    inside the training container; BF16 and FP8 read the model itself: no stage."""
    need = needed_by(j.recipe.weight_setup(), j.recipe.keys.kt_config, j.recipe.keys.model_name_or_path,
                     j.recipe.keys.kt_weight_path)
    if need is None or need.output is None:
        return None
    out, model = posixpath.normpath(need.output), posixpath.normpath(need.model)
    manifest = f"{out}/{manifest_name(need.format)}"
    threads = derive_threads(facts, j.deploy.reserve_cores)[0]
    return Stage(StageName.WEIGHTS, f"{need.format.upper()} experts of {model} in {out}", (
        Step("weights.prepare", f"convert the routed experts of {model} -> {out} (prepare-weights {need.format}, "
                                f"{need.pools} thread pool(s))",
             argv=tuple(dk.run_prepare_weights(name=f"{j.name}-weights", image=j.image, run_id=j.opts.run_id,
                                               volumes=j.vol, output_dir=j.out, user=j.user,
                                               job=dk.WeightsConversion(model, out, need.format, need.pools,
                                                                        threads))),
             probe=("test", "-f", manifest), timeout=WEIGHTS_TIMEOUT_S,
             why="runs only while kt_weight_path has no manifest (doctor: weights.missing)",
             fix="See the error above: prepare-weights names the refused input; a stopped conversion resumes at the "
                 "next `ktdeploy up` (its finished layers are kept)."),))


def _image_stage(j: _Job) -> Stage:
    """Get the image onto the host: present, pulled from deploy.registry, or loaded from --image-tar."""
    image, opts = j.image, j.opts
    im: list[Step] = []
    probe = tuple(dk.image_probe(image))
    if j.state.image_id:
        im.append(Step("image.present", f"image {image}", probe=probe, satisfied=True,
                       why=f"present on the host ({j.state.image_id[:19]}); {j.image_how}"))
    elif j.deploy.registry and j.variant is not None:
        im.append(Step("image.pull", f"pull {image}", argv=("docker", "pull", "--", image), probe=probe, timeout=3600,
                       why=j.image_how,
                       fix=f"Check that {j.deploy.registry} is reachable from the host and holds {image}."))
    elif opts.image_tar:
        tar = opts.image_tar
        if opts.local:
            im.append(Step("image.load", f"docker load {tar}", argv=("docker", "load", "--input", tar), probe=probe,
                           timeout=3600, why=j.image_how))
        else:
            remote_tar = f"{j.job_dir}/image.tar"
            im.append(Step("image.ship", f"upload {tar} to the host", action=StepAction.PUT, local=tar,
                           remote=remote_tar, probe=probe, timeout=3600, why=j.image_how))
            im.append(Step("image.load", f"docker load {remote_tar}", argv=("docker", "load", "--input", remote_tar),
                           probe=probe, timeout=3600))
            im.append(Step("image.cleanup", "remove the uploaded tarball", argv=("rm", "-f", "--", remote_tar)))
        im.append(Step("image.verify", f"{image} is present after loading", action=StepAction.FAIL, probe=probe,
                       why=f"the tarball did not hold {image}",
                       fix=f"Make the tarball with `ktdeploy image save` including {image}."))
    if j.state.image_id or (j.deploy.registry and j.variant is not None) or opts.image_tar:
        im.append(_image_check_step(j))
    else:
        im.append(Step("image.present", f"image {image}", action=StepAction.FAIL,
                       why=f"{image} is not on the host and there is no way to get it there ({j.image_how})",
                       fix=f"Build it on the host (`ktdeploy image build` there, or here and `ktdeploy image save` "
                           f"it), pass --image-tar FILE made by `ktdeploy image save`, or set deploy.registry to a "
                           f"registry the host can pull {image} from."))
    return Stage(StageName.IMAGE, f"image {image}", tuple(im))


def _image_check_step(j: _Job) -> Step:
    """doctor in the image on the host, started with the training container's flags (the same GPUs, user, memlock):
    the layer checks, Python.h, torch, CUDA, one Triton kernel. Its failures (less --waive) stop `up` (exit 1)."""
    name = f"{j.name}-imgcheck"
    params = ImageCheckParams(image=j.image, name=name, gpus=tuple(j.gpus or ()), memlock=j.memlock, user=j.user)
    c = j.state.container
    # a training container that runs (or ran to the end) on this host: the image has shown it works here, and a
    # second container on its GPUs would disturb it
    ran = c is not None and (c.running or c.succeeded)
    return Step("image.check", f"{j.image} ready in a training container", action=StepAction.IMAGE_CHECK,
                argv=tuple(dk.image_check(j.image, name=name, gpus=j.gpus, memlock=j.memlock, user=j.user)),
                satisfied=ran,
                why=f"the training container {c.describe()}" if ran and c is not None else
                    "doctor inside the image with the training flags: AMX/ISA, shm, memlock, GPUs, driver, Python.h, "
                    "torch, CUDA, one Triton kernel", timeout=600, params=params,
                fix="Fix the image (`ktdeploy image build`) or the host, or --waive the check by name.")


def _train_stage(j: _Job) -> tuple[Stage, str | None, list[str], bool]:
    """The training container, by what the host already has. Returns (stage, resume_from, notes, skip_training):
    skip_training when the output dir holds a finished run and there is nothing to resume."""
    c, opts, name = j.state.container, j.opts, j.name
    tr: list[Step] = []
    if c is not None and c.running:
        tr.append(Step("train.start", f"training container {name}", satisfied=True, probe=tuple(dk.exists_probe(name)),
                       why=f"already {c.describe()}"))
    elif c is not None and c.succeeded:
        tr.append(Step("train.start", f"training container {name}", satisfied=True, why="finished (exit code 0)"))
    elif c is not None and c.status != "created" and not opts.resume:
        tr.append(Step("train.crashed", f"training container {name}", action=StepAction.FAIL, params=CrashParams(),
                       why=f"the training container {name} stopped: {c.describe()}",
                       fix="Resume from the newest complete checkpoint: ktdeploy up --resume auto (same host and "
                           "recipe), after fixing the cause shown above."))
    elif c is None and j.state.finished and opts.resume:
        tr.append(Step("train.start", "training", satisfied=True, why=f"{j.out} holds a finished run; nothing to resume"))
        return Stage(StageName.TRAIN, "training container", tuple(tr)), None, [], True
    else:
        resume_from, resume_steps, resume_notes = _resume_target(j.recipe, j.state, opts.resume, j.out)
        if c is not None:
            tr.append(Step("train.save_logs", "keep the old container's log", action=StepAction.FETCH, remote=name,
                           local="artifacts/previous-container.log", params=ContainerLogParams(), optional=True))
            tr.append(Step("train.remove_old", f"remove the stopped container {name} ({c.describe()})",
                           argv=tuple(dk.remove(name))))
        tr.extend(resume_steps)
        tr.append(Step("train.stage", f"stage the job folder {j.job_dir}", argv=("mkdir", "-p", "--", j.job_dir)))
        tr.append(Step("train.ship", "upload the recipe the container runs", action=StepAction.PUT,
                       local="rendered/ship/recipe.yaml", remote=f"{j.job_dir}/recipe.yaml"))
        tuned = None
        if opts.tune:
            tune_steps, tuned = _tune_steps(j)
            tr.extend(tune_steps)
        tr.append(Step("train.create", f"create the training container {name}",
                       argv=tuple(dk.create_train(name=name, image=j.image, run_id=opts.run_id, volumes=j.vol,
                                                  output_dir=j.out, gpus=j.gpus, memlock=j.memlock, user=j.user,
                                                  tuned=tuned, waive=container_waivers(opts.waive))),
                       probe=tuple(dk.exists_probe(name)),
                       why=(f"resume from {resume_from}" if resume_from else "fresh start")))
        tr.append(Step("train.copy", "copy the job folder into the container", argv=tuple(dk.copy_job(j.job_dir, name)),
                       probe=tuple(dk.started_probe(name))))
        tr.append(Step("train.start", f"start {name} (detached)", argv=tuple(dk.start(name)),
                       probe=tuple(dk.started_probe(name)), fix=START_FIX))
        return Stage(StageName.TRAIN, "training container", tuple(tr)), resume_from, resume_notes, False
    return Stage(StageName.TRAIN, "training container", tuple(tr)), None, [], False


def _tune_steps(j: _Job) -> tuple[list[Step], str]:
    """`ktdeploy tune` in its own container before training; returns the steps and the tune record's host path.
    Trials write beside the output dir on the output volume; a tune.json already there (a second up) is reused,
    so the probe skips the trials."""
    opts = j.opts
    workdir = posixpath.join(j.vol.output, ".ktdeploy-tune", j.name)
    tuned = posixpath.join(workdir, "tune.json")
    tn = f"{j.name}-tune"
    probe = ("test", "-s", tuned)
    return [
        # nothing to remove when the record exists (the trials are skipped) or no such container is left
        Step("tune.remove_old", f"remove a leftover {tn}", argv=tuple(dk.remove(tn)),
             probe=("sh", "-c", 'test -s "$1" || ! docker inspect --type container -- "$2" >/dev/null 2>&1',
                    "ktdeploy-probe", tuned, tn)),
        Step("tune.create", f"create the tuning container {tn}",
             argv=tuple(dk.create_tune(name=tn, image=j.image, run_id=opts.run_id, volumes=j.vol, output_dir=j.out,
                                       gpus=j.gpus, workdir=workdir, budget_minutes=opts.tune_budget_minutes,
                                       memlock=j.memlock, user=j.user)), probe=probe),
        Step("tune.copy", "copy the job folder into the tuning container", argv=tuple(dk.copy_job(j.job_dir, tn)),
             probe=probe),
        Step("tune.run", f"measure CPU-expert settings (budget {opts.tune_budget_minutes:g} min)",
             argv=tuple(dk.start_attached(tn)), probe=probe, timeout=opts.tune_budget_minutes * 60 + 900,
             fix=f"See the trial logs in {workdir} on the host; run without --tune to train with the "
                 "recipe's (or derived) settings."),
        Step("tune.cleanup", f"remove {tn}", argv=tuple(dk.remove(tn)), probe=tuple(dk.absent_probe(tn))),
        Step("tune.fetch", "fetch the tune record", action=StepAction.FETCH, remote=tuned, local="artifacts/tune.json"),
    ], tuned


def _follow_stage(j: _Job, skip_training: bool) -> Stage:
    if j.opts.detach:
        return Stage(StageName.FOLLOW, "follow training", skipped="--detach: training runs on; follow later with "
                                                          "`ktdeploy status`, `ktdeploy logs -f` or `ktdeploy up`")
    fs = [Step("follow.train", f"follow {JobLayout(j.out).trainer_log} until {j.name} exits", action=StepAction.FOLLOW,
               params=FollowParams(container=j.name, log=JobLayout(j.out).trainer_log), satisfied=skip_training)]
    for a in ARTIFACTS:
        fs.append(Step(f"follow.fetch.{a}", f"fetch {a}", action=StepAction.FETCH, remote=f"{j.out}/{a}",
                       local=f"artifacts/{a}", optional=True))
    return Stage(StageName.FOLLOW, "follow training, fetch the loss plot and summary", tuple(fs))


def _convert_stage(j: _Job) -> Stage:
    if j.opts.detach:
        return Stage(StageName.CONVERT, "convert the adapter", skipped="--detach")
    present = j.state.adapter_present
    steps = [
        Step("convert.adapter", f"convert {j.out} -> {j.adapter}",
             argv=tuple(dk.run_convert(name=f"{j.name}-convert", image=j.image, run_id=j.opts.run_id, volumes=j.vol,
                                       output_dir=j.out, adapter_dir=j.adapter, user=j.user)),
             probe=("test", "-f", f"{j.adapter}/ktdeploy_convert.json"), satisfied=present,
             timeout=3600, why="already converted" if present else ""),
    ]
    if j.merged is not None:
        base = posixpath.normpath(str(j.recipe.keys.model_name_or_path))
        steps.append(Step(
            "convert.merge", f"merge {j.out} into {base} -> {j.merged}",
            argv=tuple(dk.run_merge(name=f"{j.name}-merge", image=j.image, run_id=j.opts.run_id, volumes=j.vol,
                                    output_dir=j.out, base=base, merged_dir=j.merged, user=j.user)),
            probe=("test", "-f", f"{j.merged}/ktdeploy_merge.json"), timeout=merge_timeout(j.model_bytes),
            why="deploy.serve.merge: the LoRA folded into the base weights (resumes where a stopped merge was)",
            fix="See the error above (the merge checks the adapter against the base before writing); a merge stopped "
                "by its timeout resumes at the next `ktdeploy up`."))
    title = ("regroup the full fine-tune's KT experts into a servable model" if j.full
             else "convert the adapter for sglang-kt" + (" and merge it into the base" if j.merged else ""))
    return Stage(StageName.CONVERT, title, tuple(steps))


def _serve_stage(j: _Job) -> tuple[Stage, str | None]:
    """The serving container and its readiness; returns the stage and the endpoint note."""
    deploy, serve_name, job_dir = j.deploy, j.serve_name, j.job_dir
    if j.opts.detach:
        return Stage(StageName.SERVE, "serve", skipped="--detach"), None
    if not deploy.serve.enabled:
        return Stage(StageName.SERVE, "serve", skipped="deploy.serve.enabled is false"), None
    s = j.state.serve
    sv: list[Step] = []
    if s is not None and s.running:
        sv.append(Step("serve.start", f"serving container {serve_name}", satisfied=True,
                       probe=tuple(dk.running_probe(serve_name)), why=f"already {s.describe()}"))
    else:
        if s is not None:
            sv.append(Step("serve.remove_old", f"remove the stopped {serve_name} ({s.describe()})",
                           argv=tuple(dk.remove(serve_name))))
        sv.append(Step("serve.stage", f"stage the job folder {job_dir}", argv=("mkdir", "-p", "--", job_dir)))
        sv.append(Step("serve.ship", "upload the recipe", action=StepAction.PUT, local="rendered/ship/recipe.yaml",
                       remote=f"{job_dir}/recipe.yaml"))
        env_file = None
        if deploy.serve.api_key_env:
            # The key goes from the controller's environment into a 0600 file on the host, is read once by
            # `docker create --env-file`, then removed; it never enters an argv, the plan or the run record.
            env_file = f"{job_dir}/serve.env"
            sv.append(Step("serve.key", f"upload the API key from ${deploy.serve.api_key_env} (mode 0600)",
                           action=StepAction.PUT_SECRET, remote=env_file,
                           params=SecretParams(env=deploy.serve.api_key_env)))
        sv.append(Step("serve.create", f"create the serving container {serve_name}",
                       argv=tuple(dk.create_serve(name=serve_name, image=j.image, run_id=j.opts.run_id, volumes=j.vol,
                                                  output_dir=j.out, served=_served(j), gpus=j.gpus,
                                                  memlock=j.memlock, user=j.user, env_file=env_file)),
                       probe=tuple(dk.exists_probe(serve_name)),
                       # a failed create must not leave the key behind: serve.unstage_key never runs then
                       params=RunParams(cleanup=("rm", "-f", "--", env_file)) if env_file else None))
        if env_file:
            sv.append(Step("serve.unstage_key", "remove the uploaded API key file", argv=("rm", "-f", "--", env_file)))
        sv.append(Step("serve.copy", "copy the job folder into the container",
                       argv=tuple(dk.copy_job(job_dir, serve_name)), probe=tuple(dk.started_probe(serve_name))))
        sv.append(Step("serve.start", f"start {serve_name}", argv=tuple(dk.start(serve_name)),
                       probe=tuple(dk.running_probe(serve_name)), fix=START_FIX))
        sv.append(Step("serve.running", f"{serve_name} keeps running", action=StepAction.WAIT_RUNNING,
                       params=WaitRunningParams(container=serve_name, seconds=5)))
        sv.append(Step("serve.ready", f"{serve_name} answers /health on port {deploy.serve.port}",
                       action=StepAction.WAIT_HTTP, argv=tuple(dk.health_probe(serve_name, deploy.serve.port,
                                                                               deploy.serve.host)),
                       timeout=float(deploy.serve.ready_timeout_s), params=WaitHttpParams(container=serve_name),
                       fix="See `ktdeploy logs` for the server's output; a large model can need a longer "
                           "deploy.serve.ready_timeout_s."))
    url = f"http://{deploy.serve.host}:{deploy.serve.port}/v1"
    served = served_model(j.recipe)
    note = (f"serving endpoint: {url} (model={served})" if j.full or j.merged else
            f"serving endpoint: {url} (model={served}:{deploy.serve.lora_name})")
    what = "trained weights" if j.full else "merged model (BF16, no LoRA)" if j.merged else "adapter"
    return Stage(StageName.SERVE, f"serve the {what} with sglang-kt on {deploy.serve.host}:{deploy.serve.port}", tuple(sv)), note


def _eval_stage(j: _Job, e: Evaluation) -> Stage:
    """EVAL (deploy.eval): the served model (and the base) scored on the held-out prompts, from this machine through
    the server's OpenAI-compatible API (controller/eval_stage.py)."""
    if j.opts.detach or not j.deploy.serve.enabled:
        return Stage(StageName.EVAL, "evaluate the served model",
                     skipped="--detach" if j.opts.detach else "deploy.serve.enabled is false")
    data, m = eval_data(j.recipe), models(j.recipe)
    target = parse_host(j.opts.host)
    url, why = controller_url(j.recipe, local=j.opts.local or target.is_local, host_address=target.address)
    params = EvalParams(data_dir=data.data_dir, datasets=data.datasets, source=data.source, url=url, tuned=m.tuned,
                        base=m.base if e.compare_base else None, base_why=m.base_why if e.compare_base else
                        "deploy.eval.compare_base is false", unreachable=why)
    return Stage(StageName.EVAL, f"score {m.tuned} on {data.source} ({', '.join(data.datasets)})", (
        Step("eval.run", f"ask and score up to {e.max_samples} sample(s)" + (" against the base too" if params.base else ""),
             action=StepAction.EVAL, params=params),))
