"""The kt-kernel CPU builds, one registry: the ladder, what each needs, what each can run, its image tag.

kt-kernel 0.7.2 ships six builds of its extension in one wheel (kt_kernel/_cpu_detect.py, `_VARIANT_LEVEL` and
`variant_requirements`). It picks the best one whose /proc/cpuinfo flags are all listed (a flag also matches
without its underscores: `avx512_vbmi` ~ `avx512vbmi`) and refuses a loaded build above the detected one,
unless KT_KERNEL_CPU_VARIANT names one, which it trusts. Each ktsft image pins one build (its tag is the
build's name), so the pin must never exceed what this CPU proves: flags, plus the instructions the build
needs actually executed (ktdeploy/probes/amx_probe.c).

Which builds can train (kt-kernel's SFT classes, `kt_kernel_ext.moe.*_SFT_MOE`, counted in each build of the
locked wheel by tools/kt_builds.py -> docs/cpu-builds.md): only `amx` and `avx512_bf16` carry them; every SFT
method (AMXBF16_SFT, AMXFP8_SFT, INT8_SFT — "hardware-neutral" between AMX-INT8 and the avx512_bf16 build's
VNNI kernel —, AMXINT4_SFT) and LoRA serving (sglang-kt builds its KT wrapper in SFT mode for a LoRA) need them.
The lower builds serve a full fine-tune (inference mode, BF16) and train nothing.

Every variant name ktdeploy writes comes from here (tests/unit/core/test_variant_registry.py fails on a
literal elsewhere), and so does the images' repository name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
AVX512_BASE_FLAGS = ("avx512f", "avx512bw")
VNNI_FLAG, VBMI_FLAG, BF16_FLAG = "avx512_vnni", "avx512_vbmi", "avx512_bf16"
AVX2_FLAG = "avx2"
# The AVX512 flags doctor lists (informational; kt-kernel's ladder reads only the ones above).
AVX512_LISTED = ("avx512f", "avx512bw", "avx512dq", "avx512vl", VNNI_FLAG, VBMI_FLAG, BF16_FLAG)


@dataclass(frozen=True)
class Variant:
    name: str                        # kt-kernel's build name = KT_KERNEL_CPU_VARIANT = the image tag
    level: int                       # kt-kernel _VARIANT_LEVEL
    requires: tuple[str, ...]        # /proc/cpuinfo flags (kt-kernel variant_requirements)
    executes: tuple[str, ...]        # AmxProbe fields that must be True when the probe ran
    sft: bool                        # carries kt-kernel's SFT classes: can train, can serve a LoRA
    cpus: str                        # who should pick it

    @property
    def tag(self) -> str:
        return self.name


_AVX512_EXEC = ("avx512f_exec", "avx512bw_exec")
LADDER: tuple[Variant, ...] = (
    Variant("amx", 5, (*AMX_FLAGS, *AVX512_BASE_FLAGS, VNNI_FLAG, VBMI_FLAG, BF16_FLAG),
            (*_AVX512_EXEC, "avx512_vnni_exec", "avx512_vbmi_exec", "avx512_bf16_exec", "permission", "tile_exec",
             "correct", "amx_bf16_exec", "amx_bf16_correct"), True,
            "Intel Sapphire Rapids, Emerald Rapids, Granite Rapids (AMX usable: kernel >= 5.16, tiles not hidden)"),
    Variant("avx512_bf16", 4, (*AVX512_BASE_FLAGS, VNNI_FLAG, VBMI_FLAG, BF16_FLAG),
            (*_AVX512_EXEC, "avx512_vnni_exec", "avx512_vbmi_exec", "avx512_bf16_exec"), True,
            "AMD Zen 4 / Zen 5 (EPYC 9004/9005), and AMX CPUs whose VM or kernel hides AMX"),
    Variant("avx512_vbmi", 3, (*AVX512_BASE_FLAGS, VNNI_FLAG, VBMI_FLAG),
            (*_AVX512_EXEC, "avx512_vnni_exec", "avx512_vbmi_exec"), False, "Intel Ice Lake-SP (3rd gen Xeon)"),
    Variant("avx512_vnni", 2, (*AVX512_BASE_FLAGS, VNNI_FLAG), (*_AVX512_EXEC, "avx512_vnni_exec"), False,
            "Intel Cascade Lake and Cooper Lake (2nd gen / 3rd gen H Xeon)"),
    Variant("avx512_base", 1, AVX512_BASE_FLAGS, _AVX512_EXEC, False, "Intel Skylake-SP (1st gen Xeon Scalable)"),
    Variant("avx2", 0, (AVX2_FLAG,), (), False, "AVX2 only: AMD Zen 2 / Zen 3, Intel Haswell and Broadwell"),
)
AMX, AVX2 = LADDER[0].name, LADDER[-1].name     # the top and the floor of the ladder
BY_NAME = {v.name: v for v in LADDER}
NAMES = tuple(v.name for v in LADDER)
# Tags of earlier ktdeploy releases: `avx512` pinned the avx512_bf16 build on every AVX512 host.
ALIASES = {"avx512": "avx512_bf16"}
AUTO = "auto"
TRAINING = tuple(v.name for v in LADDER if v.sft)
# The images' repository: `ktdeploy image build`'s default and deploy.image_repo's; the reduced stack's beside it.
# Its one home (tests/unit/core/test_image_repo.py fails on the name written as a default elsewhere in ktdeploy/).
IMAGE_REPO = "ktsft"
REDUCED_IMAGE_REPO = f"{IMAGE_REPO}-reduced"


def image(build: str) -> str:
    """The default repository's image of a build, e.g. ktsft:amx."""
    return f"{IMAGE_REPO}:{build}"


def get(name: str) -> Variant:
    """The Variant for a name or an old alias (KeyError when neither)."""
    return BY_NAME[ALIASES.get(name, name)]


def known(name: object) -> bool:
    return isinstance(name, str) and (name in BY_NAME or name in ALIASES)


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def _listed(flags: set[str], flag: str) -> bool:
    # kt-kernel: `flag not in cpu_flags and flag.replace("_", "") not in cpu_flags` means missing
    return flag in flags or flag.replace("_", "") in flags


def detect(flags: Iterable[str]) -> Variant:
    """kt-kernel's own choice from /proc/cpuinfo's first `flags` line (avx2 when nothing else matches)."""
    fl = {f.lower() for f in flags}
    for v in LADDER:
        if all(_listed(fl, f) for f in v.requires):
            return v
    return LADDER[-1]


def has_flags(flags: Iterable[str], *wanted: str) -> bool:
    fl = {f.lower() for f in flags}
    return all(_listed(fl, f) for f in wanted)


def failed_exec(v: Variant, probe: Any) -> list[str]:
    """Probe fields this build needs that the probe ran and found False (empty when proven or not run)."""
    if probe is None or not getattr(probe, "ran", False):
        return []
    return [f for f in v.executes if getattr(probe, f, None) is False]


def unproven_exec(v: Variant, probe: Any) -> list[str]:
    """Probe fields this build needs that the probe did not establish (None)."""
    if probe is None or not getattr(probe, "ran", False):
        return list(v.executes)
    return [f for f in v.executes if getattr(probe, f, None) is None]


def proven(flags: Iterable[str], probe: Any = None) -> Variant | None:
    """The best build whose flags are listed and whose instructions did not fault in the probe: kt-kernel's
    detection, stepped down while the probe shows an instruction the build needs cannot run here. None when
    not even AVX2 is listed (kt-kernel would still load its avx2 build, and crash)."""
    fl = list(flags)
    det = detect(fl)
    for v in LADDER[LADDER.index(det):]:
        if has_flags(fl, *v.requires) and not failed_exec(v, probe):
            return v
    return None


def above(a: str, b: str) -> bool:
    return get(a).level > get(b).level
