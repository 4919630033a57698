"""The image variants: one final Dockerfile stage per CPU ISA, two stacks (full and reduced)."""

from __future__ import annotations

# Image variant -> the kt-kernel library its final stage pins (KT_KERNEL_CPU_VARIANT).
# Must agree with the Dockerfile's final stages; tests/unit/images checks it does.
ISA_VARIANTS: dict[str, str] = {
    "amx": "amx",
    "avx512": "avx512_bf16",
    "avx2": "avx2",
}
STACKS = ("full", "reduced")
DEFAULT_REPO = {"full": "ktsft", "reduced": "ktsft-reduced"}

# Distributions whose versions the image's labels record (the cookbook §1.2 table).
LABELLED_DISTRIBUTIONS = (
    "torch", "ktransformers", "kt-kernel", "sglang-kt", "transformers-kt", "accelerate-kt",
    "peft-kt", "trl-kt", "llamafactory-kt", "tokenizers", "compressed-tensors", "pydantic",
)


def expand_isa(isa: str) -> list[str]:
    """'all' -> every variant; otherwise the one named (validated)."""
    if isa == "all":
        return list(ISA_VARIANTS)
    if isa not in ISA_VARIANTS:
        from ktdeploy.core.errors import UsageError

        raise UsageError(f"unknown ISA variant {isa!r}", key="--isa",
                         fix=f"Use one of: {', '.join(ISA_VARIANTS)}, all.")
    return [isa]


def image_tag(repo: str, isa: str) -> str:
    return f"{repo}:{isa}"
