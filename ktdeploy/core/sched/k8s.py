"""Kubernetes manifests of a recipe (pure, static: no cluster is contacted or claimed).

    ConfigMap   the recipe the container runs (GPUs renumbered, the server listening on the pod's address)
    Job         training: the image's `train`, node selection on Node Feature Discovery's CPU labels for the image
                variant's flags, CPU/memory/GPU requests = limits (planner upper edge, thread plan, deploy.gpus),
                SYS_NICE, a memory-backed /dev/shm, the model (read-only), data and output volumes
    Deployment  serving: the image's `serve` on the converted adapter, the same node selection and volumes
    Service     the server's port (ClusterIP)

Volumes are PersistentVolumeClaims named ``<job>-model``, ``-data``, ``-output``, mounted at the recipe's paths.
"""

from __future__ import annotations

import copy
from typing import Any

from ktdeploy.core.checks.resources import MIN_SHM
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan.docker_argv import CONTAINER_RECIPE, JOB_MOUNT
from ktdeploy.core.plan.host_plan import job_name, output_dir_of, shipped_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.sched.features import variant_flags
from ktdeploy.core.sched.request import JobRequest

NFD_PREFIX = "feature.node.kubernetes.io/cpu-cpuid."
NFD_NAMES = {"fma": "FMA3"}   # NFD's cpuid names: upper case, no underscore, FMA as FMA3
API_KEY_SECRET_KEY = "api-key"


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
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(1, shm_bytes >> 20)}Mi"}}]
    mounts: list[dict[str, Any]] = [{"name": "recipe", "mountPath": JOB_MOUNT, "readOnly": True},
              {"name": "shm", "mountPath": "/dev/shm"}]
    for key, path, ro in (("model", vol.model, True), ("data", vol.data, False), ("output", vol.output, output_readonly)):
        volumes.append({"name": key, "persistentVolumeClaim": {"claimName": f"{name}-{key}", "readOnly": ro}})
        mounts.append({"name": key, "mountPath": path, "readOnly": ro})
    return volumes, mounts


def _container(name: str, image: str, args: list[str], request: JobRequest, mounts: list[dict[str, Any]],
               env: list[dict[str, Any]]) -> dict[str, Any]:
    res = {"cpu": str(request.cpus), "memory": f"{request.mem_mib}Mi"}
    if request.gpus:
        res["nvidia.com/gpu"] = str(request.gpus)
    c: dict[str, Any] = {"name": name, "image": image, "args": args, "env": env,
            "resources": {"requests": dict(res), "limits": dict(res)},
            # NUMA binding needs set_mempolicy (kt-kernel); never privileged
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_NICE"]}},
            "volumeMounts": mounts}
    return c


def manifests(recipe: Recipe, *, image: str, variant: str | None, request: JobRequest, namespace: str = "default",
              shm_bytes: int = MIN_SHM) -> list[dict[str, Any]]:
    """ConfigMap, Job, Deployment, Service for ``recipe`` (in that order)."""
    name = job_name(recipe)
    out = output_dir_of(recipe)
    doc = shipped_recipe(recipe, None)
    serve_doc = copy.deepcopy(doc)
    serve_doc.setdefault("deploy", {}).setdefault("serve", {})["host"] = "0.0.0.0"   # the Service decides exposure
    selector = nfd_labels(variant)
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "KTDEPLOY_RUN", "value": name}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{name}-recipe",
                                                                "labels": _labels(name, "recipe")},
          "data": {"recipe.yaml": dump_yaml(doc), "serve.yaml": dump_yaml(serve_doc)}}
    vols, mounts = _volumes(recipe, name, output_readonly=False, shm_bytes=shm_bytes)
    pod: dict[str, Any] = {"restartPolicy": "Never", "volumes": vols,
           "containers": [_container("train", image, ["train", CONTAINER_RECIPE], request, mounts, env)]}
    if selector:
        pod["nodeSelector"] = selector
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {**meta, "labels": _labels(name, "train")},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": _labels(name, "train")}, "spec": pod}}}
    serve = recipe.require_deploy().serve
    full = recipe.keys.is_full
    adapter = JobLayout(out).adapter_dir
    args = ["serve", f"{JOB_MOUNT}/serve.yaml", *(["--weights", adapter] if full else ["--adapter", adapter])]
    senv = list(env)
    if serve.api_key_env:
        senv.append({"name": serve.api_key_env, "valueFrom": {"secretKeyRef": {"name": f"{name}-api-key",
                                                                              "key": API_KEY_SECRET_KEY}}})
    svols, smounts = _volumes(recipe, name, output_readonly=True, shm_bytes=shm_bytes)
    sc = _container("serve", image, args, request, smounts, senv)
    sc["ports"] = [{"name": "http", "containerPort": serve.port}]
    sc["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                            "failureThreshold": max(1, serve.ready_timeout_s // 10)}
    spod: dict[str, Any] = {"volumes": svols, "containers": [sc]}
    if selector:
        spod["nodeSelector"] = selector
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
