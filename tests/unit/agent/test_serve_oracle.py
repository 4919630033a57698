"""The serving oracle, pure level: sglang-kt's and kt-kernel's deciding code from the locked wheels (read with ast,
run as written; tools/serve_oracle.py) judges the argv of every shipped recipe, and checks core/kt_methods.py.

Needs the two locked wheels (.wheelhouse/full, $KTDEPLOY_ORACLE_WHEELHOUSE, or pip download into
.cache/serve-oracle on first use); skipped only when none can be had.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ktdeploy.core import kt_methods

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import serve_oracle as so  # noqa: E402


@pytest.fixture(scope="module")
def code():
    try:
        return so.real_code()
    except (SystemExit, Exception) as err:  # noqa: BLE001 - no wheel: say so, do not pass silently
        pytest.skip(f"sglang-kt / kt-kernel 0.7.2 wheels not available: {err}")


def test_every_shipped_recipe_is_served_with_a_method_the_real_code_accepts(code):
    results = [so.pure_verdict(c, code) for c in so.cases()]
    assert {c.recipe for c in results} == set(so.RECIPES)
    wrong = {c.name: c.verdicts for c in results if c.ok is not c.expect_ok}
    assert not wrong
    full = [c for c in results if not c.lora]
    assert [c.ok for c in full] == [True, False]   # BF16 accepted; the pre-fix AMXBF16 refused by kt-kernel
    assert "not supported for inference mode" in full[1].verdicts["refused"]


def test_the_method_table_is_the_real_stack(code):
    for e in kt_methods.TABLE.values():
        assert code.map_kt_method_to_sft_method(e.serve_lora) == e.serve_lora_sft   # sglang-kt's LoRA mapping
        code.validate_mode_method("sft", e.serve_lora_sft)
        code.validate_mode_method("sft", e.sft_method)                              # what training runs
        if e.serve_full is not None:
            code.validate_mode_method("inference", e.serve_full)
    # why a LoRA on INT8 experts is served as AMXINT8 although kt-kernel trains it as INT8: sglang-kt knows no INT8
    with pytest.raises(ValueError, match="SFT-compatible"):
        code.map_kt_method_to_sft_method("INT8")
    with pytest.raises(ValueError, match="not supported for inference mode"):
        code.validate_mode_method("inference", "AMXBF16")


def test_a_lora_needs_max_running_requests_of_two(code):
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="max-running-requests >= 2"):
        code.validate_max_running_requests(SimpleNamespace(kt_lora_path=None, kt_expert_lora_path="/x",
                                                           max_running_requests=1))
