"""build_plan over a grid of recipes x host states x options, compared with plans recorded from the code before
it was split into one function per stage (tests/unit/core/plan/data/plans.json). A change to any plan shows here as a
diff of that scenario; re-record on purpose only, with KTDEPLOY_RECORD_PLANS=1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ktdeploy.core.errors import KtdeployError
from ktdeploy.core.facts.host import CpuFacts, DockerFacts, HostFacts
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.state import ContainerState, JobState
from ktdeploy.core.recipe import builtin_recipe, load_recipe

DATA = Path(__file__).with_name("data") / "plans.json"
AVX512 = ["avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512vbmi"]
FULL = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]
DONE = ["all_results.json", "train_results.json", "trainer_state.json", "adapter_model.safetensors"]
CKPTS = {"checkpoint-10": FULL, "checkpoint-20": FULL, "checkpoint-30": FULL[:2]}

RECIPES = {
    "tiny": [],
    "tiny-key": ["deploy.serve.api_key_env=KTDEPLOY_KEY"],
    "tiny-noserve": ["deploy.serve.enabled=false"],
    "tiny-registry": ["deploy.registry=reg.example:5000"],
    "full": ["train.finetuning_type=full"],
}
STATES = {
    "fresh": {},
    "no-image": {"image_id": None},
    "running": {"container": ContainerState(status="running")},
    "succeeded": {"container": ContainerState(status="exited", exit_code=0), "output_exists": True, "top_level": DONE},
    "crashed": {"container": ContainerState(status="exited", exit_code=137, oom_killed=True), "output_exists": True,
                "top_level": sorted(CKPTS), "listing": CKPTS},
    "finished-no-container": {"output_exists": True, "top_level": DONE},
    "serving": {"container": ContainerState(status="exited", exit_code=0), "serve": ContainerState(status="running"),
                "adapter_present": True, "output_exists": True, "top_level": DONE},
    "serve-stopped": {"container": ContainerState(status="exited", exit_code=0),
                      "serve": ContainerState(status="exited", exit_code=1), "adapter_present": True,
                      "output_exists": True, "top_level": DONE},
}
OPTIONS = {
    "default": {},
    "resume": {"resume": "auto"},
    "detach": {"detach": True},
    "tune": {"tune": True, "tune_budget_minutes": 5.0},
    "waive-gpu": {"waive": ("docker.nvidia_runtime", "docker.memlock")},
    "tar-remote": {"image_tar": "/c/img.tar"},
    "tar-local": {"image_tar": "/c/img.tar", "local": True},
}


def _scenarios() -> list[tuple[str, str, str]]:
    out = [(r, s, "default") for r in RECIPES for s in STATES]
    out += [("tiny", s, o) for s in ("fresh", "crashed", "finished-no-container", "no-image") for o in OPTIONS
            if o != "default"]
    out += [("full", "fresh", o) for o in ("detach", "waive-gpu")]
    return out


def _plan(r: str, s: str, o: str) -> dict:
    st = JobState(home="/home/u", user="1000:1000", image_id="sha256:abc")
    for k, v in STATES[s].items():
        setattr(st, k, v)
    facts = HostFacts(cpu=CpuFacts(flags=sorted(AVX512)),
                      docker=DockerFacts(present=True, reachable=True, server_version="24.0", runtimes=["runc"]))
    opts = UpOptions(host="gpu01", run_id="r1", **OPTIONS[o])
    try:
        plan = build_plan(load_recipe(builtin_recipe(), RECIPES[r]), facts, st, opts)
        return json.loads(json.dumps(plan.to_json()))   # enums as their values, tuples as lists
    except KtdeployError as e:        # a refusal is a recorded outcome too
        return {"error": type(e).__name__, "message": e.message}


SCENARIOS = _scenarios()


def test_record_or_load():
    if os.environ.get("KTDEPLOY_RECORD_PLANS") == "1":
        DATA.write_text(json.dumps({"/".join(k): _plan(*k) for k in SCENARIOS}, indent=0, sort_keys=True) + "\n")
    recorded = json.loads(DATA.read_text())
    assert sorted(recorded) == sorted("/".join(k) for k in SCENARIOS)
    assert len(recorded) >= 40


@pytest.mark.parametrize("key", SCENARIOS, ids=["/".join(k) for k in SCENARIOS])
def test_plan_matches_the_recorded_one(key):
    assert _plan(*key) == json.loads(DATA.read_text())["/".join(key)]
