"""The image variants: one final Dockerfile stage per kt-kernel CPU build (core/variants.py), two stacks."""

from __future__ import annotations

from ktdeploy.core import variants as V

# Image variant -> the kt-kernel build its final stage pins (KT_KERNEL_CPU_VARIANT): the same name.
# Must agree with the Dockerfile's final stages; tests/unit/controller/images checks it does.
ISA_VARIANTS: dict[str, str] = {v.name: v.name for v in V.LADDER}
STACKS = ("full", "reduced")
DEFAULT_REPO = {"full": V.IMAGE_REPO, "reduced": V.REDUCED_IMAGE_REPO}

# Distributions whose versions the image's labels record (the cookbook §1.2 table).
LABELLED_DISTRIBUTIONS = (
    "torch", "ktransformers", "kt-kernel", "sglang-kt", "transformers-kt", "accelerate-kt",
    "peft-kt", "trl-kt", "llamafactory-kt", "tokenizers", "compressed-tensors", "pydantic",
)


def expand_isa(isa: str) -> list[str]:
    """'all' -> every build; otherwise the one named (an old alias names its build), validated."""
    if isa == "all":
        return list(ISA_VARIANTS)
    if not V.known(isa):
        from ktdeploy.core.errors import UsageError

        raise UsageError(f"unknown ISA variant {isa!r}", key="--isa",
                         fix=f"Use one of: {', '.join(ISA_VARIANTS)}, all.")
    return [V.canonical(isa)]


def image_tag(repo: str, isa: str) -> str:
    return f"{repo}:{V.canonical(isa)}"


def image_tags(repo: str, isa: str) -> list[str]:
    """The build's tag, then the old alias tags that name the same image (ktsft:avx512 -> the avx512_bf16 image)."""
    build = V.canonical(isa)
    return [image_tag(repo, build)] + [f"{repo}:{a}" for a, b in V.ALIASES.items() if b == build]
