"""How a Slurm job starts the image on its node (pure): one runtime per site's rules (docs/scaling.md).

    podman     rootless ``podman run`` straight from the batch script: conmon and the container are children of
               the batch step, in its cgroup (``--cgroups=disabled``: podman makes no cgroup of its own, so Slurm's
               cpuset, memory and device limits, its accounting and its OOM handling are the container's);
               the container's root is the user in rootless podman's user namespace, so the output belongs to the
               user; the image from a docker-archive on a shared folder (loaded once per node and user) or a
               registry.
    pyxis      ``srun --container-image=… --container-mounts=…`` (NVIDIA's SPANK plugin over enroot): the step is the
               container; the image an enroot squashfs (``ktdeploy image save --format squashfs``) or a registry
               reference (enroot's ``REGISTRY#IMAGE:TAG``).
    apptainer  ``srun apptainer exec --nv`` on a SIF (``ktdeploy image save --format sif``) or ``docker://``.
    docker     only on request: ``docker create`` talks to dockerd, whose child the container is, outside the job.

Every runtime runs the image's own agent (``IMAGE_AGENT``, the Dockerfile's ENTRYPOINT) with the same arguments as
``up --host`` does: ``train /ktdeploy-job/recipe.yaml [--resume auto] [--waive …]``. Placeholders (``CNAME``,
``DYNAMIC``, ``RESUME``) become shell expansions in ``words``; everything else is shell-quoted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.docker_argv import JOB_MOUNT
from ktdeploy.core.recipe.schema import Volumes
from ktdeploy.core.terminal_text import terminal_safe

PODMAN, PYXIS, APPTAINER, DOCKER = "podman", "pyxis", "apptainer", "docker"
RUNTIMES = (PODMAN, PYXIS, APPTAINER, DOCKER)
AUTO_ORDER = (PYXIS, APPTAINER, PODMAN)       # `auto`: the first the cluster has; docker never
# The image's entry point without tini (pyxis and apptainer run a command, not the image's ENTRYPOINT); a unit test
# holds it to the Dockerfile's ENTRYPOINT.
IMAGE_AGENT = ("/opt/venv/bin/python", "-m", "ktdeploy.cli.image_entry")

CNAME = "\0cname\0"      # placeholders in an argv, written as shell expansions (never user text)
DYNAMIC = "\0dynamic\0"
RESUME = "\0resume\0"
CPUS = "\0cpus\0"
STOP_SECONDS = 20        # the container's stop grace period inside the TERM trap; slurm.conf's KillWait must exceed it

DOCKER_WHY = ("the container is dockerd's child, not the job's: Slurm's cgroup limits (cores, memory, GPUs), "
              "sstat/sacct accounting and OOM handling miss it; a SIGKILLed job step leaves it holding the GPUs; "
              "every user must be in the docker group")


def words(argv: list[str]) -> str:
    """An argv as one shell line: placeholders as expansions, the rest quoted (a container name inside an item, a
    label or NAME:PATH, becomes "$cname" next to quoted text)."""
    out = []
    for a in argv:
        if a == DYNAMIC:
            out.append('"${dyn[@]}"')
        elif a == RESUME:
            out.append('"${resume[@]}"')
        elif CPUS in a:
            out.append(shlex.quote(a.replace(CPUS, "")) + '"${SLURM_CPUS_PER_TASK:-1}"')
        else:
            out.append('"$cname"'.join(shlex.quote(p) if p else "" for p in a.split(CNAME)))
    return " ".join(out)


@dataclass(frozen=True)
class Job:
    """What a runtime needs to start one container of the job."""

    role: str                 # train | convert
    image: str                # a registry/local reference, or the image file (image_file)
    image_file: str | None
    volumes: Volumes
    output_dir: str
    run_id: str
    agent_args: tuple[str, ...]   # after the agent: train RECIPE [--waive …] / convert OUT -o ADAPTER
    ship: str | None = None       # the folder mounted at JOB_MOUNT (the shipped recipe), read-only
    gpus: bool = True             # the job's GPUs go in (False: GPU checks waived, test clusters)
    memlock: bool = True


def mounts(job: Job) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of every bind mount, the model volume read-only (a convert job reads no data)."""
    v = job.volumes
    out = [(v.model, v.model, True)]
    if job.role == "train":
        out.append((v.data, v.data, False))
    out.append((v.output, v.output, False))
    if job.ship:
        out.append((job.ship, JOB_MOUNT, True))
    return out


# characters each runtime's mount syntax cannot carry inside a path (pyxis: SRC:DST[:FLAGS][,SRC:DST…]; apptainer's
# --bind the same; podman's --mount splits on commas)
MOUNT_SEPARATORS = {PYXIS: ",:", APPTAINER: ",:", PODMAN: ",", DOCKER: ""}


def require_mountable(runtime: str, paths: dict[str, str]) -> None:
    """RecipeError naming the key when a path holds a character the runtime's mount syntax reads as a separator."""
    bad = MOUNT_SEPARATORS[runtime]
    for key, path in paths.items():
        hit = sorted({c for c in path if c in bad})
        if hit:
            raise RecipeError(f"{terminal_safe(path)!r} holds {' and '.join(repr(c) for c in hit)}, which {runtime}'s "
                              "mount syntax reads as a separator: the container would mount something else",
                              key=key, fix=f"Use a folder whose name has no {' or '.join(repr(c) for c in hit)}, or "
                                           "another deploy.scheduler.runtime.")


def agent_command(job: Job) -> list[str]:
    return [*IMAGE_AGENT, *job.agent_args, *([RESUME] if job.role == "train" else [])]


# -- podman -----------------------------------------------------------------------------------------------------
def podman_run(job: Job) -> list[str]:
    """``podman run`` in the foreground: the batch script waits for it; conmon and the container stay in the job's
    cgroup. Host networking and IPC (no slirp4netns needed; NCCL's shared memory), SYS_NICE for kt-kernel's NUMA
    binding inside the user namespace, the job's own ulimits (a rootless container cannot raise memlock above them)."""
    flags = ["--rm", "--name", CNAME, *dk.labels(CNAME, job.run_id, job.role, job.output_dir),
             "--cgroups=disabled", "--network=host", "--ipc=host", "--cap-add", "SYS_NICE",
             "--ulimit", "host", "--security-opt", "label=disable",
             "--pull", "missing" if has_registry(job.image) else "never", DYNAMIC]
    for src, dst, ro in mounts(job):
        flags += ["--mount", f"type=bind,source={src},target={dst}" + (",readonly" if ro else "")]
    flags += ["--env", f"KTDEPLOY_RUN={job.run_id}", "--env", "PYTHONUNBUFFERED=1"]
    image = job.image
    return ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file", "run", *flags, "--", image,
            *job.agent_args, *([RESUME] if job.role == "train" else [])]


def podman_image_lines(job: Job) -> list[str]:
    """The image in the user's rootless storage on this node: loaded from the docker-archive once; without a file
    (and no registry) it must be there already."""
    lines = [f"img={shlex.quote(job.image)}"]
    if job.image_file:
        return [*lines, 'if ! podman image exists "$img"; then',
                '  printf \'ktdeploy: loading %s into podman on %s\\n\' "$img" "$(hostname)"',
                f"  podman load --quiet --input {shlex.quote(job.image_file)} >/dev/null || "
                "{ echo 'ktdeploy: podman load failed'; exit 4; }",
                "fi"]
    if has_registry(job.image):
        return []
    return [*lines, 'podman image exists "$img" || { printf \'ktdeploy: %s is not in podman\'"\'"\'s store on %s: set '
            "deploy.scheduler.image_file to `ktdeploy image save`'\"'\"'s tarball on a shared folder (loaded once per "
            'node), or deploy.registry\\n\' "$img" "$(hostname)"; exit 4; }']


# -- pyxis ------------------------------------------------------------------------------------------------------
def enroot_uri(image: str) -> str:
    """A registry reference as enroot reads it: ``registry.example.com/ktsft:amx`` -> ``registry.example.com#ktsft:amx``
    (the first component is a registry when it has a dot or a port, as docker decides)."""
    if has_registry(image):
        first, _sep, rest = image.partition("/")
        return f"{first}#{rest}"
    return image


def has_registry(image: str) -> bool:
    """Whether a reference names its registry (the first component has a dot or a port, or is localhost, as
    docker decides): a bare ``ktsft:amx`` is a local tag that only docker's own store holds."""
    first, sep, _rest = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def srun_step() -> list[str]:
    """One task on this node with every CPU of the job (srun does not inherit --cpus-per-task from sbatch since
    Slurm 22.05)."""
    return ["srun", "--ntasks=1", "--nodes=1", "--cpus-per-task=" + CPUS, "--kill-on-bad-exit=1"]


def pyxis_srun(job: Job) -> list[str]:
    image = job.image_file or enroot_uri(job.image)
    m = ",".join(f"{s}:{d}" + (":ro" if ro else "") for s, d, ro in mounts(job))
    return [*srun_step(), f"--container-image={image}", f"--container-mounts={m}", "--container-workdir=/tmp",
            "--no-container-mount-home", "--no-container-remap-root", *agent_command(job)]


# -- apptainer --------------------------------------------------------------------------------------------------
def apptainer_exec(job: Job) -> list[str]:
    image = job.image_file or f"docker://{job.image}"
    binds: list[str] = []
    for s, d, ro in mounts(job):
        binds += ["--bind", f"{s}:{d}" + (":ro" if ro else "")]
    return [*srun_step(), "apptainer", "exec", *(["--nv"] if job.gpus else []), *binds, image,
            *agent_command(job)]


# -- docker (on request) ------------------------------------------------------------------------------------------
def docker_create(job: Job) -> list[str]:
    if job.role == "train":
        create = dk.create_train(name=CNAME, image=job.image, run_id=job.run_id, volumes=job.volumes,
                                 output_dir=job.output_dir, gpus=None, memlock=job.memlock, user=None)
        return [*create[:2], DYNAMIC, *create[2:], RESUME]
    adapter = job.agent_args[-1]
    run = dk.run_convert(name=CNAME, image=job.image, run_id=job.run_id, volumes=job.volumes,
                         output_dir=job.output_dir, adapter_dir=adapter, user=None)
    return [*run[:3], DYNAMIC, *run[3:]]


def uses_srun(runtime: str) -> bool:
    return runtime in (PYXIS, APPTAINER)
