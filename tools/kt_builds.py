"""What each kt-kernel CPU build can run, read from the builds themselves: docs/cpu-builds.md.

    python tools/kt_builds.py [IMAGE]      (default ktsft:avx2; any full image: they hold the same wheel)

For each of the six extension builds in the image's kt-kernel wheel, one container loads that `.so` directly
(importlib, not `import kt_kernel`, so nothing else is loaded; one per process: pybind refuses a second build in
one interpreter) and lists `kt_kernel_ext.moe` and the runtime metadata. Loading a build runs none of its
instructions, so every build can be listed on any CPU. The verdicts follow kt-kernel's code:
- train / serve a LoRA: sglang-kt builds the KT wrapper in `sft` mode for a LoRA and kt-kernel's SFT wrapper
  (sft/amx.py) needs the SFT classes (`AMXBF16_SFT_MOE`, `AMXFP8_SFT_MOE`, `AMXInt8_SFT_MOE`, `AMXInt4_SFT_MOE`:
  "AMX SFT backend not available" otherwise); INT8_SFT also needs `__int8_kernel__` amx-int8 / avx512-vnni /
  onednn-vnni (sft/backend.py get_int8_runtime), native FP8 `__fp8_kernel__` avx512-fp8-decode-bf16;
- serve a full fine-tune: kt-kernel's inference mode with BF16 (utils/amx.py NativeMoEWrapper:
  `AMXBF16_MOE` or `AVX2BF16_MOE`).
tests/unit/core/test_variant_registry.py checks core/variants.py against the committed table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "cpu-builds.md"
LIST = ("import glob, importlib.util as u, json, os, sys; v = sys.argv[1]; "
        "d = u.find_spec('kt_kernel').submodule_search_locations[0]; "
        "so = glob.glob(os.path.join(d, f'_kt_kernel_ext_{v}.*.so'))[0]; "
        "spec = u.spec_from_file_location('kt_kernel_ext', so); ext = u.module_from_spec(spec); "
        "spec.loader.exec_module(ext); "
        "print(json.dumps({'cpu_variant': ext.__cpu_variant__, 'int8_kernel': ext.__int8_kernel__, "
        "'fp8_kernel': ext.__fp8_kernel__, 'moe': sorted(n for n in dir(ext.moe) if n.endswith('_MOE'))}))")
SFT = {"bf16": "AMXBF16_SFT_MOE", "fp8": "AMXFP8_SFT_MOE", "int8": "AMXInt8_SFT_MOE", "int4": "AMXInt4_SFT_MOE"}
INT8_KERNELS = {"amx-int8", "avx512-vnni", "onednn-vnni"}
FP8_KERNEL = "avx512-fp8-decode-bf16"


def listing(image: str, build: str) -> dict:
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", LIST,
                        build], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{build}: {p.stderr[-600:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def verdicts(info: dict) -> dict[str, bool]:
    moe = set(info["moe"])
    out = {f"train {s}": cls in moe for s, cls in SFT.items()}
    out["train int8"] = out["train int8"] and info["int8_kernel"] in INT8_KERNELS
    out["train fp8"] = out["train fp8"] and info["fp8_kernel"] == FP8_KERNEL
    out["serve full (BF16)"] = bool({"AMXBF16_MOE", "AVX2BF16_MOE"} & moe)
    return out


def render(image: str, rows: dict[str, dict]) -> str:
    from ktdeploy.core import variants as V

    cols = ["train bf16", "train fp8", "train int8", "train int4", "serve full (BF16)"]
    out = ["# kt-kernel 0.7.2's CPU builds: which CPU needs which, and what each can run", "",
           f"Made by `python tools/kt_builds.py {image}` (listing each build's `kt_kernel_ext.moe` in the image;",
           "tools/kt_builds.py says how the verdicts follow kt-kernel's code). A LoRA is served on exactly the builds",
           "that can train it (sglang-kt serves a KT LoRA through kt-kernel's SFT wrapper). ktdeploy's registry:",
           "ktdeploy/core/variants.py; the per-generation choice: docs/cpu-generations.md.", "",
           "| build = image tag | needs (/proc/cpuinfo) | CPUs | " + " | ".join(cols) + " | int8 kernel | fp8 kernel |",
           "|---|---|---|" + "---|" * (len(cols) + 2)]
    for v in V.LADDER:
        info = rows[v.name]
        ver = verdicts(info)
        amx_note = " (cookbook: AMX only; not measured)" if v.name != V.AMX else ""
        cells = [("yes" if ver[c] else "no") + (amx_note if c == "train int4" and ver[c] else "") for c in cols]
        out.append(f"| `ktsft:{v.name}` | {' '.join(v.requires)} | {v.cpus} | " + " | ".join(cells)
                   + f" | {info['int8_kernel']} | {info['fp8_kernel']} |")
    out += ["", "SFT classes per build (the rest of `kt_kernel_ext.moe` is inference classes):", ""]
    for v in V.LADDER:
        sft = [n for n in rows[v.name]["moe"] if "_SFT_" in n or n.endswith("_SFT_MOE")]
        out.append(f"- `{v.name}`: {', '.join(sft) or 'none'}")
    out += ["", "Measured on the GPU machine (kt-facts.md, tiny model, BF16 LoRA, `KT_KERNEL_CPU_VARIANT` pinned): amx "
            "1,740 tok/s, avx512_bf16 1,451 tok/s; avx512_vnni, avx512_base and avx2 stop at start-up with \"AMX SFT "
            "backend not available\" — what the table says. The old `ktsft:avx512` tag is the avx512_bf16 image.", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    from ktdeploy.core import variants as V

    image = argv[0] if argv else "ktsft:avx2"
    rows = {v.name: listing(image, v.name) for v in V.LADDER}
    for name, info in rows.items():
        if info["cpu_variant"] != name:
            raise SystemExit(f"the {name} build reports __cpu_variant__ {info['cpu_variant']!r}")
    DOC.write_text(render(image, rows))
    (DOC.with_suffix(".json")).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    print(DOC.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
