"""docker command lines for the job's containers (pure). Every host path goes through ``--mount`` with CSV
quoting, so paths with ``,``, ``:`` or spaces cannot change the mount's meaning; argv lists only."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass

from ktdeploy.core.recipe.schema import Volumes
from ktdeploy.core.served import Served

JOB_MOUNT = "/ktdeploy-job"        # where the shipped recipe lands in the container (docker cp)
CONTAINER_RECIPE = f"{JOB_MOUNT}/recipe.yaml"

# What KT needs from its container (kt-facts: NUMA binding needs SYS_NICE, pinned memory needs memlock,
# NCCL/dataloader shared memory needs the host IPC namespace). Never --privileged.
KT_RUNTIME_FLAGS = ("--ipc=host", "--cap-add", "SYS_NICE")
MEMLOCK_FLAGS = ("--ulimit", "memlock=-1:-1")


def runtime_flags(memlock: bool = True) -> list[str]:
    return [*KT_RUNTIME_FLAGS, *(MEMLOCK_FLAGS if memlock else ())]


def mount(source: str, target: str | None = None, readonly: bool = False) -> list[str]:
    fields = ["type=bind", f"source={source}", f"target={target or source}"]
    if readonly:
        fields.append("readonly")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(fields)
    return ["--mount", buf.getvalue()]


def user_flags(user: str | None) -> list[str]:
    """Run as the connecting user (uid:gid), so the output is theirs and the image's own user (uid 1000) needs no
    write access to the host's folders; a non-root uid gets a writable HOME (caches)."""
    if not user:
        return []
    flags = ["--user", user]
    if not user.startswith("0:"):
        flags += ["--env", "HOME=/tmp"]
    return flags


def gpu_flags(gpus: list[int] | None) -> list[str]:
    """``--gpus "device=2,3"`` (the inner quotes are part of the value: docker parses it as CSV)."""
    if not gpus:
        return []
    return ["--gpus", '"device=' + ",".join(str(g) for g in gpus) + '"']


def labels(job: str, run_id: str, role: str, output_dir: str) -> list[str]:
    return ["--label", f"ktdeploy.job={job}", "--label", f"ktdeploy.run={run_id}", "--label", f"ktdeploy.role={role}",
            "--label", f"ktdeploy.output={output_dir}"]


def training_flags(*, gpus: list[int] | None, memlock: bool = True, user: str | None = None) -> list[str]:
    """The flags that make a container a training container (user, GPUs, IPC/SYS_NICE/memlock): the training run,
    the tune trials and the image readiness check (``image_check``) all take them from here."""
    return [*user_flags(user), *gpu_flags(gpus), *runtime_flags(memlock)]


def _create_trainer(role: str, *, name: str, run_id: str, volumes: Volumes, output_dir: str, gpus: list[int] | None,
                    memlock: bool, user: str | None) -> list[str]:
    """`docker create` up to the image: what every container that trains (the run, the tune trials) needs."""
    return ["docker", "create", "--name", name, *labels(name, run_id, role, output_dir),
            *training_flags(gpus=gpus, memlock=memlock, user=user),
            *mount(volumes.model, readonly=True), *mount(volumes.data), *mount(volumes.output),
            "--env", f"KTDEPLOY_RUN={run_id}", "--env", "PYTHONUNBUFFERED=1"]


def waive_args(waive: Iterable[str]) -> list[str]:
    """The checks `up` waived, for the container's own doctor (`ktdeploy train|tune --waive NAME`): one gate."""
    return [a for name in waive for a in ("--waive", name)]


def create_train(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str, gpus: list[int] | None,
                 memlock: bool = True, user: str | None = None, tuned: str | None = None,
                 waive: tuple[str, ...] = ()) -> list[str]:
    return [*_create_trainer("train", name=name, run_id=run_id, volumes=volumes, output_dir=output_dir, gpus=gpus,
                             memlock=memlock, user=user),
            "--", image, "train", CONTAINER_RECIPE, *(["--tuned", tuned] if tuned else []), *waive_args(waive)]


def create_tune(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str, gpus: list[int] | None,
                workdir: str, budget_minutes: float, memlock: bool = True, user: str | None = None) -> list[str]:
    """`ktdeploy tune` in the training image, with the training container's flags, GPUs and volumes."""
    return [*_create_trainer("tune", name=name, run_id=run_id, volumes=volumes, output_dir=output_dir, gpus=gpus,
                             memlock=memlock, user=user),
            "--", image, "tune", CONTAINER_RECIPE, "--workdir", workdir, "--budget-minutes", f"{budget_minutes:g}"]


IMAGE_CHECK_SECONDS = 1200   # the check container stops itself after this, even if the controller is gone


def image_check(image: str, *, name: str, gpus: list[int] | None, memlock: bool = True, user: str | None = None,
                seconds: int = IMAGE_CHECK_SECONDS) -> list[str]:
    """``docker run --detach --rm`` of ``image`` with the training container's flags (``training_flags``), idle
    (``sleep``) so that doctor can look inside it (facts, probes, the stack probe) and then remove it. Never pulls:
    the image is checked where it already is."""
    return ["docker", "run", "--detach", "--rm", "--pull", "never", "--name", name,
            "--label", "ktdeploy.role=image-check",
            *training_flags(gpus=gpus, memlock=memlock, user=user), "--env", "PYTHONUNBUFFERED=1",
            "--entrypoint", "sleep", "--", image, str(seconds)]


JUDGE_MEMORY = "6g"   # the judge imports torch, transformers and LlamaFactory: ~1.5 GiB resident (measured)
JUDGE_SOURCE = "/opt/ktdeploy-judge"


def stack_judge(image: str, *, name: str, bootstrap: str, source: str | None = None) -> list[str]:
    """``docker run --rm -i`` of the stack judge (``core/recipe/stack_judge_payload.BOOTSTRAP``) with the image's own
    ``python3``: no network, bounded memory and processes, no capability; the rendered recipe comes on stdin.
    ``source``: a ktdeploy source folder mounted read-only and put first on PYTHONPATH (benchmarks and tests that
    judge with a working tree against an image built earlier)."""
    extra = [*mount(source, JUDGE_SOURCE, readonly=True), "--env", f"PYTHONPATH={JUDGE_SOURCE}"] if source else []
    return ["docker", "run", "--rm", "--interactive", "--pull", "never", "--name", name,
            "--label", "ktdeploy.role=stack-judge", "--network", "none", "--memory", JUDGE_MEMORY,
            "--memory-swap", JUDGE_MEMORY, "--pids-limit", "4096", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", *extra, "--entrypoint", "python3", "--", image,
            "-c", bootstrap, "-"]


def doctor_in_image(image: str, doctor_args: list[str], *, gpus: list[int] | None, memlock: bool = True,
                    recipe: tuple[str, str] | None = None) -> list[str]:
    """``docker run --rm`` of the image's own doctor (``IMAGE doctor --json …``) with the training container's
    flags (``training_flags``), for a host that has docker and the image but no ktdeploy of its own (ansible's
    preflight in image mode); ``recipe`` = (host path, container path), mounted read-only."""
    mounts = mount(recipe[0], recipe[1], readonly=True) if recipe else []
    return ["docker", "run", "--rm", "--pull", "never", "--network", "none",
            *training_flags(gpus=gpus, memlock=memlock), *mounts, "--", image, *doctor_args]


def start_attached(name: str) -> list[str]:
    """Start and wait: docker's exit code is the container's."""
    return ["docker", "start", "--attach", "--", name]


def run_convert(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str, adapter_dir: str,
                user: str | None = None) -> list[str]:
    return ["docker", "run", "--rm", "--name", name, *labels(name, run_id, "convert", output_dir), *user_flags(user),
            *mount(volumes.model, readonly=True), *mount(volumes.output),
            "--", image, "convert", output_dir, "-o", adapter_dir]


def run_merge(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str, base: str, merged_dir: str,
              user: str | None = None) -> list[str]:
    """`ktdeploy merge` in the image: the model volume read-only (links inside the base may point anywhere in it,
    nowhere else), the merged model written to the output volume."""
    return ["docker", "run", "--rm", "--name", name, *labels(name, run_id, "merge", output_dir), *user_flags(user),
            *mount(volumes.model, readonly=True), *mount(volumes.output),
            "--", image, "merge", output_dir, "--base", base, "--base-root", volumes.model, "-o", merged_dir]


@dataclass(frozen=True)
class WeightsConversion:
    """What `prepare-weights` converts: the model's experts into a new tree, in a format, with kt-kernel's pools."""

    model: str
    tree: str
    fmt: str
    pools: int
    threads: int


def run_prepare_weights(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str,
                        job: WeightsConversion, user: str | None = None) -> list[str]:
    """`ktdeploy prepare-weights` in the image: the model volume writable (the new tree is a sibling of the model
    folder), the model folder itself mounted read-only over it, so nothing in it can be written."""
    return ["docker", "run", "--rm", "--name", name, *labels(name, run_id, "weights", output_dir), *user_flags(user),
            *runtime_flags(memlock=False), *mount(volumes.model), *mount(job.model, readonly=True),
            "--", image, "prepare-weights", job.model, "--format", job.fmt, "--threadpools", str(job.pools),
            "--threads", str(job.threads), "-o", job.tree]


def create_serve(*, name: str, image: str, run_id: str, volumes: Volumes, output_dir: str, served: Served,
                 gpus: list[int] | None, memlock: bool = True, user: str | None = None,
                 env_file: str | None = None) -> list[str]:
    secret = ["--env-file", env_file] if env_file else []
    return ["docker", "create", "--name", name, *labels(name, run_id, "serve", output_dir), *user_flags(user), *secret,
            "--network", "host", "--restart", "unless-stopped", *gpu_flags(gpus), *runtime_flags(memlock),
            *mount(volumes.model, readonly=True), *mount(volumes.output, readonly=True),
            "--", image, "serve", CONTAINER_RECIPE, *served.flags]


def copy_job(job_dir: str, name: str) -> list[str]:
    return ["docker", "cp", "--", f"{job_dir}/.", f"{name}:{JOB_MOUNT}"]


def start(name: str) -> list[str]:
    return ["docker", "start", "--", name]


def remove(name: str) -> list[str]:
    return ["docker", "rm", "--force", "--", name]


def logs(name: str, *, tail: int | None = None, timestamps: bool = False, since: str | None = None) -> list[str]:
    """``docker logs`` of a container (``tail`` last lines, ``since`` a timestamp it printed)."""
    return (["docker", "logs"] + (["--timestamps"] if timestamps else []) + (["--tail", str(tail)] if tail else [])
            + (["--since", since] if since else []) + ["--", name])


def stop(name: str, seconds: int = 30) -> list[str]:
    return ["docker", "stop", "--time", str(seconds), "--", name]


def exists_probe(name: str) -> list[str]:
    return ["docker", "inspect", "--type", "container", "--format", "{{.Id}}", "--", name]


def absent_probe(name: str) -> list[str]:
    """exit 0 when no container of that name exists."""
    return ["sh", "-c", '! docker inspect --type container -- "$1" >/dev/null 2>&1', "ktdeploy-probe", name]


def started_probe(name: str) -> list[str]:
    """exit 0 once the container has been started at least once (running or exited)."""
    return ["sh", "-c", '[ -n "$(docker inspect --type container --format "{{if ne .State.StartedAt \\"0001-01-01T00:00:00Z\\"}}'
                        'started{{end}}" -- "$1" 2>/dev/null)" ]', "ktdeploy-probe", name]


def running_probe(name: str) -> list[str]:
    return ["sh", "-c", '[ "$(docker inspect --type container --format "{{.State.Running}}" -- "$1" 2>/dev/null)" = true ]',
            "ktdeploy-probe", name]


def image_probe(ref: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", "--", ref]


HEALTH_SCRIPT = ("import sys, urllib.request\n"
                 "urllib.request.urlopen('http://127.0.0.1:%s/health' % sys.argv[1], timeout=5).read()\n")


# a server bound to one address (deploy.serve.host) answers there only, not on the loopback
HEALTH_AT_SCRIPT = ("import sys, urllib.request\n"
                    "urllib.request.urlopen('http://%s:%s/health' % (sys.argv[2], sys.argv[1]), timeout=5).read()\n")
EVERY_ADDRESS = ("0.0.0.0", "::", "127.0.0.1", "localhost", "::1")


def health_probe(name: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """exit 0 once the server in the container answers GET /health (sglang's readiness endpoint), asked where it
    listens: the loopback when it listens there or on every address, else its one address (``host``)."""
    if host in EVERY_ADDRESS:
        return ["docker", "exec", name, "python3", "-c", HEALTH_SCRIPT, str(port)]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return ["docker", "exec", name, "python3", "-c", HEALTH_AT_SCRIPT, str(port), shown]
