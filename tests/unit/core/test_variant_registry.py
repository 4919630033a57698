"""core/variants.py is the one home of kt-kernel's CPU builds: no variant name is written elsewhere in ktdeploy/,
and what it says each build can do is what the builds hold (docs/cpu-builds.json, listed from the image by
tools/kt_builds.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from ktdeploy.core import variants as V

ROOT = Path(__file__).resolve().parents[3]
# (file, literal): strings equal to a build name that mean something else
ALLOWED = {("ktdeploy/controller/facts_probes.py", "amx"),   # the Probes field `amx` (the AMX probe's output)
           }


def literals() -> list[tuple[str, int, str]]:
    names = set(V.NAMES) | set(V.ALIASES)
    found = []
    for p in sorted((ROOT / "ktdeploy").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel in ("ktdeploy/core/variants.py", "ktdeploy/core/recipe/catalog_data.py"):
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names \
                    and (rel, n.value) not in ALLOWED:
                found.append((rel, n.lineno, n.value))
    return found


def test_no_variant_name_is_written_outside_the_registry():
    assert literals() == []


def test_the_check_can_fail(tmp_path, monkeypatch):
    """The scan finds a literal when there is one (it reads every module's string constants)."""
    bad = ROOT / "ktdeploy" / "_registry_probe_tmp.py"
    bad.write_text('X = "avx512_vnni"\n')
    try:
        assert ("ktdeploy/_registry_probe_tmp.py", 1, "avx512_vnni") in literals()
    finally:
        bad.unlink()


def test_the_ladder_is_kt_kernels():
    assert V.NAMES == ("amx", "avx512_bf16", "avx512_vbmi", "avx512_vnni", "avx512_base", "avx2")
    assert [v.level for v in V.LADDER] == [5, 4, 3, 2, 1, 0]
    for hi, lo in zip(V.LADDER, V.LADDER[1:], strict=False):
        assert set(lo.requires) <= set(hi.requires) or lo.name == V.AVX2
        assert set(lo.executes) <= set(hi.executes)


def test_training_builds_are_the_ones_with_sft_classes():
    listed = json.loads((ROOT / "docs" / "cpu-builds.json").read_text())
    assert set(listed) == set(V.NAMES)
    for v in V.LADDER:
        assert listed[v.name]["cpu_variant"] == v.name
        assert v.sft == ("AMXBF16_SFT_MOE" in listed[v.name]["moe"]), v.name
        assert v.sft == ("AMXInt8_SFT_MOE" in listed[v.name]["moe"]), v.name


def test_the_proven_build_never_exceeds_kt_kernels_detection():
    from ktdeploy.core.facts.host import AmxProbe

    flags = [*V.AMX_FLAGS, "avx512f", "avx512bw", "avx512_vnni", "avx512vbmi", "avx512_bf16", "avx2"]
    assert V.proven(flags).name == V.AMX == V.detect(flags).name
    # the probe shows the VBMI instruction faulting: step down past every build that needs it
    p = AmxProbe(ran=True, avx512f_exec=True, avx512bw_exec=True, avx512_vnni_exec=True, avx512_vbmi_exec=False,
                 avx512_bf16_exec=True, permission=True, tile_exec=True, correct=True, amx_bf16_exec=True,
                 amx_bf16_correct=True)
    assert V.proven(flags, p).name == "avx512_vnni"
    assert V.proven(["sse4_2"]) is None and V.detect(["sse4_2"]).name == V.AVX2   # kt-kernel's fallback


def test_ansible_and_the_dockerfile_name_the_registry():
    text = (ROOT / "Dockerfile").read_text()
    stages = [ln.split()[-1] for ln in text.splitlines() if ln.startswith("FROM agent AS ")]
    assert stages == list(V.NAMES)
    task = (ROOT / "ansible" / "roles" / "ktsft_image" / "tasks" / "main.yml").read_text()
    assert "ktdeploy_variants" in task and "'avx2'" not in task
