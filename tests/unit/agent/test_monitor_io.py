"""Process-tree RSS sampling, timeouts, safetensors header validation, wheel slimming, tiny dataset."""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ktdeploy.agent import monitor
from ktdeploy.agent import safetensors_io as st

ROOT = Path(__file__).resolve().parents[3]


def test_tree_rss_counts_children(tmp_path):
    code = ("import subprocess,sys,time; c=subprocess.Popen([sys.executable,'-c',"
            "'x=bytearray(300*2**20); import time; time.sleep(1.5)']); time.sleep(1.5); c.wait()")
    out = monitor.run_streaming([sys.executable, "-c", code], env={}, cwd=None, log_path=tmp_path / "log",
                                echo=None, interval=0.1)
    assert out.rc == 0
    assert out.peak_rss_bytes > 300 * 2**20  # the child's 300 MiB buffer is in the tree's sum


def test_timeout_kills_the_group(tmp_path):
    code = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"
    out = monitor.run_streaming([sys.executable, "-c", code], env={}, cwd=None, log_path=tmp_path / "log",
                                echo=None, timeout=1.0)
    assert out.rc == 124 and out.wall_s < 30


def test_output_tail_and_log(tmp_path):
    out = monitor.run_streaming([sys.executable, "-c", "for i in range(100): print(i)"], env={}, cwd=None,
                                log_path=tmp_path / "log", echo=None, tail_lines=5)
    assert out.tail == ["95", "96", "97", "98", "99"]
    assert (tmp_path / "log").read_text().count("\n") == 100


def _raw(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("blob,msg", [
    (b"\x01\x02", "shorter"),
    (struct.pack("<Q", 10**12) + b"{}", "impossible"),
    (struct.pack("<Q", 3) + b"abc", "not JSON"),
    (_raw({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"x"), "unknown dtype"),
    (_raw({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"abcd"), "offsets"),
    (_raw({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"abcd"), "offsets"),
])
def test_bad_headers(tmp_path, blob, msg):
    p = tmp_path / "x.safetensors"
    p.write_bytes(blob)
    with pytest.raises(st.SafetensorsFormatError, match=msg):
        st.read_header(p)


def test_split_and_write_roundtrip(tmp_path, st_writer, st_reader):
    src = tmp_path / "a.safetensors"
    st_writer(src, {"w": ("F32", [3, 2, 2], [float(i) for i in range(12)])})
    idx, _ = st.read_header(src)
    parts = st.split_first_axis(src, idx["w"])
    st.write(tmp_path / "b.safetensors", [(f"w.{i}", s) for i, s in enumerate(parts)], {"k": "v"})
    got = st_reader(tmp_path / "b.safetensors")
    assert got["w.2"] == ([2, 2], [8.0, 9.0, 10.0, 11.0])
    with pytest.raises(st.SafetensorsFormatError, match="duplicate"):
        st.write(tmp_path / "c.safetensors", [("x", parts[0]), ("x", parts[1])])


def test_slim_wheel_keeps_import_packages_and_fixes_record(tmp_path):
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    import fetch_wheels

    src = tmp_path / "demo_kt-1.0-py3-none-any.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("demo/__init__.py", "X = 1\n")
        z.writestr("demo.libs/libx.so", b"\x7fELF")
        z.writestr("demo_kt_sgl_kernel_payload/payload.part", b"0" * 10000)
        z.writestr("demo_kt-1.0.dist-info/METADATA", "Name: demo-kt\nVersion: 1.0\n")
        z.writestr("demo_kt-1.0.dist-info/top_level.txt", "demo\n")
        z.writestr("demo_kt-1.0.dist-info/RECORD", "stale\n")
    out = tmp_path / "out.whl"
    before, after = fetch_wheels.slim_wheel(src, out)
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read("demo_kt-1.0.dist-info/RECORD").decode().splitlines()
    assert "demo_kt_sgl_kernel_payload/payload.part" not in names and "demo.libs/libx.so" in names
    assert {r.split(",")[0] for r in record} == names
    assert any(r.startswith("demo/__init__.py,sha256=") for r in record)


def test_lock_versions_parse(tmp_path):
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    import fetch_wheels

    lock = tmp_path / "x.lock"
    lock.write_text("# c\nkt-kernel==0.7.2 \\\n    --hash=sha256:ab\nruamel.yaml==0.19.1 ; python_version >= '3'\n")
    v = fetch_wheels.lock_versions(lock)
    assert v == {"kt-kernel": "0.7.2", "ruamel-yaml": "0.19.1"}
    specs, src = fetch_wheels.resolve_pins(v)
    assert "kt-kernel==0.7.2" in specs and src["kt-kernel"] == "lock" and src["fire"] == "pin"


def test_tiny_dataset_is_deterministic(tmp_path):
    from ktdeploy.agent.tiny import build_dataset

    build_dataset(tmp_path / "a", 20, seed=1)
    build_dataset(tmp_path / "b", 20, seed=1)
    a = (tmp_path / "a/tiny_sft.json").read_text()
    assert a == (tmp_path / "b/tiny_sft.json").read_text() and len(json.loads(a)) == 20
    info = json.loads((tmp_path / "a/dataset_info.json").read_text())
    assert set(info) == {"tiny_sft", "tiny_sft_long"}
    held = json.loads((tmp_path / "a/heldout_prompts.json").read_text())
    assert len(held) == 8 and not set(held) & {r["instruction"] for r in json.loads(a)}


class _SlowEcho:
    """A terminal that takes 2 s per write: the old line relay made the trainer wait on it through the pipe."""

    def __init__(self):
        self.parts: list[str] = []

    def write(self, s: str) -> None:
        time.sleep(2)
        self.parts.append(s)

    def flush(self) -> None:
        pass


def test_trainer_never_waits_on_the_relay(tmp_path):
    # 4 MiB of output in 64 Ki lines: through a pipe relayed line by line to this echo the child would block
    # for hours; writing the log itself it finishes in well under a second, and the echo still gets all of it.
    code = ("import sys,time; t=time.monotonic(); line='x'*63+'\\n'\n"
            "for _ in range(65536): sys.stdout.write(line)\n"
            "sys.stdout.flush(); open(sys.argv[1],'w').write(str(time.monotonic()-t))")
    echo = _SlowEcho()
    out = monitor.run_streaming([sys.executable, "-c", code, str(tmp_path / "took")], env={}, cwd=None,
                                log_path=tmp_path / "log", echo=echo, interval=0.2)
    assert out.rc == 0
    assert float((tmp_path / "took").read_text()) < 5.0
    assert len("".join(echo.parts)) == 64 * 65536 == (tmp_path / "log").stat().st_size
    assert out.tail[-1] == "x" * 63


def test_high_water_mark_catches_a_spike_between_samples(tmp_path):
    code = ("import time; x=b'\\x01'*(300*2**20); del x; time.sleep(3)")
    out = monitor.run_streaming([sys.executable, "-c", code], env={}, cwd=None, log_path=tmp_path / "log",
                                echo=None, interval=1.0)
    assert out.rc == 0
    assert out.hwm_rss_bytes > 300 * 2**20       # the kernel kept the 300 MiB peak
    assert out.hwm_rss_bytes >= out.peak_rss_bytes


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE on this platform")
def test_relay_idles_while_the_child_keeps_its_priority(tmp_path):
    code = ("import os,time; time.sleep(2); print(os.sched_getscheduler(os.getppid()), os.sched_getscheduler(0))")
    before = os.sched_getscheduler(0)
    out = monitor.run_streaming([sys.executable, "-c", code], env={}, cwd=None, log_path=tmp_path / "log",
                                echo=None, interval=0.2, yield_cpu=True)
    parent, child = map(int, out.tail[-1].split())
    assert (parent, child) == (os.SCHED_IDLE, before)
    assert os.sched_getscheduler(0) == before       # restored after the run
