"""`ktdeploy render --k8s`: the manifests validate strictly against the Kubernetes schemas of the versions named
(kubernetes-validate, pinned: its schemas ship in the wheel, no cluster and no network), and carry ktdeploy's
knowledge: NFD CPU labels of the variant, requests = limits from the planner and the thread plan, GPUs, a
memory-backed /dev/shm, the model (read-only), data and output volumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sched.job_files import k8s_manifests
from ktdeploy.core.sched.k8s import nfd_labels
from ktdeploy.core.sched.request import request_for

REPO = Path(__file__).resolve().parents[4]
VERSIONS = ("1.30.0", "1.33.0", "1.37.0")   # each has its own schema set in the wheel (1.25-1.37)


def recipe(*sets):
    return load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml", ["deploy.scheduler.cpus=8", *sets])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sets", [(), ("deploy.serve.api_key_env=KT_KEY", "deploy.gpus=[0,1]",
                                       "accelerate.num_processes=2")])
def test_manifests_validate_strictly(version, sets):
    for doc in k8s_manifests(recipe(*sets), "amx"):
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_wrong_field_fails_the_strict_schema():
    job = k8s_manifests(recipe(), "amx")[1]
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}     # a typo kubectl would reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.37.0", strict=True)


def test_the_job_carries_ktdeploys_knowledge():
    r = recipe()
    cm, job, dep, svc = k8s_manifests(r, "amx", namespace="ml")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == nfd_labels("amx")
    assert {"feature.node.kubernetes.io/cpu-cpuid.AMXTILE", "feature.node.kubernetes.io/cpu-cpuid.AMXBF16",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F"} <= set(pod["nodeSelector"])
    assert "feature.node.kubernetes.io/cpu-cpuid.AMXTILE" not in nfd_labels("avx512")
    c = pod["containers"][0]
    req = request_for(r, "amx")
    assert c["resources"]["requests"] == c["resources"]["limits"] == {
        "cpu": "10", "memory": f"{req.mem_mib}Mi", "nvidia.com/gpu": "1"}
    assert c["args"] == ["train", "/ktdeploy-job/recipe.yaml"] and c["image"] == "ktsft:amx"
    assert c["securityContext"]["capabilities"]["add"] == ["SYS_NICE"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["shm"]["emptyDir"]["medium"] == "Memory"
    assert vols["model"]["persistentVolumeClaim"]["readOnly"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["model"]["mountPath"] == "/srv/ktdeploy/models" and mounts["model"]["readOnly"]
    assert mounts["output"]["mountPath"] == "/srv/ktdeploy/output" and not mounts["output"]["readOnly"]
    assert mounts["shm"]["mountPath"] == "/dev/shm"
    served = yaml.safe_load(cm["data"]["serve.yaml"])
    assert served["deploy"]["serve"]["host"] == "0.0.0.0" and job["metadata"]["namespace"] == "ml"
    s = dep["spec"]["template"]["spec"]["containers"][0]
    assert s["args"][-2:] == ["--adapter", "/srv/ktdeploy/output/tiny-moe-lora-sglang"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_cli_prints_or_writes_the_manifests(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--k8s", str(REPO / "recipes/tiny-moe-lora.yaml"),
                        "--variant", "avx512", "--set", "deploy.scheduler.cpus=8"], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout)]
    assert kinds == ["ConfigMap", "Job", "Deployment", "Service"]
    w = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--k8s", str(REPO / "recipes/tiny-moe-lora.yaml"),
                        "--variant", "avx512", "--set", "deploy.scheduler.cpus=8", "-o", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO)
    assert w.returncode == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["serve.yaml", "train-job.yaml"]
    no = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--slurm",
                         str(REPO / "recipes/tiny-moe-lora.yaml")], capture_output=True, text=True, cwd=REPO)
    assert no.returncode == 2 and "--variant" in no.stderr and "Traceback" not in no.stderr
