"""One format -> backend -> serve-method table (core/kt_methods.py): the recipe's backend -> setup decision
(core/recipe/expert_format.py) reads the same table backwards, so the two directions cannot disagree."""

import pytest

from ktdeploy.core import kt_methods
from ktdeploy.core.recipe.expert_format import expert_setup


@pytest.mark.parametrize("row", kt_methods.TABLE.values(), ids=lambda e: e.setup)
def test_each_rows_backends_select_its_setup(row):
    for backend in (row.train_backend, *row.spellings):
        assert expert_setup({"kt_backend": backend}) == row.setup
        assert expert_setup({"kt_backend": backend.lower()}) == row.setup


def test_the_backwards_table_is_kt_kernels_ktconfig_rule():
    # kt-kernel 0.7.2 KTConfig.__post_init__ (the mapping ktdeploy mirrored before the table held it)
    assert kt_methods.SETUP_OF_BACKEND == {
        "int8": "int8", "amxint8": "int8", "int8_skiplora": "int8", "amxint8_skiplora": "int8",
        "fp8": "fp8", "amxfp8": "fp8", "amxbf16": "bf16", "amxbf16_skiplora": "bf16",
        "amxint4": "int4", "amxint4_skiplora": "int4", "auto": "bf16",
        "rawint4": "rawint4", "amxint4_kgroup": "rawint4", "mxfp4": "mxfp4"}
    assert expert_setup({}) == "bf16" and expert_setup({"kt_backend": "AMXINT4", "kt_expert_weight_format": "bf16"}) == "int4"
