"""One table: routed-expert weight setup -> kt-kernel training backend -> sglang-kt serving method.

Read by check (rules), doctor (checks/isa.py), plan (sizing) and serve (agent/serve.py); nothing else maps a
format to a backend or a method. Sources, all in the locked 0.7.2 wheels:

- training: kt-kernel sft/backend.py `normalize_sft_backend` (what `kt_backend: auto` becomes: INT8 for int8 —
  hardware-neutral, "AMXINT8" is only a deprecated spelling —, FP8, AMXBF16 for bf16) and sft/wrapper.py
  `kt_backend_map` (backend -> SFT method). The backend does not depend on the CPU; whether the loaded build
  can run the SFT method does (core/variants.py: only builds with SFT classes train).
- serving with a LoRA: sglang-kt srt/layers/moe/kt_ep_wrapper.py builds the KT wrapper in `sft` mode and maps
  `--kt-method` through `_KT_SFT_METHOD_BY_INFERENCE_METHOD` (AMXBF16|BF16 -> AMXBF16_SFT, FP8 -> AMXFP8_SFT,
  AMXINT8 -> AMXINT8_SFT, AMXINT4 -> AMXINT4_SFT; "INT8" is not a key: it fails there).
- serving without a LoRA (a full fine-tune): `--kt-method` goes unchanged to kt-kernel experts.py
  `KTMoEWrapper(mode="inference")`, which accepts only its INFERENCE_METHODS: BF16, not AMXBF16.
tools/serve_oracle.py checks every row against that code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ktdeploy.core.errors import UsageError


@dataclass(frozen=True)
class ExpertSetup:
    setup: str                  # ktdeploy's name (Recipe.weight_setup())
    train_backend: str          # kt-kernel normalize_sft_backend("auto", format)
    sft_method: str             # kt-kernel wrapper.py kt_backend_map[train_backend]
    serve_lora: str             # sglang-kt --kt-method when a KT LoRA is served
    serve_lora_sft: str         # what sglang-kt maps it to (_KT_SFT_METHOD_BY_INFERENCE_METHOD)
    serve_full: str | None      # --kt-method for a full fine-tune (inference mode); None: LoRA-only setup
    needs_amx: bool             # cookbook §1.1 (AMXINT4 needs AMX); not measured on the avx512_bf16 build
    spellings: tuple[str, ...] = ()   # other kt_backend values that select this setup (KTConfig.__post_init__)


TABLE: dict[str, ExpertSetup] = {e.setup: e for e in (
    ExpertSetup("bf16", "AMXBF16", "AMXBF16_SFT", "AMXBF16", "AMXBF16_SFT", "BF16", False,
                ("AMXBF16_SKIPLORA", "auto")),
    ExpertSetup("fp8", "FP8", "AMXFP8_SFT", "FP8", "AMXFP8_SFT", None, False, ("AMXFP8",)),
    ExpertSetup("int8", "INT8", "INT8_SFT", "AMXINT8", "AMXINT8_SFT", None, False,
                ("AMXINT8", "INT8_SKIPLORA", "AMXINT8_SKIPLORA")),
    ExpertSetup("int4", "AMXINT4", "AMXINT4_SFT", "AMXINT4", "AMXINT4_SFT", None, True, ("AMXINT4_SKIPLORA",)),
)}
# kt_backend values of setups kt-kernel has and ktdeploy neither trains nor serves (no row above).
OTHER_BACKENDS = {"RAWINT4": "rawint4", "AMXINT4_KGROUP": "rawint4", "MXFP4": "mxfp4"}
# kt_backend (lower case) -> setup: the table read backwards (core/recipe/expert_format.py)
SETUP_OF_BACKEND: dict[str, str] = {
    **{b.lower(): e.setup for e in TABLE.values() for b in (e.train_backend, *e.spellings)},
    **{b.lower(): setup for b, setup in OTHER_BACKENDS.items()}}
# Other spellings of the same setups (doctor's check names once called AMXINT4 weights "amxint4").
_ALIASES = {"amxint4": "int4"}
SETUPS = tuple(TABLE)


def lookup(setup: str) -> ExpertSetup | None:
    s = str(setup).strip().lower()
    return TABLE.get(_ALIASES.get(s, s))


def serve_method(setup: str, *, lora: bool) -> str | None:
    """sglang-kt --kt-method for serving ``setup`` with a LoRA adapter or as a full fine-tune (None: cannot)."""
    e = lookup(setup)
    if e is None:
        return None
    return e.serve_lora if lora else e.serve_full


def require_serve_method(setup: str, *, lora: bool) -> str:
    """serve_method, or the UsageError a user of `ktdeploy serve` reads when sglang-kt cannot serve ``setup`` so."""
    method = serve_method(setup, lora=lora)
    if method is None:
        what = "a LoRA adapter" if lora else "a full fine-tune (no LoRA)"
        raise UsageError(f"sglang-kt cannot serve {setup} experts as {what}",
                         key="train.kt_config.kt_expert_weight_format",
                         fix="full fine-tuning is BF16 only; FP8/INT8/AMXINT4 are served as a LoRA (--adapter)")
    return method
