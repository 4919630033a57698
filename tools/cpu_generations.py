"""The CPU-generation table: ktdeploy's build choice vs kt-kernel's own detection, on recorded /proc/cpuinfo files.

    python tools/cpu_generations.py cpuinfo          # (re)write cpuinfo.txt from each recorded lscpu.txt
    python tools/cpu_generations.py table [IMAGE]    # run both on every file, write docs/cpu-generations.md

Inputs: tests/golden/cpu-generations/*/ (public recordings, tests/golden/README.md says where each comes from) and
this project's own recordings of VMs/containers that mask flags (tests/golden/<machine>/cpuinfo.txt). For a source
recorded with lscpu, cpuinfo.txt is its first processor as /proc/cpuinfo prints it: the lscpu fields copied, the
Flags value unwrapped (lscpu wraps it at a fixed column) — no flag added or dropped (a unit test compares).

kt-kernel's detection runs in the full image: `kt_kernel/_cpu_detect.py detect_cpu_features()` of the installed
wheel (loaded from its file, so that importing the package does not load an extension), with the file
bind-mounted over /proc/cpuinfo and KT_KERNEL_CPU_VARIANT emptied (the image pins it). ktdeploy's choice is
`best_variant` of the facts parsed from the same file (flags only: the recordings have no probe output, except the
project's own, where the recorded probe is applied too).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOLDEN = ROOT / "tests" / "golden"
TABLE = ROOT / "docs" / "cpu-generations.md"
# The project's own recordings that mask flags (VM CPU model / container cpuinfo override), and the AMX VM.
OWN = ("haswell-avx2-qemu", "numa-2socket-qemu", "container-hidden-flags-limits", "avx512-kvm-container",
       "gpu-h200-vm")
DETECT = ("import importlib.util as u, json; s = u.find_spec('kt_kernel'); "
          "p = s.submodule_search_locations[0] + '/_cpu_detect.py'; "
          "spec = u.spec_from_file_location('ktcd', p); m = u.module_from_spec(spec); spec.loader.exec_module(m); "
          "print(json.dumps(m.detect_cpu_features()))")


def lscpu_fields(text: str) -> dict[str, str]:
    """`Key: value` lines of lscpu (old and new layouts), with the wrapped Flags value joined back."""
    fields: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*([A-Za-z][A-Za-z0-9 ()/_-]*):(\s+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        key, value = m.group(1).strip(), m.group(3)
        col = lines[i].index(":") + 1 + len(m.group(2))
        i += 1
        # continuation lines: indented to the value's column, holding no "Key:" of their own
        while i < len(lines) and lines[i][:col].strip() == "" and len(lines[i]) > col and \
                not re.match(r"^\s*[A-Za-z][A-Za-z0-9 ()/_-]*:\s", lines[i]):
            value += lines[i][col:]
            i += 1
        fields.setdefault(key, value.rstrip())
    return fields


def cpuinfo_from_lscpu(text: str) -> str:
    f = lscpu_fields(text)
    rows = [("processor", "0"), ("vendor_id", f.get("Vendor ID", "")), ("cpu family", f.get("CPU family", "")),
            ("model", f.get("Model", "")), ("model name", f.get("Model name", "")),
            ("stepping", f.get("Stepping", "")), ("flags", f["Flags"])]
    return "".join(f"{k}\t: {v}\n" for k, v in rows) + "\n"


def files() -> dict[str, Path]:
    """name -> cpuinfo.txt, the public recordings first, then the project's own."""
    out = {p.parent.name: p for p in sorted((GOLDEN / "cpu-generations").glob("*/cpuinfo.txt"))}
    out.update({name: GOLDEN / name / "cpuinfo.txt" for name in OWN if (GOLDEN / name / "cpuinfo.txt").is_file()})
    return out


def write_cpuinfo() -> None:
    for src in sorted((GOLDEN / "cpu-generations").glob("*/lscpu.txt")):
        (src.parent / "cpuinfo.txt").write_text(cpuinfo_from_lscpu(src.read_text()))


def ktdeploy_choice(name: str, path: Path) -> dict:
    from ktdeploy.core import variants as V
    from ktdeploy.core.checks.isa import best_variant, kt_kernel_variant
    from ktdeploy.core.facts.cpu import build_cpu

    cpu = build_cpu(path.read_text())
    row = {"model": cpu.model_name, "flags_choice": best_variant(cpu), "kt_kernel_model": kt_kernel_variant(cpu)}
    if name in OWN and (path.parent / "amx_probe.json").is_file():
        from tests.unit.core.facts.golden import facts_of

        row["with_probe"] = best_variant(facts_of(name))
    best = row.get("with_probe") or row["flags_choice"]
    row["trains"] = bool(best and V.get(best).sft)
    return row


def kt_kernel_detection(image: str, path: Path) -> str:
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "-e", "KT_KERNEL_CPU_VARIANT=",
                        "-v", f"{path.resolve()}:/proc/cpuinfo:ro", "--entrypoint", "python3", image, "-c", DETECT],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{image} on {path}: {p.stderr[-800:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def table(image: str) -> str:
    rows = []
    for name, path in files().items():
        r = ktdeploy_choice(name, path)
        r["kt_kernel"] = kt_kernel_detection(image, path)
        r["agree"] = r["kt_kernel"] == r["flags_choice"]
        rows.append((name, path, r))
    out = ["# kt-kernel's CPU build per CPU generation: ktdeploy's choice vs kt-kernel's own detection", "",
           f"Made by `python tools/cpu_generations.py table {image}` (tools/cpu_generations.py says how); checked by",
           "tests/unit/core/test_cpu_generations.py. Sources of the files: tests/golden/README.md.", "",
           "| cpuinfo | CPU | kt-kernel detects (image, file over /proc/cpuinfo) | ktdeploy chooses (flags) | agree |"
           " with the recorded probe | trains (SFT kernels) |",
           "|---|---|---|---|---|---|---|"]
    for name, path, r in rows:
        rel = path.relative_to(ROOT)
        out.append(f"| [{name}](../{rel}) | {r['model']} | `{r['kt_kernel']}` | `{r['flags_choice']}` | "
                   f"{'yes' if r['agree'] else 'NO'} | {('`' + r['with_probe'] + '`') if r.get('with_probe') else '—'} | "
                   f"{'yes' if r['trains'] else 'no'} |")
    agree = sum(1 for _, _, r in rows if r["agree"])
    out += ["", f"{agree} of {len(rows)} rows agree.", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["cpuinfo"]:
        write_cpuinfo()
        return 0
    if argv[:1] == ["table"]:
        text = table(argv[1] if len(argv) > 1 else "ktsft:avx2")
        TABLE.write_text(text)
        print(text)
        return 0 if "| NO |" not in text else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
