"""The independent oracle's stack judge (tests/oracle/stack_judge.py) gives the real stack's verdicts.

One container of the full image judges the shipped recipes (all must start) and one recipe per known refusal of
each component, each named by the message the real code gives: if the judge stopped reaching a component (a stand-in
that swallows an error, a gate bypassed too widely), a case here flips. Skipped when no full image is present.
"""

from __future__ import annotations

import copy
import json
import os
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


# ---------------------------------------------------------------- issue 49: the standing oracle on the full image
#
# ≥ 2,000 recipes of the generator's "issue49" profile (its classes: lora_target null, LoRA-only flags on a full
# fine-tune, dataloader_prefetch_factor without workers, ddp_backend, infer_backend, module names the model has or
# lacks, kt-kernel's pools against the model's dimensions, another architecture) go through plain `ktdeploy check`
# (load_recipe + validate, on the host) and the real stack (stack_judge.py: one container process). Plain check must
# never pass what the stack refuses on the cases whose verdict does not need the model (0 looser); on the
# model-dependent cases, `check --stack --model-config CONFIG` (one container process, stack_check_batch.py) must
# not either. KTDEPLOY_ORACLE_SEED draws another set than the recorded one (a set the rules were not fixed on).
# Both are opt-in
# (KTDEPLOY_ORACLE_STANDING=1): with the model setup on the meta device for every case the judge takes about an
# hour for 2,000 recipes on 2 cores (bench/results/oracle-independent/issue49 has the measured run).

SEED_49 = int(os.environ.get("KTDEPLOY_ORACLE_SEED", "20261207"))
N_49 = int(os.environ.get("KTDEPLOY_ORACLE_N", "2000"))


@pytest.fixture(scope="module")
def issue49():
    if os.environ.get("KTDEPLOY_ORACLE_STANDING") != "1":
        pytest.skip("the standing oracle judges 2,000 recipes with every model built (about an hour on 2 cores): "
                    "KTDEPLOY_ORACLE_STANDING=1 runs it")
    if not _image_present():
        pytest.skip(f"no {IMAGE} on this machine (the full image: ktdeploy image build --stack full)")
    import time

    work = harness.REPO / ".cache" / f"oracle-issue49-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    try:
        manifest = harness.prepare(SEED_49, N_49, work, "issue49")
        t_prep = time.monotonic() - t0
        harness.run_judge(work, IMAGE, per_case=120, timeout=7200, name=f"oracle-i49-{work.name[-8:]}")
        stack_doc = json.loads((work / "stack.json").read_text())
        res = harness.compare(manifest, stack_doc)
        res["seconds"] = {"prepare": round(t_prep, 1), "judge": stack_doc["total_seconds"],
                          "total": round(time.monotonic() - t0, 1)}
        yield work, manifest, stack_doc, res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _looser_lines(rows: list[dict]) -> str:
    return "\n".join(f"{r['case_id']}: {r['description'][:160]} -> {r['stack_component']}: "
                     f"{(r['stack_message'] or '')[:160]}" for r in rows[:20])


def test_plain_check_is_never_looser_than_the_real_stack(issue49):
    _work, _manifest, _stack, res = issue49
    generated = [r for r in res["cases"] if not r["control"]]
    assert len(generated) >= 2000 or N_49 < 2000
    for cls in harness.ISSUE49_CLASSES:
        assert res["by_class"].get(cls, {}).get("generated", 0) >= 20, (cls, res["by_class"])
    controls = [r for r in res["cases"] if r["control"]]
    assert all(r["class"] == "agree" and r["stack_verdict"] == "accept" for r in controls), controls
    looser = [r for r in generated if r["class"] == "ktdeploy-looser" and not gen.model_dependent(r["description"])]
    assert not looser, f"{len(looser)} case(s) plain check passes and the real stack refuses:\n{_looser_lines(looser)}"


def stack_check_picks(res: dict, controls: int = 3) -> tuple[list[str], list[str]]:
    """The model-dependent cases `check --stack` could be looser on: the real stack refuses and plain check passes
    (check --stack keeps every finding of plain check, so a case plain check refuses stays refused); plus a few
    the stack refuses and plain check refuses too, as controls of that premise."""
    dep = [r for r in res["cases"] if not r["control"] and gen.model_dependent(r["description"])
           and r["stack_verdict"] == "refuse"]
    return ([r["case_id"] for r in dep if r["check_valid"]],
            [r["case_id"] for r in dep if not r["check_valid"]][:controls])


def run_stack_checks(work, ids: list[str]) -> dict:
    out = work / "stack-check.json"
    argv = ["docker", "run", "--rm", "--name", f"oracle-i49c-{work.name[-8:]}", "--user", "0", "--memory", "8g",
            "--network", "none", "-v", f"{harness.REPO}:/src", "-w", "/src", "-e", "PYTHONPATH=/src",
            "--entrypoint", "python3", IMAGE, "-m", "tests.oracle.stack_check_batch",
            str((work / "cases").relative_to(harness.REPO)), str(out.relative_to(harness.REPO)), ",".join(ids)]
    subprocess.run(argv, check=True, timeout=3600, capture_output=True)
    return json.loads(out.read_text())


def test_check_stack_with_config_json_is_never_looser_on_model_dependent_classes(issue49):
    work, _manifest, _stack_doc, res = issue49
    by_id = {r["case_id"]: r for r in res["cases"]}
    candidates, controls = stack_check_picks(res)
    doc = run_stack_checks(work, candidates + controls)
    verdicts = {r["case_id"]: r for r in doc["results"]}
    assert all(not verdicts[c]["valid"] for c in controls), "check --stack passed a case plain check refuses"
    looser = [by_id[c] for c in candidates if verdicts[c]["valid"]]
    assert doc["option_present"], (f"ktdeploy check has no --model-config yet (branch judge); without the "
                                   f"config.json check --stack is looser on {len(looser)} of {len(candidates)} "
                                   f"model-dependent cases the stack refuses:\n{_looser_lines(looser)}")
    assert not looser, f"{len(looser)} case(s) check --stack passes and the stack refuses:\n{_looser_lines(looser)}"
