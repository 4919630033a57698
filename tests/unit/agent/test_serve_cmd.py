"""ktdeploy serve: the sglang-kt argv from the recipe and host facts (no shell, loopback, key from env)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.agent.serve import build_serve_command, kt_method
from ktdeploy.core.errors import UsageError
from ktdeploy.core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[3]


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_tiny_recipe_command():
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml")
    c = build_serve_command(r, "/out/tiny-sglang", cpuinfer=14, threadpools=1, amx=True)
    a = c.argv
    assert a[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag(a, "--model-path") == r.train["model_name_or_path"] == flag(a, "--kt-weight-path")
    assert flag(a, "--host") == "127.0.0.1" and flag(a, "--kt-method") == "AMXBF16"
    assert flag(a, "--kt-num-gpu-experts") == "0" and flag(a, "--kt-cpuinfer") == "14"
    assert flag(a, "--lora-paths") == "tiny-lora=/out/tiny-sglang" and "--enable-lora" in a
    assert int(flag(a, "--max-running-requests")) >= 2 and flag(a, "--tp-size") == "1"
    assert "--api-key" not in a and c.env == {"CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize("fmt,backend,amx,want", [
    ("bf16", "auto", True, "AMXBF16"), ("bf16", None, False, "BF16"), ("fp8", "auto", True, "FP8"),
    ("int8", "auto", False, "AMXINT8"), ("int4", "AMXINT4", True, "AMXINT4"), ("bf16", "AMXBF16", False, "AMXBF16")])
def test_kt_method(fmt, backend, amx, want):
    assert kt_method(fmt, backend, amx) == want


def test_unknown_backend():
    with pytest.raises(UsageError) as ei:
        kt_method("bf16", "LLAMAFILE", True)
    assert ei.value.key == "train.kt_config.kt_backend"


def test_int8_recipe_uses_converted_weights():
    r = load_recipe(ROOT / "recipes/qwen3-235b-int8-lora.yaml")
    c = build_serve_command(r, "/a", cpuinfer=60, threadpools=2)
    assert flag(c.argv, "--kt-weight-path") == r.train["kt_weight_path"]
    assert flag(c.argv, "--kt-method") == "AMXINT8" and flag(c.argv, "--kt-threadpool-count") == "2"


def test_api_key_from_env_is_redacted(monkeypatch):
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.api_key_env=MY_KEY"])
    with pytest.raises(UsageError, match="MY_KEY"):
        build_serve_command(r, "/a", cpuinfer=4, threadpools=1)
    monkeypatch.setenv("MY_KEY", "top secret; rm -rf /")
    c = build_serve_command(r, "/a", cpuinfer=4, threadpools=1)
    assert flag(c.argv, "--api-key") == "top secret; rm -rf /"  # one argv item, never a shell
    assert "top secret" not in c.shell() and "$MY_KEY" in c.shell()


def test_extra_args_and_paths_stay_single_items():
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.extra_args=['--context-length', '4096']"])
    c = build_serve_command(r, "/dir with space/a'b", cpuinfer=4, threadpools=1)
    assert c.argv[-2:] == ["--context-length", "4096"]
    assert flag(c.argv, "--lora-paths") == "tiny-lora=/dir with space/a'b"


def test_cli_print(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "serve", str(ROOT / "recipes/tiny-moe-lora.yaml"),
                        "--adapter", str(tmp_path), "--kt-cpuinfer", "8", "--kt-threadpool-count", "1", "--print",
                        "--json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert '"--kt-cpuinfer",\n    "8"' in p.stdout


def test_cli_refuses_raw_output(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "serve", str(ROOT / "recipes/tiny-moe-lora.yaml"),
                        "--adapter", str(tmp_path), "--print"], capture_output=True, text=True, cwd=ROOT,
                       env={**__import__("os").environ, "COLUMNS": "200"})
    assert p.returncode == 2 and "ktdeploy convert" in p.stderr
