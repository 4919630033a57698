"""ISA verdicts: which kt-kernel build (= ktsft image tag) this CPU proves, and what that build can run.

The choice is kt-kernel's own (core/variants.py: its ladder and flag matching on /proc/cpuinfo), then stepped
down while the execution probe (checks/amx.py, ktdeploy/probes/amx_probe.c) shows an instruction the build needs
faulting here: flags are necessary, not sufficient. A build above that is never pinned.
"""

from __future__ import annotations

from collections.abc import Iterable

from ktdeploy.core import kt_methods
from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.facts.host import AmxProbe, CpuFacts, HostFacts

AMX_FLAGS = V.AMX_FLAGS
AVX2_FLAGS = (V.AVX2_FLAG, "fma")
AVX512_FLAGS = V.AVX512_BASE_FLAGS
FP8_FLAGS = ("avx512f", V.BF16_FLAG, V.VNNI_FLAG, V.VBMI_FLAG)  # cookbook §1.1: native FP8
WEIGHT_FORMATS = kt_methods.SETUPS + ("amxint4",)
IMAGE_FIX_FLAGS = "In a VM expose the host CPU model (libvirt host-passthrough / qemu -cpu host)."


def _cpu(x: HostFacts | CpuFacts) -> CpuFacts:
    return x.cpu if isinstance(x, HostFacts) else x


def _probe(x: HostFacts | CpuFacts) -> AmxProbe | None:
    return x.probes.amx if isinstance(x, HostFacts) else None


def has(x: HostFacts | CpuFacts, *flags: str) -> bool:
    """kt-kernel's flag test (a flag also matches without underscores)."""
    return V.has_flags(_cpu(x).flags, *flags)


def amx_usable(x: HostFacts | CpuFacts) -> bool | None:
    """AMX flags listed and, when the probe ran, a tile multiply gave the right result.
    None when flags are listed but the probe did not run (unproven)."""
    if not has(x, *AMX_FLAGS):
        return False
    p = _probe(x)
    if p is not None and p.ran:
        return not V.failed_exec(V.get(V.AMX), p) and bool(p.permission and p.tile_exec and p.correct)
    return None


def kt_kernel_variant(x: HostFacts | CpuFacts) -> str:
    """The build kt-kernel picks from this /proc/cpuinfo when nothing pins it."""
    return V.detect(_cpu(x).flags).name


def best_variant(x: HostFacts | CpuFacts) -> str | None:
    """The best build this CPU proves (flags + the probe, when it ran); None when not even AVX2 is listed."""
    v = V.proven(_cpu(x).flags, _probe(x))
    return v.name if v else None


def _tags(names: Iterable[str]) -> str:
    return ", ".join(V.image(n) for n in names)


def variant_check(x: HostFacts | CpuFacts, variant: str) -> CheckResult:
    """Can this CPU run image variant ``variant``? Refuses a build above what the CPU proves, naming the right one."""
    best = best_variant(x)
    data = {"requested": variant, "best": best, "kt_kernel_variant": kt_kernel_variant(x)}
    if not V.known(variant):
        return CheckResult(name=CheckName.CPU_VARIANT, status="fail", detail=f"unknown image variant {variant!r}",
                           fix=f"Use one of {', '.join(V.NAMES)} or auto (this CPU: {best or 'none'}).", data=data)
    v = V.get(variant)
    data["requested_build"] = v.name
    if best is None:
        return CheckResult(name=CheckName.CPU_VARIANT, status="fail",
                           detail="CPU lists no AVX2: no kt-kernel build can run", data=data,
                           fix="Use an x86_64 CPU with AVX2 at least. " + IMAGE_FIX_FLAGS)
    b = V.get(best)
    alias = f" (the old tag {variant!r} is the {v.name} build)" if variant in V.ALIASES else ""
    if v.level > b.level:
        missing = [f for f in v.requires if not has(x, f)]
        faulted = V.failed_exec(v, _probe(x))
        why = (f"this CPU does not list {' '.join(missing)}" if missing else
               f"the probe shows {', '.join(faulted)} failing here (flags are listed, the instructions do not run)")
        return CheckResult(name=CheckName.CPU_VARIANT, status="fail", data=data,
                           detail=f"image variant {variant!r}{alias} cannot run: {why}; kt-kernel's {v.name} build "
                                  f"needs {' '.join(v.requires)}; this CPU proves {best!r}",
                           fix=f"Use the {V.image(str(best))} image (deploy.image: {best} or auto).")
    if v.level < b.level:
        note = "" if v.sft or not b.sft else "; it cannot train (no SFT kernels in that build)"
        return CheckResult(name=CheckName.CPU_VARIANT, status="warn", data=data,
                           detail=f"image variant {variant!r}{alias} runs here but {best!r} is faster on this CPU"
                                  + note,
                           fix=f"Use deploy.image: {best} (or auto).")
    return CheckResult(name=CheckName.CPU_VARIANT, status="pass",
                       detail=f"image variant {variant!r}{alias} is the best build this CPU proves", data=data)


def auto_backend(x: HostFacts | CpuFacts, weight_format: str) -> str | None:
    """What `kt_backend: auto` resolves to (kt-kernel normalize_sft_backend: it does not depend on the CPU), or
    None when the build this CPU proves cannot run that SFT method (no SFT classes, or AMXINT4 without AMX)."""
    e = kt_methods.lookup(weight_format)
    if e is None:
        raise ValueError(f"unknown expert weight format {weight_format!r}")
    best = best_variant(x)
    if best is None or not V.get(best).sft:
        return None
    if e.needs_amx and best != V.AMX:
        return None
    return e.train_backend


def _needs(setup: str) -> str:
    e = kt_methods.lookup(setup)
    if e is not None and e.needs_amx:
        return "AMX (amx_tile, amx_int8, amx_bf16) that actually executes (cookbook §1.1)"
    return f"a kt-kernel build with SFT kernels: {' or '.join(V.TRAINING)}"


def weight_format_check(x: HostFacts | CpuFacts, weight_format: str, backend: str = "auto") -> CheckResult:
    """recipe.weight_format_vs_isa: can the build this CPU proves train (and serve as a LoRA) this recipe's experts?"""
    e = kt_methods.lookup(weight_format)
    fmt = e.setup if e else weight_format.lower()
    best = best_variant(x)
    chosen = auto_backend(x, fmt)
    data: dict[str, object] = {"weight_format": fmt, "kt_backend": backend, "auto_resolves_to": e.train_backend if e else None,
            "best_variant": best, "sft_method": e.sft_method if e else None, "trainable": chosen is not None}
    name = CheckName.RECIPE_WEIGHT_FORMAT_VS_ISA
    if chosen is None:
        b = V.get(best) if best else None
        lowest = V.get(V.TRAINING[-1])
        missing = [f for f in lowest.requires if not has(x, f)]
        needs = (f"the lowest build with SFT kernels ({lowest.name}) needs {' '.join(lowest.requires)}"
                 + (f" (not listed here: {' '.join(missing)})" if missing else
                    " (listed, but the probe shows it faulting)"))
        why = (f"no kt-kernel build runs here (not even {V.AVX2} is listed), so no SFT kernels either; {needs}" if b is None else
               f"kt-kernel's {b.name} build (the best this CPU proves) has no SFT kernels, so it can neither train "
               f"nor serve a LoRA; {needs}" if not b.sft else f"{fmt} experts need {_needs(fmt)}")
        data["missing_for_training"] = missing
        return CheckResult(name=name, status="fail", data=data,
                           detail=f"{fmt} LoRA ({e.sft_method if e else fmt}) cannot train on this CPU: {why}",
                           fix=f"Train on a CPU that proves {_needs(fmt)} — AMD Zen 4/5 or Intel Sapphire Rapids and "
                               "newer (see docs/cpu-builds.md). This CPU can still serve a full fine-tune. "
                               "In a VM/container, check that flags are not hidden (layer.cpu_flags).")
    if fmt == "bf16" and best != V.AMX:
        return CheckResult(name=name, status="warn", data=data,
                           detail=f"bf16 experts train on kt-kernel's {best} build (AMXBF16_SFT without AMX tiles): "
                                  "measured 1,451 tok/s vs 1,740 on amx (kt-facts.md, tiny model)",
                           fix="Fine for most runs; for the largest models prefer an AMX CPU (Sapphire Rapids or newer).")
    return CheckResult(name=name, status="pass", data=data,
                       detail=f"{fmt} experts: kt_backend {backend} -> {chosen} ({data['sft_method']}) on kt-kernel's "
                              f"{best} build")


def isa_checks(facts: HostFacts) -> list[CheckResult]:
    cpu = facts.cpu
    out = []
    if cpu.has(*AVX2_FLAGS):
        out.append(CheckResult(name=CheckName.CPU_ISA_AVX2, status="pass", detail="avx2 and fma listed", layer=facts.layer))
    else:
        out.append(CheckResult(name=CheckName.CPU_ISA_AVX2, status="fail", layer=facts.layer,
                               detail=f"avx2/fma missing from /proc/cpuinfo ({cpu.model_name or 'unknown CPU'})",
                               fix="kt-kernel needs AVX2 at least. " + IMAGE_FIX_FLAGS))
    have = [f for f in V.AVX512_LISTED if has(facts, f)]
    p = facts.probes.amx
    executed = {f: getattr(p, f) for f in ("avx512f_exec", "avx512bw_exec", "avx512_vnni_exec", "avx512_vbmi_exec",
                                            "avx512_bf16_exec") if p.ran and getattr(p, f) is not None}
    exec_note = ("; executed: " + ", ".join(f"{k.removesuffix('_exec')}={v}" for k, v in executed.items())
                 if executed else "")
    if has(facts, *AVX512_FLAGS):
        faulted = [k.removesuffix("_exec") for k, v in executed.items() if v is False and
                   has(facts, k.removesuffix("_exec"))]
        if faulted:
            out.append(CheckResult(name=CheckName.CPU_ISA_AVX512, status="fail", layer=facts.layer,
                                   detail=f"listed AVX512 instructions faulted: {' '.join(faulted)}" + exec_note,
                                   fix=f"The hypervisor or kernel disables that state; until it is enabled use "
                                       f"{V.image(str(best_variant(facts)))} (deploy.image: auto picks it)."))
        else:
            out.append(CheckResult(name=CheckName.CPU_ISA_AVX512, status="pass", layer=facts.layer,
                                   detail="listed: " + " ".join(have) + exec_note, data={"flags": have}))
    elif p.ran and p.avx512f_exec:
        out.append(CheckResult(name=CheckName.CPU_ISA_AVX512, status="fail", layer=facts.layer,
                               detail="the CPU executes AVX512 (CPUID + a real instruction) but /proc/cpuinfo hides "
                                      "it; kt-kernel reads /proc/cpuinfo and would fall back to AVX2" + exec_note,
                               fix="Remove the /proc/cpuinfo override (bind mount or lxcfs) from this container.",
                               data={"flags": have}))
    else:
        out.append(CheckResult(name=CheckName.CPU_ISA_AVX512, status="warn", layer=facts.layer,
                               detail="no AVX512 (" + (" ".join(have) or "none listed") + "): kt-kernel falls back "
                                      "to its avx2 build, which cannot train",
                               fix="Use an AVX512-BF16 or AMX CPU for training. " + IMAGE_FIX_FLAGS,
                               data={"flags": have}))
    best = best_variant(facts)
    detected = kt_kernel_variant(facts)
    if best:
        b = V.get(best)
        unproven = V.unproven_exec(b, p)
        proof = ("proven by executing " + ", ".join(f.removesuffix("_exec") for f in b.executes if f not in unproven)
                 if b.executes and len(unproven) < len(b.executes) else "from flags only (probe did not run)"
                 if b.executes else "from flags")
        out.append(CheckResult(name=CheckName.CPU_VARIANT, status="pass", layer=facts.layer,
                               detail=f"image variant: {V.image(best)} ({proof}; kt-kernel detects {detected}; "
                                      + ("trains and serves" if b.sft else "serves a full fine-tune only, no SFT")
                                      + ")",
                               data={"best": best, "kt_kernel_variant": detected, "sft": b.sft,
                                     "unproven": unproven}))
    else:
        out.append(variant_check(facts, V.AVX2))
    if best and V.above(detected, best):
        out.append(CheckResult(name=CheckName.CPU_KT_KERNEL_VARIANT, status="fail", layer=facts.layer,
                               detail=f"kt-kernel would pick its {detected} build from the flags, but this CPU "
                                      f"proves only {best} (see cpu.isa.* / cpu.amx.*): an unpinned kt-kernel faults",
                               fix=f"Use the {V.image(best)} image (it pins KT_KERNEL_CPU_VARIANT={best}); "
                                   "deploy.image: auto picks it.",
                               data={"kt_kernel_variant": detected, "best": best}))
    return out
