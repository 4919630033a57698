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

from ktdeploy.core.checks.resources import MIN_SHM
from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sched.job_files import k8s_manifests
from ktdeploy.core.sched.k8s import NFD_SMT, nfd_labels, shm_bytes_for
from ktdeploy.core.sched.request import request_for
from ktdeploy.core.sched.signal_time import signal_plan

REPO = Path(__file__).resolve().parents[4]
VERSIONS = ("1.30.0", "1.33.0", "1.37.0")   # each has its own schema set in the wheel (1.25-1.37)


REGISTRY = "registry.example.com/ml"


def recipe(*sets, name="tiny-moe-lora.yaml"):
    return load_recipe(REPO / "recipes" / name, ["deploy.scheduler.cpus=8", f"deploy.registry={REGISTRY}", *sets])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sets", [(), ("deploy.serve.api_key_env=KT_KEY", "deploy.gpus=[0,1]",
                                       "accelerate.num_processes=2", "deploy.scheduler.cpus_are_threads=true")])
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
    assert pod["nodeSelector"] == {**nfd_labels("amx"), NFD_SMT: "false"}    # a `cpu` is a core on these nodes
    assert {"feature.node.kubernetes.io/cpu-cpuid.AMXTILE", "feature.node.kubernetes.io/cpu-cpuid.AMXBF16",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F"} <= set(pod["nodeSelector"])
    assert "feature.node.kubernetes.io/cpu-cpuid.AMXTILE" not in nfd_labels("avx512")
    c = pod["containers"][0]
    req = request_for(r, "amx")
    assert c["resources"]["requests"] == c["resources"]["limits"] == {
        "cpu": "10", "memory": f"{req.mem_mib}Mi", "nvidia.com/gpu": "1"}
    assert c["image"] == f"{REGISTRY}/ktsft:amx" and "args" not in c
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


def test_the_job_resumes_and_saves_on_sigterm_within_its_grace_period():
    job = k8s_manifests(recipe(), "amx")[1]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["backoffLimit"] == 3 and pod["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert {"action": "FailJob", "onExitCodes": {"containerName": "train", "operator": "In", "values": [2, 6]}} in rules
    assert pod["terminationGracePeriodSeconds"] == signal_plan(recipe()).seconds
    c = pod["containers"][0]
    assert c["command"][:5] == ["/usr/bin/tini", "--", "/bin/bash", "-c", c["command"][4]]
    script = c["command"][4]
    assert "trap 'ktd_save TERM' TERM" in script and "resume=(--resume auto)" in script
    assert "/opt/venv/bin/python -m ktdeploy.cli.image_entry train /ktdeploy-job/recipe.yaml" in script
    assert {"name": "KTDEPLOY_SUPERVISED", "value": "1"} in c["env"]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    big = k8s_manifests(recipe("deploy.scheduler.step_seconds=900"), "amx")[1]
    assert big["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 1800


def test_an_init_container_proves_the_cpu_build_before_the_weights_load():
    pod = k8s_manifests(recipe(), "amx")[1]["spec"]["template"]["spec"]
    proof = pod["initContainers"][0]
    assert proof["name"] == "cpu-proof" and proof["image"] == pod["containers"][0]["image"]
    assert proof["args"] == ["doctor", "--variant", "amx", "--only", "image.variant"]
    rules = k8s_manifests(recipe(), "amx")[1]["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "cpu-proof", "operator": "In", "values": [1]}} in rules


def test_cpu_requests_count_physical_cores():
    r = recipe("deploy.scheduler.cpus_are_threads=true")
    pod = k8s_manifests(r, "amx")[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == "20" and pod["nodeSelector"][NFD_SMT] == "true"


def test_shm_is_sized_from_the_planner_with_ephemeral_int8_staging():
    plain = k8s_manifests(recipe(), "amx")[1]["spec"]["template"]["spec"]["volumes"]
    eph_r = recipe(name="tiny-moe-int8-ephemeral-lora.yaml")
    eph = k8s_manifests(eph_r, "amx")[1]["spec"]["template"]["spec"]["volumes"]
    size = {v["name"]: v for v in plain}["shm"]["emptyDir"]["sizeLimit"]
    staged = {v["name"]: v for v in eph}["shm"]["emptyDir"]["sizeLimit"]
    assert size == f"{MIN_SHM >> 20}Mi" and int(staged[:-2]) > MIN_SHM >> 20
    assert int(staged[:-2]) == -(-shm_bytes_for(eph_r) // (1 << 20))      # whole MiB, rounded up


def test_a_bare_local_tag_is_refused_naming_the_fix():
    with pytest.raises(RecipeError) as e:
        k8s_manifests(load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml", ["deploy.scheduler.cpus=8"]), "amx")
    assert e.value.key == "deploy.registry" and "docker push" in e.value.fix and "ktsft:amx" in e.value.message


def test_cli_prints_or_writes_the_manifests(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--k8s", str(REPO / "recipes/tiny-moe-lora.yaml"),
                        "--variant", "avx512", "--set", "deploy.scheduler.cpus=8", "--set",
                        f"deploy.registry={REGISTRY}"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout)]
    assert kinds == ["ConfigMap", "Job", "Deployment", "Service"]
    w = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--k8s", str(REPO / "recipes/tiny-moe-lora.yaml"),
                        "--variant", "avx512", "--set", "deploy.scheduler.cpus=8", "--set",
                        f"deploy.registry={REGISTRY}", "-o", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO)
    assert w.returncode == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["serve.yaml", "train-job.yaml"]
    no = subprocess.run([sys.executable, "-m", "ktdeploy", "render", "--slurm",
                         str(REPO / "recipes/tiny-moe-lora.yaml")], capture_output=True, text=True, cwd=REPO)
    assert no.returncode == 2 and "--variant" in no.stderr and "Traceback" not in no.stderr
