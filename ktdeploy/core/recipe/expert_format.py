"""The one decision of which routed-expert weight setup a training section asks for.

Mirrors kt-kernel 0.7.2 `kt_kernel/sft/config.py` KTConfig.__post_init__: kt_expert_weight_format is
case-insensitive; when it is absent it follows kt_backend (INT8/AMXINT8 -> int8, FP8/AMXFP8 -> fp8,
AMXBF16/auto -> bf16). AMXINT4 is kt-kernel's generic INT4 backend (format None, converted weights at
kt_weight_path); ktdeploy calls that setup "int4" (cookbook §2.4.3). Used by recipe/document.py
(Recipe.weight_setup), checks/resources.py and sizing/estimate.py: one answer everywhere.
"""

from __future__ import annotations

from typing import Any

_FROM_BACKEND = {"int8": "int8", "amxint8": "int8", "int8_skiplora": "int8", "amxint8_skiplora": "int8",
                 "fp8": "fp8", "amxfp8": "fp8", "amxbf16": "bf16", "amxbf16_skiplora": "bf16",
                 "amxint4": "int4", "amxint4_skiplora": "int4", "auto": "bf16",
                 "rawint4": "rawint4", "amxint4_kgroup": "rawint4", "mxfp4": "mxfp4"}


def expert_setup(kt_config: Any) -> str:
    """bf16, fp8, int8, int4 (AMXINT4), rawint4, mxfp4, or the lower-cased unknown format as given."""
    kt = kt_config if isinstance(kt_config, dict) else {}
    backend = str(kt.get("kt_backend") or "auto").strip().lower()
    if backend in ("amxint4", "amxint4_skiplora"):
        return "int4"
    fmt = kt.get("kt_expert_weight_format")
    if fmt is not None:
        return str(fmt).strip().lower()
    return _FROM_BACKEND.get(backend, "bf16")
