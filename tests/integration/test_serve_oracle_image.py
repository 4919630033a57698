"""The serving oracle in the full image: every shipped recipe's serve argv, judged by sglang-kt's and kt-kernel's
own code on CPU (tools/serve_oracle.py + tools/serve_oracle_image.py), as a uid absent from the image's passwd.

Run once per kt-kernel build this CPU can load (KT_KERNEL_CPU_VARIANT pins it, at or below what the CPU proves):
a LoRA is served through kt-kernel's SFT wrapper, so it is accepted on the builds with SFT kernels and refused
("AMX SFT backend not available") on the others; a full fine-tune's BF16 passes kt-kernel's inference validation
everywhere and the pre-fix AMXBF16 is refused everywhere. Skipped when no full image is present (CI builds the
reduced one).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ktdeploy.core import variants as V
from ktdeploy.core.checks.isa import best_variant
from ktdeploy.core.facts.cpu import build_cpu
from tests.integration.full_image import full_image_or_skip

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("ktsft:avx512_bf16", "ktsft:avx512", "ktsft:amx", "ktsft:avx2")
MARK = "SERVE-ORACLE "


@pytest.fixture(scope="module")
def full_image():
    return full_image_or_skip(CANDIDATES)


def _builds_here() -> list[str]:
    best = best_variant(build_cpu(Path("/proc/cpuinfo").read_text()))
    assert best is not None
    ladder = [v.name for v in V.LADDER]
    below = ladder[ladder.index(best):]
    # the best build with SFT kernels, and the best one without (each runs here)
    return [b for b in (next((n for n in below if V.get(n).sft), None),
                        next((n for n in below if not V.get(n).sft), None)) if b]


@pytest.mark.parametrize("build", _builds_here())
def test_every_shipped_serve_command_passes_the_real_stack(full_image, build):
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "4242:4242",
                        "-e", f"KT_KERNEL_CPU_VARIANT={build}", "-v", f"{ROOT}:/src:ro", "-w", "/tmp",
                        "-e", "PYTHONPATH=/src:/src/tools", "--entrypoint", "python3", full_image,
                        "/src/tools/serve_oracle.py", "--in-image"], capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    assert lines, p.stderr[-3000:]
    results = {c["name"]: c for c in json.loads(lines[-1][len(MARK):])}
    assert p.returncode == 0, {n: c["verdicts"] for n, c in results.items() if c["ok"] is not c["expect_ok"]}
    sft = V.get(build).sft
    for name, c in results.items():
        assert c["verdicts"].get("kt-kernel build", build) == build
        if "pre-fix --kt-method" in name:
            assert not c["ok"] and "not supported for inference mode" in c["verdicts"]["refused"]
        elif "full fine-tune" in name:
            assert c["ok"] and "BF16: accepted" in c["verdicts"]["kt-kernel KTMoEWrapper(mode=inference)"]
        elif "pre-fix env" in name:
            assert not c["ok"] and ("getpwuid" in c["verdicts"]["refused"] or not sft)
        elif sft:   # a LoRA on a build with SFT kernels: split into ktdeploy's cache, wrapper built
            assert c["ok"] and "/tmp/.cache/ktdeploy-4242/sglang-kt-lora/" in c["verdicts"]["sglang-kt LoRA checks"]
            assert "AMXSFTMoEWrapper built" in c["verdicts"]["kt-kernel KTMoEWrapper(mode=sft)"]
        else:
            assert not c["ok"] and "AMX SFT backend not available" in c["verdicts"]["refused"]
    assert len(results) == 8
