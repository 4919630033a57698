"""`up`'s WEIGHTS stage: an INT8/AMXINT4 recipe whose persistent kt_weight_path is not there yet gets its experts
converted by `ktdeploy prepare-weights` in the image, between VOLUMES and TRAIN; doctor's `weights.missing` is
left to that stage (not a PREFLIGHT failure); the model folder itself is mounted read-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import RUNTIME_FIXABLE, gate
from ktdeploy.core.facts.host import CpuFacts, DockerFacts, HostFacts
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.recipe import load_recipe

REPO = Path(__file__).resolve().parents[4]
AMX = ["avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512vbmi", "amx_tile", "amx_int8", "amx_bf16"]


def _plan(name: str, *sets: str):
    facts = HostFacts(cpu=CpuFacts(flags=sorted(AMX)),
                      docker=DockerFacts(present=True, reachable=True, server_version="24.0", runtimes=["runc", "nvidia"]))
    return build_plan(load_recipe(REPO / "recipes" / name, list(sets)), facts,
                      JobState(home="/home/u", image_id="sha256:abc"), UpOptions(host="gpu01", run_id="r1"))


@pytest.mark.parametrize("name, fmt, tree, manifest", [
    ("tiny-moe-int8-lora.yaml", "int8", "/srv/ktdeploy/models/tiny-qwen3-moe-INT8", "kt-weight-manifest.json"),
    ("tiny-moe-amxint4-lora.yaml", "amxint4", "/srv/ktdeploy/models/tiny-qwen3-moe-AMXINT4", "ktdeploy-weights.json"),
])
def test_converted_recipes_get_a_weights_stage_before_train(name, fmt, tree, manifest):
    p = _plan(name)
    names = [s.name for s in p.stages]
    assert names.index("WEIGHTS") == names.index("VOLUMES") + 1 == names.index("TRAIN") - 1
    step = next(s for st in p.stages if st.name == "WEIGHTS" for s in st.steps)
    assert step.probe == ("test", "-f", f"{tree}/{manifest}")
    argv = list(step.argv or ())
    model = "/srv/ktdeploy/models/tiny-qwen3-moe"
    assert argv[argv.index("--") + 1:] == ["ktsft:amx", "prepare-weights", model, "--format", fmt, "--threadpools", "1",
                                           "--threads", argv[argv.index("--threads") + 1], "-o", tree]
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]
    # the volume writable (the tree is the model folder's sibling), the model folder itself read-only over it
    assert mounts == ["type=bind,source=/srv/ktdeploy/models,target=/srv/ktdeploy/models",
                      f"type=bind,source={model},target={model},readonly"]


def test_the_recipes_thread_pools_are_the_trees():
    p = _plan("tiny-moe-int8-lora.yaml", "train.kt_config.kt_tp_enabled=true", "train.kt_config.kt_threadpool_count=2")
    argv = next(s for st in p.stages if st.name == "WEIGHTS" for s in st.steps).argv or ()
    assert argv[argv.index("--threadpools") + 1] == "2"


@pytest.mark.parametrize("name", ["tiny-moe-lora.yaml", "tiny-moe-fp8-lora.yaml", "tiny-moe-int8-ephemeral-lora.yaml",
                                  "tiny-moe-full.yaml"])
def test_no_weights_stage_where_nothing_is_converted_beforehand(name):
    assert "WEIGHTS" not in [s.name for s in _plan(name).stages]


def test_up_leaves_a_missing_tree_to_the_weights_stage_and_train_does_not():
    missing = CheckResult(name=CheckName.WEIGHTS_MISSING, status="fail", detail="not converted")
    foreign = CheckResult(name=CheckName.WEIGHTS_CONVERTED, status="fail", detail="an original checkpoint")
    g = gate([missing, foreign], defer=RUNTIME_FIXABLE)
    assert g.deferred == [missing] and g.blocking == [foreign]
    assert gate([missing]).blocking == [missing]     # `ktdeploy train` in the image: nothing converts it there


def test_doctor_says_missing_and_names_the_command():
    from ktdeploy.core.checks.data import data_checks
    from ktdeploy.core.facts.data_listing import parse_data_output

    text = "@@KTD-DATA\tls\tmissing\t0\t/m/W\n"
    train = {"model_name_or_path": "/m/M", "kt_weight_path": "/m/W", "kt_config": {"kt_expert_weight_format": "int8"}}
    c = {c.name: c for c in data_checks(train, "int8", parse_data_output(text))}
    assert c["weights.missing"].status == "fail" and "weights.converted" not in c
    assert "ktdeploy prepare-weights /m/M --format int8 -o /m/W" in (c["weights.missing"].fix or "")
