"""The independent oracle's stack judge (tests/oracle/stack_judge.py) gives the real stack's verdicts.

One container of the full image judges the shipped recipes (all must start) and one recipe per known refusal of
each component, each named by the message the real code gives: if the judge stopped reaching a component (a stand-in
that swallows an error, a gate bypassed too widely), a case here flips. Skipped when no full image is present.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import uuid

import pytest

from tests.oracle import harness
from tests.oracle import independent_gen as gen

pytestmark = pytest.mark.docker

IMAGE = "ktsft:amx"

# (name, base recipe, changes as (path, value or DROP), component that must refuse, phrase of its message)
DROP = object()
REFUSED = [
    ("kt_backend_space", "qwen35-397b-bf16-lora", [(("train", "kt_config", "kt_backend"), " auto")],
     "kt_kernel", "unknown kt_backend"),
    ("ephemeral_bf16", "tiny-moe-lora", [(("train", "kt_config", "kt_weight_lifecycle"), "Ephemeral")],
     "kt_kernel", "ephemeral"),
    ("fp8_lora_experts", "deepseek-v3-fp8-lora", [(("train", "kt_use_lora_experts"), True)],
     "kt_kernel", "FP8 SFT does not support GPU LoRA experts"),
    ("retain_amxint4", "qwen35-397b-amxint4-lora", [(("train", "kt_cpu_activation"), "retain")],
     "kt_kernel", "activation_policy.cpu=retain"),
    ("fsdp1", "qwen35-397b-bf16-lora", [(("accelerate", "fsdp_config", "fsdp_version"), DROP)],
     "kt_plugin", "not FSDP1"),
    ("multi_gpu", "qwen35-397b-bf16-lora", [(("accelerate", "distributed_type"), "MULTI_GPU")],
     "kt_plugin", "received distributed_type=DistributedType.MULTI_GPU"),
    ("fsdp_lowercase", "tiny-moe-lora", [(("accelerate", "distributed_type"), "fsdp")],
     "accelerate_launch", "is not a valid DistributedType"),
    ("eval_no_data", "tiny-moe-lora", [(("train", "do_eval"), True)],
     "llamafactory_args", "eval_dataset be provided"),
    ("streaming", "tiny-moe-lora", [(("train", "streaming"), True)],
     "llamafactory_args", "max_steps"),
    ("scheduler_case", "tiny-moe-lora", [(("train", "lr_scheduler_type"), "Cosine")],
     "llamafactory_args", "is not a valid SchedulerType"),
    ("lora_galore", "tiny-moe-lora", [(("train", "use_galore"), True)],
     "llamafactory_args", "Cannot use LoRA with GaLore"),
    ("warmup_negative", "tiny-moe-lora", [(("train", "warmup_ratio"), -0.1)],
     "llamafactory_args", "warmup_steps"),
    ("tensorboard", "tiny-moe-lora", [(("train", "report_to"), "tensorboard")],
     "llamafactory_workflow", "TensorBoardCallback requires tensorboard"),
]
ACCEPTED = [
    ("lora_target_list", "tiny-moe-lora", [(("train", "lora_target"), ["q_proj", "v_proj"])]),
    ("save_steps_ratio", "tiny-moe-lora", [(("train", "save_steps"), 0.5)]),
    ("downcast_no", "tiny-moe-lora", [(("accelerate", "downcast_bf16"), "no")]),
]


def _image_present() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0


def _apply(base: dict, changes) -> dict:
    out = copy.deepcopy(base)
    for path, value in changes:
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
        if value is DROP:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return out


@pytest.fixture(scope="module")
def verdicts():
    if not _image_present():
        pytest.skip(f"no {IMAGE} on this machine (the full image: ktdeploy image build --stack full)")
    bases = gen.base_recipes()
    items = [(f"control-{n}", r, f"{n}: unchanged") for n, r in sorted(bases.items())]
    items += [(name, _apply(bases[b], ch), f"{b}: {name}") for name, b, ch, _, _ in REFUSED]
    items += [(name, _apply(bases[b], ch), f"{b}: {name}") for name, b, ch in ACCEPTED]
    work = harness.REPO / ".cache" / f"oracle-itest-{uuid.uuid4().hex[:8]}"
    try:
        entries = harness.prepare_cases(items, work)
        harness.write_manifest(work, entries, seed=0, n=len(entries))
        harness.run_judge(work, IMAGE, per_case=60, timeout=900, name=f"oracle-itest-{work.name[-8:]}")
        results = json.loads((work / "stack.json").read_text())["results"]
        return {e["case_id"]: (e, r) for e, r in zip(entries, results, strict=True)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_shipped_recipes_start(verdicts):
    for name, (entry, res) in verdicts.items():
        if name.startswith("control-"):
            assert entry["ktdeploy"]["valid"], name
            assert res["verdict"] == "accept", (name, res["stages"])
            assert all(s["status"] == "pass" for s in res["stages"].values()), (name, res["stages"])


@pytest.mark.parametrize(("name", "component", "phrase"), [(n, c, p) for n, _, _, c, p in REFUSED])
def test_each_component_refuses_what_it_refuses(verdicts, name, component, phrase):
    _entry, res = verdicts[name]
    assert res["verdict"] == "refuse" and res["first_refusal"] == component, res["stages"]
    assert phrase in res["stages"][component]["message"], res["stages"][component]


@pytest.mark.parametrize("name", [n for n, _, _ in ACCEPTED])
def test_the_stack_accepts(verdicts, name):
    _entry, res = verdicts[name]
    assert res["verdict"] == "accept", res["stages"]
