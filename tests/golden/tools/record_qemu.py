"""Record real kernel outputs for CPUs/topologies we do not have, by booting a tiny Linux under QEMU.

    python tests/golden/tools/record_qemu.py OUT_DIR -- QEMU_ARGS...
    e.g. python tests/golden/tools/record_qemu.py tests/golden/haswell-avx2-qemu -- -cpu Haswell-v4 -smp 2 -m 1G

The guest is Debian's own kernel (/boot/vmlinuz-*, package linux-image-amd64) with an initramfs holding
busybox-static, lscpu (util-linux, with its libraries), ktdeploy's fact-gathering script and the two C probes
(built static here). /init runs them and prints everything on the serial console; this script splits that
into a golden folder (the same layout as `python -m ktdeploy.controller.facts_record`) and writes facts.json.
Needs: apt install qemu-system-x86 busybox-static linux-image-amd64 cpio gcc. Runs under TCG (KTD_QEMU_KVM=1 for KVM).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from ktdeploy.controller.facts_gather import RawFacts, build_facts, gather_script, parse_sections, save_raw  # noqa: E402
from ktdeploy.controller.facts_probes import PROBES, build_probe  # noqa: E402

INIT = """#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm /tmp; mount -t tmpfs shm /dev/shm; mount -t tmpfs tmp /tmp
export PATH=/bin:/usr/bin HOME=/root
echo @@KTD-GUEST-BEGIN
sh /gather.sh
for p in amx_probe numa_probe; do echo "@@KTD-PROBE $p"; /probes/$p; done
echo @@KTD-GUEST-END
poweroff -f
"""


def copy_with_libs(binary: str, root: str) -> None:
    dest = os.path.join(root, binary.lstrip("/"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(binary, dest)
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        path = next((p for p in parts if p.startswith("/")), None)
        if path and os.path.exists(path):
            d = os.path.join(root, path.lstrip("/"))
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(path, d)


def build_initramfs(tmp: str) -> str:
    root = os.path.join(tmp, "root")
    for d in ("bin", "proc", "sys", "dev", "tmp", "probes", "root", "etc"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    shutil.copy2("/bin/busybox", os.path.join(root, "bin", "busybox"))
    os.symlink("busybox", os.path.join(root, "bin", "sh"))
    copy_with_libs("/usr/bin/lscpu", root)
    with open(os.path.join(root, "init"), "w") as f:
        f.write(INIT)
    os.chmod(os.path.join(root, "init"), 0o755)
    with open(os.path.join(root, "gather.sh"), "w") as f:
        f.write(gather_script())
    shutil.copy2("/etc/os-release", os.path.join(root, "etc", "os-release"))
    for name in PROBES:
        build_probe(name, os.path.join(root, "probes"), static=True)
    cpio = os.path.join(tmp, "initramfs.cpio")
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True).stdout
    with open(cpio, "wb") as out:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files.encode(), stdout=out, check=True)
    return cpio


def main() -> int:
    if "--" not in sys.argv:
        print(__doc__)
        return 2
    i = sys.argv.index("--")
    out_dir, qemu_args = sys.argv[1], sys.argv[i + 1:]
    kernel = sorted(glob.glob("/boot/vmlinuz-*"))[-1]
    # TCG by default: it emulates exactly the -cpu model asked for (nested KVM hung on the dev machine).
    accel = ["-accel", "kvm"] if os.environ.get("KTD_QEMU_KVM") == "1" else ["-accel", "tcg"]
    with tempfile.TemporaryDirectory() as tmp:
        initrd = build_initramfs(tmp)
        cmd = ["qemu-system-x86_64", *accel, "-nographic", "-no-reboot", "-kernel", kernel, "-initrd", initrd,
               "-append", "console=ttyS0 quiet panic=-1", *qemu_args]
        print("+", " ".join(cmd), file=sys.stderr)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = p.stdout.replace("\r\n", "\n")
    if "@@KTD-GUEST-END" not in text:
        sys.stderr.write(text[-3000:] + p.stderr[-2000:])
        return 1
    body = text.split("@@KTD-GUEST-BEGIN\n", 1)[1].split("@@KTD-GUEST-END", 1)[0]
    gather_part, _, probe_part = body.partition("@@KTD-PROBE ")
    raw = RawFacts(host=os.path.basename(out_dir.rstrip("/")), sections=parse_sections(gather_part))
    for chunk in ("@@KTD-PROBE " + probe_part).split("@@KTD-PROBE ")[1:]:
        name, _, out = chunk.partition("\n")
        raw.probes[name.strip()] = out.strip() + "\n"
    save_raw(raw, out_dir)
    with open(os.path.join(out_dir, "facts.json"), "w") as f:
        json.dump(build_facts(raw).model_dump(mode="json"), f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "qemu-command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    print(out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
