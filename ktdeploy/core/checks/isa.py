"""ISA verdicts (cookbook §1.1, kt-kernel's variant picker): which image variant and which kt_backend.

kt-kernel ships variants avx2 / avx512_* / amx and picks one from /proc/cpuinfo flags; ktdeploy images
come in three variants (amx, avx512, avx2). Flags are necessary, not sufficient for AMX: when the AMX
probe ran and found tiles unusable, AMX does not count (see checks/amx.py).
"""

from __future__ import annotations

from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.facts.host import CpuFacts, HostFacts

AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
AVX2_FLAGS = ("avx2", "fma")
FP8_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "avx512vbmi")  # cookbook §1.1: native FP8
VARIANTS = ("amx", "avx512", "avx2")
WEIGHT_FORMATS = ("bf16", "fp8", "int8", "amxint4")


def _cpu(x) -> CpuFacts:
    return x.cpu if isinstance(x, HostFacts) else x


def amx_usable(x) -> bool | None:
    """AMX flags listed and, when the probe ran, a tile multiply gave the right result.
    None when flags are listed but the probe did not run (unproven)."""
    cpu = _cpu(x)
    if not cpu.has(*AMX_FLAGS):
        return False
    if isinstance(x, HostFacts) and x.probes.amx.ran:
        return bool(x.probes.amx.permission and x.probes.amx.tile_exec and x.probes.amx.correct)
    return None


def isa_level(x) -> str | None:
    cpu = _cpu(x)
    if cpu.has(*AVX512_FLAGS):
        return "avx512"
    if cpu.has(*AVX2_FLAGS):
        return "avx2"
    return None


def best_variant(x) -> str | None:
    """'amx' | 'avx512' | 'avx2' | None for CpuFacts or HostFacts (with HostFacts the AMX probe counts)."""
    level = isa_level(x)
    if level == "avx512" and amx_usable(x) is not False:
        return "amx"
    return level


def kt_kernel_variant(x) -> str | None:
    """The kt-kernel variant library its picker would choose from the flags (what KT_KERNEL_CPU_VARIANT names)."""
    cpu = _cpu(x)
    if cpu.has(*AMX_FLAGS) and cpu.has(*AVX512_FLAGS):
        return "amx"
    if cpu.has(*AVX512_FLAGS):
        for flag, name in (("avx512_bf16", "avx512_bf16"), ("avx512vbmi", "avx512_vbmi"), ("avx512_vnni", "avx512_vnni")):
            if cpu.has(flag):
                return name
        return "avx512_base"
    return "avx2" if cpu.has(*AVX2_FLAGS) else None


def _rank(v: str | None) -> int:
    return {"avx2": 1, "avx512": 2, "amx": 3}.get(v or "", 0)


def variant_check(x, variant: str) -> CheckResult:
    """Can this CPU run image variant ``variant``? Refuses a variant above the host's ISA, naming the right one."""
    best = best_variant(x)
    data = {"requested": variant, "best": best, "kt_kernel_variant": kt_kernel_variant(x)}
    if variant not in VARIANTS:
        return CheckResult(name="cpu.variant", status="fail", detail=f"unknown image variant {variant!r}",
                           fix=f"Use one of {', '.join(VARIANTS)} (this CPU: {best or 'none'}).", data=data)
    if best is None:
        return CheckResult(name="cpu.variant", status="fail",
                           detail="CPU has neither AVX2+FMA nor AVX512: no kt-kernel variant can run",
                           fix="Use an x86_64 CPU with AVX2 at least; in a VM expose the host CPU model "
                               "(libvirt host-passthrough / qemu -cpu host).", data=data)
    if _rank(variant) > _rank(best):
        why = ("AMX flags are listed but AMX is not usable here (see cpu.amx.*)"
               if variant == "amx" and _cpu(x).has(*AMX_FLAGS) else f"this CPU lacks {variant.upper()}")
        return CheckResult(name="cpu.variant", status="fail",
                           detail=f"image variant {variant!r} cannot run: {why}; best variant here is {best!r}",
                           fix=f"Use the ktsft:{best} image (deploy.image: {best} or auto).", data=data)
    if _rank(variant) < _rank(best):
        return CheckResult(name="cpu.variant", status="warn",
                           detail=f"image variant {variant!r} runs here but {best!r} is faster on this CPU",
                           fix=f"Use deploy.image: {best} (or auto).", data=data)
    return CheckResult(name="cpu.variant", status="pass", detail=f"image variant {variant!r} matches this CPU",
                       data=data)


def auto_backend(x, weight_format: str) -> str | None:
    """What `kt_backend: auto` resolves to for the expert weight format on this CPU (None: cannot run).

    Cookbook §1.1 / A.3.2: BF16 picks AMXBF16 with AMX, else the AVX512/AVX2 BF16 path; native FP8 needs
    AVX512F+BF16+VNNI+VBMI; INT8 picks AMX-INT8 or AVX512-VNNI; AMXINT4 needs AMX.
    """
    cpu = _cpu(x)
    fmt = weight_format.lower()
    amx = amx_usable(x) is not False and cpu.has(*AMX_FLAGS) and cpu.has(*AVX512_FLAGS)
    if fmt == "bf16":
        if amx:
            return "AMXBF16"
        return "BF16" if isa_level(x) else None
    if fmt == "fp8":
        return "FP8" if cpu.has(*FP8_FLAGS) else None
    if fmt == "int8":
        if amx:
            return "AMXINT8"
        return "INT8" if cpu.has("avx512f", "avx512_vnni") else None
    if fmt == "amxint4":
        return "AMXINT4" if amx else None
    raise ValueError(f"unknown expert weight format {weight_format!r}")


_FORMAT_NEEDS = {
    "bf16": "AVX2 at least (AMX for the AMXBF16 fast path)",
    "fp8": "AVX512F + AVX512_BF16 + AVX512_VNNI + AVX512_VBMI",
    "int8": "AMX-INT8 or AVX512-VNNI",
    "amxint4": "AMX (amx_tile, amx_int8, amx_bf16) that actually executes",
}


def weight_format_check(x, weight_format: str, backend: str = "auto") -> CheckResult:
    """recipe.weight_format_vs_isa: can the recipe's expert weight format / backend run on this CPU?"""
    fmt = weight_format.lower()
    chosen = auto_backend(x, fmt)
    data = {"weight_format": fmt, "kt_backend": backend, "auto_resolves_to": chosen, "best_variant": best_variant(x)}
    name = "recipe.weight_format_vs_isa"
    if chosen is None:
        alt = [f for f in WEIGHT_FORMATS if auto_backend(x, f)]
        return CheckResult(name=name, status="fail",
                           detail=f"expert weight format {fmt} needs {_FORMAT_NEEDS[fmt]}, which this CPU lacks",
                           fix=f"Use a host with that ISA, or a weight format this CPU runs: {', '.join(alt) or 'none'}. "
                               "In a VM/container, check that flags are not hidden (layer.cpu_flags).", data=data)
    forced = backend.upper() if backend and backend.lower() != "auto" else None
    if forced and forced.startswith("AMX") and not chosen.startswith("AMX"):
        return CheckResult(name=name, status="fail",
                           detail=f"kt_backend {forced} forced but AMX is not usable here; auto would pick {chosen}",
                           fix="Set kt_config.kt_backend: auto (cookbook A.3.2: never force a backend the CPU lacks).",
                           data=data)
    if fmt == "bf16" and not chosen.startswith("AMX"):
        return CheckResult(name=name, status="warn",
                           detail=f"bf16 experts run on {chosen} ({isa_level(x)}); AMX would be much faster",
                           fix="Fine for small runs; for big models prefer an AMX CPU (Sapphire Rapids or newer).",
                           data=data)
    return CheckResult(name=name, status="pass", detail=f"{fmt} experts: kt_backend auto -> {chosen}", data=data)


def isa_checks(facts: HostFacts) -> list[CheckResult]:
    cpu = facts.cpu
    out = []
    if cpu.has(*AVX2_FLAGS):
        out.append(CheckResult(name="cpu.isa.avx2", status="pass", detail="avx2 and fma listed", layer=facts.layer))
    else:
        out.append(CheckResult(name="cpu.isa.avx2", status="fail", layer=facts.layer,
                               detail=f"avx2/fma missing from /proc/cpuinfo ({cpu.model_name or 'unknown CPU'})",
                               fix="kt-kernel needs AVX2 at least. In a VM use CPU model passthrough "
                                   "(libvirt <cpu mode='host-passthrough'/>, qemu -cpu host)."))
    have = [f for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi")
            if cpu.has(f)]
    exec_note = ""
    amx_probe = facts.probes.amx
    if amx_probe.ran and amx_probe.avx512f_exec is not None:
        exec_note = (f"; executed: avx512f={amx_probe.avx512f_exec}, avx512_bf16={amx_probe.avx512_bf16_exec}, "
                     f"avx512_vnni={amx_probe.avx512_vnni_exec}")
    if cpu.has(*AVX512_FLAGS):
        if amx_probe.ran and amx_probe.avx512f_exec is False:
            out.append(CheckResult(name="cpu.isa.avx512", status="fail", layer=facts.layer,
                                   detail="avx512 flags listed but an AVX512 instruction faulted" + exec_note,
                                   fix="The hypervisor or kernel disables AVX512 state: enable it, or use ktsft:avx2."))
        else:
            out.append(CheckResult(name="cpu.isa.avx512", status="pass", layer=facts.layer,
                                   detail="listed: " + " ".join(have) + exec_note, data={"flags": have}))
    elif amx_probe.ran and amx_probe.avx512f_exec:
        out.append(CheckResult(name="cpu.isa.avx512", status="fail", layer=facts.layer,
                               detail="the CPU executes AVX512 (CPUID + a real instruction) but /proc/cpuinfo hides "
                                      "it; kt-kernel reads /proc/cpuinfo and would fall back to AVX2" + exec_note,
                               fix="Remove the /proc/cpuinfo override (bind mount or lxcfs) from this container.",
                               data={"flags": have}))
    else:
        out.append(CheckResult(name="cpu.isa.avx512", status="warn", layer=facts.layer,
                               detail="no AVX512 (" + (" ".join(have) or "none listed") + "): kt-kernel falls back "
                                      "to AVX2, much slower; native FP8 needs AVX512",
                               fix="Use an AVX512 CPU for real runs; in a VM check that the CPU model exposes AVX512 "
                                   "(host-passthrough).", data={"flags": have}))
    best = best_variant(facts)
    if best:
        out.append(CheckResult(name="cpu.variant", status="pass", layer=facts.layer,
                               detail=f"image variant: ktsft:{best} (kt-kernel picks {kt_kernel_variant(facts)} "
                                      "from the flags)",
                               data={"best": best, "kt_kernel_variant": kt_kernel_variant(facts)}))
    else:
        out.append(variant_check(facts, "avx2"))
    if kt_kernel_variant(facts) == "amx" and best != "amx":
        out.append(CheckResult(name="cpu.kt_kernel_variant", status="fail", layer=facts.layer,
                               detail="kt-kernel will pick its amx library from the flags, but AMX is unusable here",
                               fix=f"Set KT_KERNEL_CPU_VARIANT=avx512_bf16 (the ktsft:{best} image does) and use "
                                   f"deploy.image: {best}."))
    return out
