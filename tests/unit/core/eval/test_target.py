"""core/eval/target.py: model names, the URL this machine reaches, the evaluation set of a recipe."""

import pytest

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.eval import target as tg
from ktdeploy.core.recipe import load_recipe

TINY = "recipes/tiny-moe-lora.yaml"


def _recipe(*sets):
    return load_recipe(TINY, list(sets))


def test_a_lora_is_model_colon_lora_beside_its_base_a_merge_has_no_base():
    m = tg.models(_recipe("deploy.serve.lora_name=tiny-lora"))
    assert (m.tuned, m.base) == ("tiny-qwen3-moe:tiny-lora", "tiny-qwen3-moe")
    merged = tg.models(_recipe("deploy.serve.merge=true"))
    assert merged.base is None and "merge" in merged.base_why and merged.tuned == "tiny-qwen3-moe"


@pytest.mark.parametrize("host, local, addr, url", [
    ("127.0.0.1", True, "localhost", "http://127.0.0.1:30000/v1"),
    ("0.0.0.0", True, "localhost", "http://127.0.0.1:30000/v1"),
    ("0.0.0.0", False, "gpu01", "http://gpu01:30000/v1"),
    ("10.1.2.3", False, "gpu01", "http://10.1.2.3:30000/v1"),
    ("\"::\"", False, "fe80::1", "http://[fe80::1]:30000/v1"),
    ("127.0.0.1", False, "gpu01", None),
    ("localhost", False, "gpu01", None),
])
def test_the_controller_never_mistakes_its_own_loopback_for_the_hosts(host, local, addr, url):
    got, why = tg.controller_url(_recipe(f"deploy.serve.host={host}"), local=local, host_address=addr)
    assert got == url
    assert (why == "") == (url is not None)
    if url is None:
        assert "ssh -N -L 30000:127.0.0.1:30000" in why


def test_the_evaluation_set_holdout_then_dataset_then_llamafactorys_eval_dataset():
    held = tg.eval_data(_recipe("deploy.eval.holdout=0.1"))
    assert held.source == "holdout" and held.data_dir.endswith("-holdout") and held.datasets == ("tiny_sft.holdout",)
    named = tg.eval_data(_recipe("deploy.eval.dataset=other"))
    assert named.source == "deploy.eval.dataset" and named.datasets == ("other",)
    lf = tg.eval_data(_recipe("deploy.eval.max_samples=5", "train.eval_dataset=a,b"))
    assert lf.datasets == ("a", "b") and lf.info.endswith("/dataset_info.json")
    with pytest.raises(RecipeError) as e:
        tg.eval_data(_recipe("deploy.eval.max_samples=5"))
    assert e.value.key == "deploy.eval"
