"""AMX verdicts: listed (flags), permission (arch_prctl), palette (CPUID 0x1D), tile_exec (a real tdpbssd).

"AMX absent" (not listed: fine, a lower kt-kernel build runs) is reported distinctly from "AMX listed but
unusable" (a failure: kt-kernel would pick its AMX library from the flags and die with
"Fail to do XFEATURE_XTILEDATA" or "Illegal instruction", ktransformers #480/#484/#520).
"""

from __future__ import annotations

from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult, Status
from ktdeploy.core.checks.isa import AMX_FLAGS, best_variant
from ktdeploy.core.facts.host import HostFacts

_PASSTHROUGH = ("In a VM expose AMX: libvirt <cpu mode='host-passthrough'/> or qemu -cpu host (or a CPU model "
                "with amx-tile,amx-int8,amx-bf16) on a Sapphire Rapids or newer host")


# Intel server CPUs (family 6) that have AMX: Sapphire Rapids, Emerald Rapids, Granite Rapids (-D).
AMX_MODELS = {143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids", 174: "Granite Rapids-D"}


def vm_hides_amx(facts: HostFacts) -> str | None:
    """The CPU generation under this VM has AMX but the VM's CPU model does not list it: its name, else None."""
    cpu = facts.cpu
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in AMX_MODELS and facts.virt.is_vm \
            and not cpu.has(*AMX_FLAGS):
        return AMX_MODELS[cpu.model]
    return None


def kernel_check(facts: HostFacts) -> CheckResult:
    v = facts.kernel.version
    if v is None:
        return CheckResult(name=CheckName.KERNEL_VERSION, status="skip", detail="kernel version unknown", layer=facts.layer)
    text = facts.kernel.release
    if v >= (5, 16, 0):
        return CheckResult(name=CheckName.KERNEL_VERSION, status="pass", detail=f"{text} (>= 5.16: AMX tile state supported)",
                           layer=facts.layer)
    status: Status = "fail" if facts.cpu.has(*AMX_FLAGS) else "warn"
    return CheckResult(name=CheckName.KERNEL_VERSION, status=status, layer=facts.layer,
                       detail=f"{text} is older than 5.16: the kernel refuses AMX tile state (ARCH_REQ_XCOMP_PERM)",
                       fix="Upgrade the host kernel to >= 5.16 (containers share the host kernel).")


def amx_checks(facts: HostFacts) -> list[CheckResult]:
    cpu, p, layer = facts.cpu, facts.probes.amx, facts.layer
    listed = [f for f in AMX_FLAGS if cpu.has(f)]
    out: list[CheckResult] = []
    if not listed:
        hidden_gen = vm_hides_amx(facts)
        hint = (f"; this VM runs on {hidden_gen} (family 6 model {cpu.model}), which has AMX: the hypervisor's CPU "
                "model hides it" if hidden_gen else "; this is a VM: its CPU model may hide AMX"
                if facts.virt.is_vm else "")
        out.append(CheckResult(name=CheckName.CPU_AMX_LISTED, status="warn", layer=layer,
                               detail=f"AMX absent: the CPU lists no amx_* flags{hint}; lower kt-kernel builds run "
                                      "instead (AMXINT4 weights cannot)",
                               fix="Not required for bf16/fp8/int8. For AMX speed use Sapphire Rapids or newer. "
                                   + (_PASSTHROUGH + "." if facts.virt.is_vm else "")))
        if hidden_gen:
            out.append(CheckResult(name=CheckName.LAYER_VM_CPU_MODEL, status="warn", layer="vm",
                                   detail=f"the VM layer hides AMX: the CPU is {hidden_gen} (has AMX) but the "
                                          "guest's CPU model lists no amx_* flags",
                                   fix=_PASSTHROUGH + " (ask your cloud for an AMX-enabled instance type).",
                                   data={"family": cpu.family, "model": cpu.model, "generation": hidden_gen}))
        if p.ran and p.listed:
            out.append(CheckResult(name=CheckName.CPU_AMX_CPUID, status="fail", layer=layer,
                                   detail="CPUID lists AMX-TILE but /proc/cpuinfo does not: the kernel disabled AMX",
                                   fix="Check the kernel command line (clearcpuid / noxsave) and use kernel >= 5.16."))
        for name in (CheckName.CPU_AMX_PERMISSION, CheckName.CPU_AMX_PALETTE, CheckName.CPU_AMX_TILE_EXEC, CheckName.CPU_AMX_BF16_EXEC):
            out.append(CheckResult(name=name, status="skip", detail="AMX absent", layer=layer))
        return out
    if len(listed) < len(AMX_FLAGS):
        out.append(CheckResult(name=CheckName.CPU_AMX_LISTED, status="fail", layer=layer,
                               detail=f"only {' '.join(listed)} listed (kt-kernel needs {' '.join(AMX_FLAGS)})",
                               fix=_PASSTHROUGH + "."))
    else:
        out.append(CheckResult(name=CheckName.CPU_AMX_LISTED, status="pass", layer=layer, detail="amx_tile amx_int8 amx_bf16"))
    if not p.ran:
        why = p.skipped or "probe not run"
        for name in (CheckName.CPU_AMX_PERMISSION, CheckName.CPU_AMX_PALETTE, CheckName.CPU_AMX_TILE_EXEC, CheckName.CPU_AMX_BF16_EXEC):
            out.append(CheckResult(name=name, status="skip", layer=layer,
                                   detail=f"AMX listed but unproven: {why}",
                                   fix="Install a C compiler on the host (apt install gcc) or use the ktsft image, "
                                       "which ships the prebuilt probe; then re-run doctor."))
        return out
    data = p.model_dump(exclude={"ran", "skipped"})
    fallback = f"{V.image(str(best_variant(facts)))} (deploy.image: auto picks it)"
    if p.permission:
        out.append(CheckResult(name=CheckName.CPU_AMX_PERMISSION, status="pass", layer=layer,
                               detail="arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted", data=data))
    else:
        out.append(CheckResult(name=CheckName.CPU_AMX_PERMISSION, status="fail", layer=layer,
                               detail=f"AMX listed but unusable: {p.error or 'tile permission refused'}",
                               fix=f"Use kernel >= 5.16 on the host; until then use {fallback}.", data=data))
    if (p.palettes or 0) >= 1:
        out.append(CheckResult(name=CheckName.CPU_AMX_PALETTE, status="pass", layer=layer,
                               detail=f"{p.palettes} tile palette(s): {p.max_names} tiles x {p.max_rows} rows x "
                                      f"{p.bytes_per_row} bytes", data=data))
    else:
        out.append(CheckResult(name=CheckName.CPU_AMX_PALETTE, status="fail", layer=layer,
                               detail="AMX listed but unusable: CPUID leaf 0x1D reports no tile palette "
                                      "(hypervisor hides tile state)",
                               fix=_PASSTHROUGH + f"; or use {fallback}.", data=data))
    if p.tile_exec and p.correct:
        out.append(CheckResult(name=CheckName.CPU_AMX_TILE_EXEC, status="pass", layer=layer,
                               detail="tdpbssd tile multiply executed and matched the scalar reference", data=data))
    elif p.tile_exec is None:
        out.append(CheckResult(name=CheckName.CPU_AMX_TILE_EXEC, status="fail" if p.permission is False else "skip",
                               layer=layer, detail=f"tile multiply not attempted: {p.error or 'no permission'}",
                               fix="Fix cpu.amx.permission first." if p.permission is False else
                                   "Rebuild the probe with gcc >= 11 / clang >= 12.", data=data))
    else:
        out.append(CheckResult(name=CheckName.CPU_AMX_TILE_EXEC, status="fail", layer=layer,
                               detail=f"AMX listed but unusable: {p.error or 'wrong tile result'}",
                               fix=_PASSTHROUGH + f"; until then use {fallback}.", data=data))
    out.append(_bf16_tile_check(facts, fallback, data))
    return out


def _bf16_tile_check(facts: HostFacts, fallback: str, data: dict[str, Any]) -> CheckResult:
    """cpu.amx.bf16_exec: kt-kernel's amx build trains BF16 experts with tdpbf16ps (AMXBF16_SFT): prove that too."""
    p, layer = facts.probes.amx, facts.layer
    if p.amx_bf16_exec and p.amx_bf16_correct:
        return CheckResult(name=CheckName.CPU_AMX_BF16_EXEC, status="pass", layer=layer, data=data,
                           detail="tdpbf16ps tile multiply executed and matched the scalar reference")
    if p.amx_bf16_exec is None:
        return CheckResult(name=CheckName.CPU_AMX_BF16_EXEC, status="skip", layer=layer, data=data,
                           detail="tdpbf16ps not attempted: " + (p.error or "no tile permission, or an older probe"))
    return CheckResult(name=CheckName.CPU_AMX_BF16_EXEC, status="fail", layer=layer, data=data,
                       detail="AMX-BF16 listed but unusable: " + (p.error or "tdpbf16ps gave a wrong result"),
                       fix=_PASSTHROUGH + f"; until then use {fallback}.")
