"""The one decision of which routed-expert weight setup a training section asks for.

Mirrors kt-kernel 0.7.2 `kt_kernel/sft/config.py` KTConfig.__post_init__: kt_expert_weight_format is
case-insensitive; when it is absent it follows kt_backend (INT8/AMXINT8 -> int8, FP8/AMXFP8 -> fp8,
AMXBF16/auto -> bf16). AMXINT4 is kt-kernel's generic INT4 backend (format None, converted weights at
kt_weight_path); ktdeploy calls that setup "int4" (cookbook §2.4.3). Used by recipe/document.py
(Recipe.weight_setup), checks/resources.py and sizing/estimate.py: one answer everywhere. Which setup a kt_backend
selects is core/kt_methods.py's table read backwards (SETUP_OF_BACKEND): one table, both directions.
"""

from __future__ import annotations

from typing import Any

from ktdeploy.core.kt_methods import SETUP_OF_BACKEND


def expert_setup(kt_config: Any) -> str:
    """bf16, fp8, int8, int4 (AMXINT4), rawint4, mxfp4, or the lower-cased unknown format as given."""
    kt = kt_config if isinstance(kt_config, dict) else {}
    backend = str(kt.get("kt_backend") or "auto").strip().lower()
    if SETUP_OF_BACKEND.get(backend) == "int4":   # AMXINT4 reads converted weights whatever the format says
        return "int4"
    fmt = kt.get("kt_expert_weight_format")
    if fmt is not None:
        return str(fmt).strip().lower()
    return SETUP_OF_BACKEND.get(backend, "bf16")
