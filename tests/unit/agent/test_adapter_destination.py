"""The adapter `up` plans is one `ktdeploy convert` accepts (one rule, ktdeploy.core.adapter_layout), and a full
fine-tune plans no CONVERT and serves its trained weights."""

from __future__ import annotations

import pytest

from ktdeploy.agent.convert import ConvertError, convert
from ktdeploy.core.adapter_layout import destination_problem
from ktdeploy.core.facts.host import CpuFacts, DockerFacts, HostFacts
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import UpOptions, build_plan
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.recipe import builtin_recipe, load_recipe
from tests.unit.agent.test_convert import make_output

AVX512 = ["avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512vbmi"]
FACTS = HostFacts(cpu=CpuFacts(flags=sorted(AVX512)),
                  docker=DockerFacts(present=True, reachable=True, server_version="24.0", runtimes=["runc", "nvidia"]))


def _plan(recipe):
    return build_plan(recipe, FACTS, JobState(home="/home/u", image_id="sha256:abc"), UpOptions(host="gpu01", run_id="r1"))


def _steps(plan):
    return {s.id: s for _, s in plan.steps()}


def test_planned_adapter_is_accepted_by_the_real_converter(tmp_path, st_writer):
    vol = tmp_path / "output"
    out = vol / "tiny-moe-lora"
    recipe = load_recipe(builtin_recipe(), [f"deploy.volumes.output={vol}", f"train.output_dir={out}"])
    plan = _plan(recipe)
    argv = _steps(plan)["convert.adapter"].argv
    planned = argv[argv.index("-o") + 1]
    assert planned == plan.adapter_dir == JobLayout(str(out)).adapter_dir == f"{out}-sglang"
    assert destination_problem(str(out), planned) is None
    make_output(out, st_writer)
    s = convert(argv[argv.index("-o") - 1], planned)  # the very arguments the CONVERT container gets
    assert s.output_dir == planned and (out.parent / "tiny-moe-lora-sglang" / "adapter_config.json").is_file()
    # the serving container sees it: the sibling lies under the mounted output volume
    create = _steps(plan)["serve.create"].argv
    assert create[-2:] == ("--adapter", planned)


@pytest.mark.parametrize("dst", ["out", "out/sglang_adapter", "out/checkpoint-5/x", "."])
def test_convert_refuses_inside_or_around_the_training_output(tmp_path, st_writer, dst):
    make_output(tmp_path / "out" / "checkpoint-5", st_writer)
    with pytest.raises(ConvertError) as err:
        convert(tmp_path / "out", tmp_path / dst)
    assert "must lie outside the training output" in str(err.value)
    assert err.value.fix.endswith("out-sglang")


def test_output_dir_equal_to_the_volume_is_refused_before_training():
    from ktdeploy.core.errors import RecipeError

    recipe = load_recipe(builtin_recipe(), ["train.output_dir=/srv/ktdeploy/output"])
    with pytest.raises(RecipeError) as err:
        _plan(recipe)
    assert "outside deploy.volumes.output" in str(err.value)


def test_full_finetune_converts_to_the_sibling_and_serves_it_as_weights():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "recipes" / "glm-4.5-air-bf16-full.yaml"
    plan = _plan(load_recipe(path, []))
    conv = _steps(plan)["convert.adapter"].argv
    assert conv[-3:] == (plan.output_dir, "-o", f"{plan.output_dir}-sglang")
    create = _steps(plan)["serve.create"].argv
    assert create[-2:] == ("--weights", f"{plan.output_dir}-sglang")   # the regrouped model, not the base
    assert "--adapter" not in create
    assert not any("model=" in n and ":" in n.split("model=")[1] for n in plan.notes)  # no MODEL:LORA


def test_convert_never_overwrites_an_adapter_and_says_so_with_exit_6(tmp_path, st_writer):
    from ktdeploy.core.errors import OverwriteRefused

    make_output(tmp_path / "out" / "checkpoint-5", st_writer)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "adapter_config.json").write_text("mine")
    with pytest.raises(OverwriteRefused, match="never overwrites an adapter") as err:
        convert(tmp_path / "out", tmp_path / "taken")
    assert err.value.exit_code == 6 and "-o" in err.value.fix
    assert (tmp_path / "taken" / "adapter_config.json").read_text() == "mine"
