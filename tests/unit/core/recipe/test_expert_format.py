"""One expert-weight setup decision (recipe/expert_format.py) shared by the recipe, resources and sizing."""

from __future__ import annotations

import pytest

from ktdeploy.core.checks.resources import recipe_weight_format
from ktdeploy.core.recipe.document import build
from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.loader import RawRecipe, Source
from ktdeploy.core.sizing.estimate import expert_format

CASES = [
    ({}, "bf16"),
    ({"kt_backend": "auto"}, "bf16"),
    ({"kt_backend": "AMXBF16"}, "bf16"),
    ({"kt_backend": "INT8"}, "int8"),          # kt-kernel: INT8 backend with no format means int8 weights
    ({"kt_backend": "AMXINT8"}, "int8"),
    ({"kt_backend": "int8"}, "int8"),
    ({"kt_backend": "FP8"}, "fp8"),
    ({"kt_backend": "AMXINT4"}, "int4"),
    ({"kt_backend": "amxint4"}, "int4"),
    ({"kt_expert_weight_format": "BF16"}, "bf16"),
    ({"kt_expert_weight_format": "int8"}, "int8"),
    ({"kt_backend": "auto", "kt_expert_weight_format": "fp8"}, "fp8"),
]


@pytest.mark.parametrize("kt,want", CASES)
def test_all_three_callers_agree(kt, want):
    assert expert_setup(kt) == want
    train = {"use_kt": True, "kt_config": kt}
    recipe = build(RawRecipe(doc={"train": train, "accelerate": {}}, source=Source(), path=None))
    assert recipe.weight_setup() == want
    assert recipe_weight_format(recipe)[0] == ("amxint4" if want == "int4" else want)
    assert expert_format(train) == want
