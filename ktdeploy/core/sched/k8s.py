"""Kubernetes manifests of a recipe (pure, static: no cluster is contacted or claimed).

    ConfigMap   the recipe the container runs (GPUs renumbered, the server listening on the pod's address)
    Job         training: the image (from a registry: a bare local tag is refused) runs the supervising shell
                (supervise.py, the Slurm batch script's) around the image's `train`, resuming with `--resume auto`
                when the output holds a checkpoint; a pod deleted for preemption, eviction or a drain gets SIGTERM,
                whose trap asks the trainer to save at its next step (terminationGracePeriodSeconds: the step and
                save time, signal_time.py); a bounded backoffLimit and a podFailurePolicy (disruptions do not count,
                a refused recipe or a CPU that fails the proof ends the Job); an init container runs doctor's proof
                that the node executes the image's CPU build (an AMX tile multiply for amx) before any weight loads;
                node selection on Node Feature Discovery's CPU labels and its SMT label, CPU requests in physical
                cores (2 per core where the nodes count SMT threads: deploy.scheduler.cpus_are_threads), memory
                (planner upper edge) and GPUs as requests = limits, SYS_NICE, /dev/shm sized from the planner
                (ephemeral INT8 staging included), the model (read-only), data and output volumes
    Deployment  serving: the image's `serve` on the converted adapter, the same node selection and volumes
    Service     the server's port (ClusterIP)

Volumes are PersistentVolumeClaims named ``<job>-model``, ``-data``, ``-output``, mounted at the recipe's paths.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from ktdeploy.core.checks.resources import MIN_SHM
from ktdeploy.core.errors import RecipeError
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan.docker_argv import CONTAINER_RECIPE, JOB_MOUNT
from ktdeploy.core.plan.host_plan import job_name, output_dir_of, shipped_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.sched.features import variant_flags
from ktdeploy.core.sched.request import JobRequest
from ktdeploy.core.sched.runtimes import IMAGE_AGENT, has_registry
from ktdeploy.core.sched.signal_time import signal_plan
from ktdeploy.core.sched.supervise import SUPERVISED_ENV, Supervision, epilogue, prologue, wait_lines
from ktdeploy.core.terminal_text import terminal_safe

NFD_PREFIX = "feature.node.kubernetes.io/cpu-cpuid."
NFD_NAMES = {"fma": "FMA3"}   # NFD's cpuid names: upper case, no underscore, FMA as FMA3
NFD_SMT = "feature.node.kubernetes.io/cpu-hardware_multithreading"   # "true" where a `cpu` is an SMT thread
API_KEY_SECRET_KEY = "api-key"
BACKOFF_LIMIT = 3          # crashes retried (each retry resumes from the newest complete checkpoint)
# exit codes no retry can mend: the recipe refused (2), a finished run or another run's output in the way (6)
FAIL_JOB_EXIT_CODES = [2, 6]
PROOF = "cpu-proof"
GiB = 1 << 30


def nfd_labels(variant: str | None) -> dict[str, str]:
    """nodeSelector on Node Feature Discovery's CPUID labels for the variant's flags (amx: AMXTILE, AMXBF16, …)."""
    if variant is None:
        return {}
    return {NFD_PREFIX + NFD_NAMES.get(f, f.replace("_", "").upper()): "true" for f in variant_flags(variant)}


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "ktdeploy", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _volumes(recipe: Recipe, name: str, *, output_readonly: bool, shm_bytes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    vol = recipe.require_deploy().volumes
    volumes: list[dict[str, Any]] = [{"name": "recipe", "configMap": {"name": f"{name}-recipe"}},
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(1, -(-shm_bytes // (1 << 20)))}Mi"}}]
    mounts: list[dict[str, Any]] = [{"name": "recipe", "mountPath": JOB_MOUNT, "readOnly": True},
              {"name": "shm", "mountPath": "/dev/shm"}]
    for key, path, ro in (("model", vol.model, True), ("data", vol.data, False), ("output", vol.output, output_readonly)):
        volumes.append({"name": key, "persistentVolumeClaim": {"claimName": f"{name}-{key}", "readOnly": ro}})
        mounts.append({"name": key, "mountPath": path, "readOnly": ro})
    return volumes, mounts


def cpu_request(request: JobRequest, cpus_are_threads: bool) -> int:
    """Kubernetes' `cpu` for the job's physical cores: a core is 2 CPUs where the nodes count SMT threads."""
    return request.cpus * (2 if cpus_are_threads else 1)


def _container(name: str, image: str, args: list[str], request: JobRequest, mounts: list[dict[str, Any]],
               env: list[dict[str, Any]], cpus: int | None = None) -> dict[str, Any]:
    res = {"cpu": str(cpus or request.cpus), "memory": f"{request.mem_mib}Mi"}
    if request.gpus:
        res["nvidia.com/gpu"] = str(request.gpus)
    c: dict[str, Any] = {"name": name, "image": image, "args": args, "env": env,
            "resources": {"requests": dict(res), "limits": dict(res)},
            # NUMA binding needs set_mempolicy (kt-kernel); never privileged
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_NICE"]}},
            "volumeMounts": mounts}
    return c


def shm_bytes_for(recipe: Recipe) -> int:
    """/dev/shm's size: what the planner stages there (ephemeral INT8 experts) plus ktdeploy's minimum for the rest
    (NCCL, the DataLoader); the minimum alone without a model config the planner can read. A memory-backed volume
    counts against the pod's memory limit, which the planner's upper edge already holds the staging in."""
    try:
        from ktdeploy.core.sizing import plan_recipe

        plan, _arch, _where = plan_recipe(recipe, gpus=len(recipe.require_deploy().gpus))
        staged = sum(t.gib for t in plan.terms("host") if "/dev/shm" in t.name)
    except Exception:  # no config.json for the model: the minimum
        staged = 0.0
    return int(staged * GiB) + MIN_SHM


def require_registry(image: str) -> None:
    """A cluster's nodes pull the image: a bare local tag (``ktsft:amx``) names nothing they can reach."""
    if not has_registry(image):
        raise RecipeError(f"the image {terminal_safe(image)!r} is a local tag: a Kubernetes node cannot pull it",
                          key="deploy.registry",
                          fix=f"Push it to a registry the cluster reaches (docker tag {terminal_safe(image)} "
                              f"REGISTRY/{terminal_safe(image)} && docker push REGISTRY/{terminal_safe(image)}) and set "
                              "deploy.registry: REGISTRY (or deploy.image to the full reference).")


def _train_command(recipe: Recipe, out: str) -> list[str]:
    """tini, then the supervising shell (supervise.py) around the image's agent: TERM asks for a checkpoint."""
    layout = JobLayout(out)
    sup = Supervision(save_on=("TERM",), stop_on=(), stop_request=layout.stop_request,
                      stopped_marker=layout.stopped_marker, who="Kubernetes (the pod is being deleted)")
    agent = " ".join(shlex.quote(a) for a in (*IMAGE_AGENT, "train", CONTAINER_RECIPE))
    lines = ["set -u", "cname=train", f"out={shlex.quote(out)}", *prologue(sup), "resume=()",
             'if compgen -G "$out/checkpoint-*" >/dev/null; then resume=(--resume auto); '
             'echo "ktdeploy: checkpoints in $out: resuming"; fi',
             *wait_lines(agent + ' "${resume[@]}"'), *epilogue(sup)]
    return ["/usr/bin/tini", "--", "/bin/bash", "-c", "\n".join(lines) + "\n", "ktdeploy-train"]


def _pod_failure_policy() -> dict[str, Any]:
    return {"rules": [
        # preemption, eviction, a drain: the pod saved on SIGTERM; its replacement resumes and costs no retry
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "train", "operator": "In",
                                              "values": FAIL_JOB_EXIT_CODES}},
        # the node cannot run the image's CPU build: another try there would fail the same way
        {"action": "FailJob", "onExitCodes": {"containerName": PROOF, "operator": "In", "values": [1]}},
    ]}


def manifests(recipe: Recipe, *, image: str, variant: str | None, request: JobRequest, namespace: str = "default",
              shm_bytes: int | None = None) -> list[dict[str, Any]]:
    """ConfigMap, Job, Deployment, Service for ``recipe`` (in that order)."""
    require_registry(image)
    name = job_name(recipe)
    out = output_dir_of(recipe)
    deploy = recipe.require_deploy()
    sched = deploy.scheduler
    shm = shm_bytes if shm_bytes is not None else shm_bytes_for(recipe)
    doc = shipped_recipe(recipe, None)
    serve_doc = copy.deepcopy(doc)
    serve_doc.setdefault("deploy", {}).setdefault("serve", {})["host"] = "0.0.0.0"   # the Service decides exposure
    selector = {**nfd_labels(variant), NFD_SMT: "true" if sched.cpus_are_threads else "false"}
    cpus = cpu_request(request, sched.cpus_are_threads)
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "KTDEPLOY_RUN", "value": name}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{name}-recipe",
                                                                "labels": _labels(name, "recipe")},
          "data": {"recipe.yaml": dump_yaml(doc), "serve.yaml": dump_yaml(serve_doc)}}
    vols, mounts = _volumes(recipe, name, output_readonly=False, shm_bytes=shm)
    train = _container("train", image, [], request, mounts,
                       [*env, {"name": SUPERVISED_ENV, "value": "1"}], cpus=cpus)
    del train["args"]
    train["command"] = _train_command(recipe, out)
    grace = signal_plan(recipe).seconds
    pod: dict[str, Any] = {"restartPolicy": "Never", "volumes": vols, "terminationGracePeriodSeconds": grace,
                           "nodeSelector": selector, "containers": [train]}
    if variant is not None:
        proof = {"name": PROOF, "image": image, "args": ["doctor", "--variant", variant, "--only", "image.variant"],
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
                 "securityContext": {"allowPrivilegeEscalation": False}}
        pod["initContainers"] = [proof]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {**meta, "labels": _labels(name, "train")},
           "spec": {"backoffLimit": BACKOFF_LIMIT, "podFailurePolicy": _pod_failure_policy(),
                    "template": {"metadata": {"labels": _labels(name, "train")}, "spec": pod}}}
    serve = deploy.serve
    full = recipe.keys.is_full
    adapter = JobLayout(out).adapter_dir
    args = ["serve", f"{JOB_MOUNT}/serve.yaml", *(["--weights", adapter] if full else ["--adapter", adapter])]
    senv = list(env)
    if serve.api_key_env:
        senv.append({"name": serve.api_key_env, "valueFrom": {"secretKeyRef": {"name": f"{name}-api-key",
                                                                              "key": API_KEY_SECRET_KEY}}})
    svols, smounts = _volumes(recipe, name, output_readonly=True, shm_bytes=shm)
    sc = _container("serve", image, args, request, smounts, senv, cpus=cpus)
    sc["ports"] = [{"name": "http", "containerPort": serve.port}]
    sc["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                            "failureThreshold": max(1, serve.ready_timeout_s // 10)}
    spod: dict[str, Any] = {"volumes": svols, "containers": [sc], "nodeSelector": selector}
    sname = f"{name}-serve"
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {**meta, "name": sname, "labels": _labels(name, "serve")},
           "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": _labels(name, "serve")},
                    "template": {"metadata": {"labels": _labels(name, "serve")}, "spec": spod}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {**meta, "name": sname, "labels": _labels(name, "serve")},
           "spec": {"type": "ClusterIP", "selector": _labels(name, "serve"),
                    "ports": [{"name": "http", "port": serve.port, "targetPort": "http", "protocol": "TCP"}]}}
    return [cm, job, dep, svc]


def render_yaml(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(dump_yaml(d) for d in docs)
