"""Virtualization facts: the `hypervisor` CPU flag, `systemd-detect-virt --vm`, DMI vendor/product."""

from __future__ import annotations

from ktdeploy.core.facts.host import VirtFacts

# DMI strings that name a hypervisor, mapped to systemd-detect-virt's ids.
_DMI_VMS = {
    "qemu": "qemu", "kvm": "kvm", "vmware": "vmware", "virtualbox": "oracle", "innotek": "oracle",
    "xen": "xen", "microsoft corporation": "microsoft", "amazon ec2": "amazon", "google": "google",
    "openstack": "kvm", "bochs": "bochs", "parallels": "parallels",
}


def parse_dmi(text: str) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            if v.strip():
                out[k.strip()] = v.strip()
    return out


def vm_from_dmi(vendor: str | None, product: str | None) -> str | None:
    text = f"{vendor or ''} {product or ''}".lower()
    for needle, vm in _DMI_VMS.items():
        if needle in text:
            return vm
    return None


def build_virt(hypervisor_flag: bool, detect_out: str | None, detect_rc: int | None, dmi_text: str | None,
               lscpu_hypervisor: str | None = None) -> VirtFacts:
    dmi = parse_dmi(dmi_text or "")
    vm = None
    word = (detect_out or "").strip().splitlines()
    # systemd-detect-virt prints 'none' and exits 1 on bare metal; 127 when systemd is absent.
    if detect_rc in (0, 1) and word:
        vm = word[0].strip()
    if vm in (None, "none"):
        vm = vm_from_dmi(dmi.get("sys_vendor"), dmi.get("product_name")) or (
            lscpu_hypervisor.lower() if lscpu_hypervisor else None) or vm
    return VirtFacts(hypervisor_flag=hypervisor_flag, vm=vm, dmi_vendor=dmi.get("sys_vendor"),
                     dmi_product=dmi.get("product_name"))
