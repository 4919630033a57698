"""An in-image command started on a controller without its part of the stack is a usage error (exit 2) whose fix
is a command to paste — the real image tag this CPU takes, the folders mounted — never exit 70 or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.cli.in_image import local_image

REPO = Path(__file__).resolve().parents[3]
HIDE = "import sys\nfor m in sys.argv[1].split(','): sys.modules[m] = None\n" \
       "from ktdeploy.cli import main\nmain(sys.argv[2:])\n"


def run(hidden: str, *args: str, tmp_path: Path) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-c", HIDE, hidden, *args], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "COLUMNS": "200", "KTDEPLOY_HOME": str(tmp_path / "home")}, timeout=120)
    return p.returncode, " ".join((p.stdout + p.stderr).split())


def test_merge_without_numpy_names_the_extra_and_the_image(tmp_path):
    code, out = run("numpy", "merge", str(tmp_path / "out"), "--base", str(tmp_path / "base"), "-o",
                    str(tmp_path / "merged"), tmp_path=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert "pip install 'ktdeploy[merge]'" in out and f"{local_image()} merge {tmp_path}/out --base" in out, out
    assert f"-v {tmp_path}:{tmp_path}" in out, out
    assert not (tmp_path / "merged").exists()


def test_serve_outside_the_image_says_where_it_runs(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    code, out = run("sglang", "serve", "recipes/tiny-moe-lora.yaml", "--adapter", str(adapter), tmp_path=tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert "serve needs sglang-kt" in out and f"{local_image()} serve {REPO}/recipes/tiny-moe-lora.yaml --adapter {adapter}" in out, out


def test_serve_print_still_works_without_sglang(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    code, out = run("sglang", "serve", "recipes/tiny-moe-lora.yaml", "--adapter", str(adapter), "--print",
                    tmp_path=tmp_path)
    assert code == 0 and "--lora-paths" in out, out


@pytest.mark.parametrize("flags,tag", [("fpu avx2", "ktsft:avx2"),
                                        ("avx2 avx512f avx512bw avx512_vnni avx512_vbmi avx512_bf16", "ktsft:avx512_bf16")])
def test_the_tag_is_the_cpus(monkeypatch, flags, tag):
    from ktdeploy.cli import in_image

    monkeypatch.setattr(in_image, "Path", lambda p: type("P", (), {"read_text": lambda self: f"flags\t: {flags}\n"})())
    assert in_image.local_image() == tag


@pytest.mark.skipif(any(Path("/dev").glob("nvidia[0-9]*")), reason="this host has a GPU: serve would start")
def test_serve_in_the_image_on_a_host_without_a_gpu_stops_in_seconds(tmp_path):
    """With sglang-kt importable (as in the image) on a host with no GPU: doctor's gpu.present, exit 1, in seconds,
    before the server (it would load for minutes, then fail in CUDA) — not exit 70, not a traceback."""
    import time

    stack = tmp_path / "stack" / "sglang"
    stack.mkdir(parents=True)
    (stack / "__init__.py").write_text("raise SystemExit('sglang was imported: the check came too late')\n")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "serve", "recipes/tiny-moe-lora.yaml", "--adapter",
                        str(adapter)], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "COLUMNS": "200", "KTDEPLOY_HOME": str(tmp_path / "home"),
                            "PYTHONPATH": f"{REPO}:{tmp_path / 'stack'}"})
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and "Traceback" not in out, out
    assert out.startswith("CheckFailed: gpu.present: serve needs an NVIDIA GPU"), out
    assert "starting:" not in out and "sglang was imported" not in out
    assert time.monotonic() - t0 < 30
    # waived (a test double of sglang-kt on a CPU-only test host): said, and the server starts; the launcher makes
    # its cache folders under this HOME (a folder of the test's own), private
    home = tmp_path / "user"
    home.mkdir()
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "serve", "recipes/tiny-moe-lora.yaml", "--adapter",
                        str(adapter), "--waive", "gpu.present"], capture_output=True, text=True, cwd=REPO,
                       timeout=120, env={**os.environ, "COLUMNS": "200", "KTDEPLOY_HOME": str(tmp_path / "home"),
                                         "HOME": str(home), "PYTHONPATH": f"{REPO}:{tmp_path / 'stack'}"})
    out = " ".join((p.stdout + p.stderr).split())
    assert "waived gpu.present" in out and "starting:" in out and "sglang was imported" in out, out
    caches = home / ".cache" / f"ktdeploy-{os.getuid()}"
    assert {c.name for c in caches.iterdir()} == {"sglang-kt-lora", "torchinductor"}
    assert all(c.stat().st_mode & 0o777 == 0o700 for c in caches.iterdir())
