"""The CPU-generation table (docs/cpu-generations.md, made by tools/cpu_generations.py in the full image) holds:
ktdeploy's choice, recomputed here from each recorded /proc/cpuinfo, equals the committed column and kt-kernel's
own detection — which also runs here: `_cpu_detect.py` of the locked kt-kernel wheel, on the same file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ktdeploy.core import variants as V

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import cpu_generations as cg  # noqa: E402
import serve_oracle as so  # noqa: E402

ROW = re.compile(r"^\| \[(?P<name>[^\]]+)\]\(\.\./(?P<path>[^)]+)\) \| (?P<cpu>[^|]*) \| `(?P<kt>[a-z0-9_]+)` \| "
                 r"`(?P<kd>[a-z0-9_]+)` \| (?P<agree>yes|NO) \| (?P<probe>[^|]+) \| (?P<trains>yes|no) \|$")


def rows() -> list[dict]:
    return [m.groupdict() for m in map(ROW.match, cg.TABLE.read_text().splitlines()) if m]


@pytest.fixture(scope="module")
def kt_detect():
    """kt-kernel 0.7.2's detect_cpu_features, from the locked wheel's file, reading a given file as /proc/cpuinfo."""
    try:
        text = so.source("kt-kernel", "kt_kernel/_cpu_detect.py")
    except (SystemExit, Exception) as err:  # noqa: BLE001 - no wheel: say so
        pytest.skip(f"kt-kernel 0.7.2 wheel not available: {err}")

    def detect(cpuinfo: str) -> str:
        import builtins
        import io

        def fake_open(path, *a, **kw):
            return io.StringIO(cpuinfo) if path == "/proc/cpuinfo" else builtins.open(path, *a, **kw)

        ns = {"__name__": "kt_cpu_detect", "open": fake_open}
        exec(compile(text, "_cpu_detect.py", "exec"), ns)  # noqa: S102 - the wheel's own code
        import os
        saved = os.environ.pop("KT_KERNEL_CPU_VARIANT", None)
        try:
            return ns["detect_cpu_features"]()
        finally:
            if saved is not None:
                os.environ["KT_KERNEL_CPU_VARIANT"] = saved
    return detect


def test_the_table_covers_every_recorded_file_and_agrees_on_every_row():
    got = rows()
    assert {r["name"] for r in got} == set(cg.files())
    assert len(got) >= 15 and all(r["agree"] == "yes" and r["kt"] == r["kd"] for r in got)
    # the generations the issue names, each with its build (kt-facts.md's reading of kt-kernel's ladder)
    by = {r["name"]: r["kd"] for r in got}
    assert by["skylake-sp"] == by["skylake-sp-baremetal"] == "avx512_base"
    assert by["cascade-lake"] == by["cascade-lake-baremetal"] == "avx512_vnni"
    assert by["ice-lake-sp"] == "avx512_vbmi" and by["sapphire-rapids"] == "amx"
    assert by["zen4"] == by["zen5"] == "avx512_bf16" and by["zen3"] == "avx2"
    assert by["sapphire-rapids-gcp-vm"] == "avx512_bf16"      # a VM that masks AMX
    assert by["haswell-avx2-qemu"] == by["numa-2socket-qemu"] == "avx2"   # VM CPU models that mask AVX512


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["name"])
def test_ktdeploy_recomputes_its_column(row):
    r = cg.ktdeploy_choice(row["name"], ROOT / row["path"])
    assert r["flags_choice"] == row["kd"] and r["kt_kernel_model"] == row["kt"]
    assert ("yes" if r["trains"] else "no") == row["trains"]
    assert row["probe"].strip() == (f"`{r['with_probe']}`" if r.get("with_probe") else "—")


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["name"])
def test_kt_kernels_own_detection_from_the_wheel_agrees(kt_detect, row):
    assert kt_detect((ROOT / row["path"]).read_text()) == row["kt"] == row["kd"]


@pytest.mark.parametrize("src", sorted((cg.GOLDEN / "cpu-generations").glob("*/lscpu.txt")), ids=lambda p: p.parent.name)
def test_cpuinfo_made_from_lscpu_lists_exactly_the_recorded_flags(src):
    made = (src.parent / "cpuinfo.txt").read_text()
    assert made == cg.cpuinfo_from_lscpu(src.read_text())        # committed = regenerated
    flags = set(re.search(r"(?m)^flags\t: (.*)$", made).group(1).split())
    # the recorded Flags text, every wrapped piece re-joined at lscpu's column: nothing added, nothing dropped
    raw = "".join(ch for ch in src.read_text() if ch != "\n")
    assert flags and all(f in raw.replace(" ", "") or f in raw for f in flags)
    assert len(flags) == len(cg.lscpu_fields(src.read_text())["Flags"].split())


def test_every_public_recording_is_cited():
    readme = (cg.GOLDEN / "README.md").read_text()
    for d in (cg.GOLDEN / "cpu-generations").iterdir():
        assert f"`cpu-generations/{d.name}`" in readme, d.name


FLAGS = sorted({f for v in V.LADDER for f in v.requires} | {"avx512vbmi", "avx512bf16", "fma", "sse4_2"})


@settings(max_examples=300, deadline=None)
@given(st.sets(st.sampled_from(FLAGS)))
def test_the_registry_detects_as_kt_kernel_does(kt_detect, flags):
    cpuinfo = "processor\t: 0\nflags\t\t: " + " ".join(sorted(flags)) + "\n\n"
    assert V.detect(flags).name == kt_detect(cpuinfo)
