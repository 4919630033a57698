"""`ktdeploy serve` builds an argv that sglang-kt's own server-argument parser accepts.

sglang-kt only installs in the full image (torch 2.9.1, CUDA 12 kernels), so this test runs its parser
there: `docker run --rm --entrypoint python3 ktsft:<variant> -c ...` parses our argv with
``ServerArgs.add_cli_args`` (strict argparse: an unknown or malformed flag fails) and reads the values
back. Skipped when no full image is present (the reduced CI images carry no sglang-kt).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ktdeploy.agent.serve import build_serve_command
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.served import Served
from tests.integration.full_image import full_image_or_skip

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("ktsft:amx", "ktsft:avx512_bf16", "ktsft:avx512", "ktsft:avx2")

PARSE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
argv = json.loads(sys.argv[1])
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
ns = parser.parse_args(argv)
out = {k: getattr(ns, k) for k in ("model_path", "host", "port", "kt_weight_path", "kt_method", "kt_cpuinfer",
                                   "kt_threadpool_count", "kt_num_gpu_experts", "enable_lora", "lora_backend",
                                   "lora_paths", "max_running_requests", "max_loras_per_batch", "tensor_parallel_size",
                                   "served_model_name", "api_key")}
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def full_image():
    return full_image_or_skip(CANDIDATES)


def parse_in_image(image: str, argv: list[str]) -> dict:
    assert argv[1:3] == ["-m", "ktdeploy.agent.sglang_launch"]  # sglang's own launch, in-process, same flags
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", PARSE,
                        json.dumps(argv[3:])], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_sglang_kt_parses_our_serve_command(full_image, tmp_path, monkeypatch):
    recipe = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml")
    cmd = build_serve_command(recipe, Served("adapter", "/srv/ktdeploy/output/tiny-moe-lora-sglang"), cpuinfer=14, threadpools=1)
    got = parse_in_image(full_image, cmd.argv)
    assert got["model_path"] == recipe.train["model_name_or_path"]
    assert got["host"] == "127.0.0.1" and got["port"] == 30000
    assert got["kt_method"] == "AMXBF16" and got["kt_cpuinfer"] == 14 and got["kt_threadpool_count"] == 1
    assert got["kt_num_gpu_experts"] == 0 and got["kt_weight_path"] == recipe.train["model_name_or_path"]
    assert got["enable_lora"] is True and got["lora_backend"] == "triton"
    assert "tiny-lora=/srv/ktdeploy/output/tiny-moe-lora-sglang" in str(got["lora_paths"])
    assert got["max_running_requests"] >= 2 and got["tensor_parallel_size"] == 1
    assert got["api_key"] is None


def test_api_key_and_extra_args_parse(full_image, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_TEST_KEY", "s3cret")
    recipe = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml",
                         ["deploy.serve.api_key_env=KTDEPLOY_TEST_KEY", "deploy.serve.host=0.0.0.0",
                          "deploy.serve.extra_args=['--context-length', '4096']"])
    cmd = build_serve_command(recipe, Served("adapter", "/a"), cpuinfer=8, threadpools=2)
    got = parse_in_image(full_image, cmd.argv)
    # the key is not in the argv: the launcher sets ServerArgs.api_key from $KTDEPLOY_TEST_KEY (named by the env)
    assert got["api_key"] is None and got["host"] == "0.0.0.0" and got["kt_method"] == "AMXBF16"   # a LoRA
    assert cmd.env["KTDEPLOY_API_KEY_ENV"] == "KTDEPLOY_TEST_KEY" and "s3cret" not in cmd.shell()


def test_sglang_kt_parses_the_merged_model_command(full_image):
    """deploy.serve.merge: the merged folder is model and KT weights, --kt-method BF16 (sglang-kt's inference-mode
    method for plain BF16 experts), no LoRA flags; sglang-kt's own parser reads it back so."""
    recipe = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.merge=true"])
    merged = "/srv/ktdeploy/output/tiny-moe-lora-merged"
    cmd = build_serve_command(recipe, Served("merged", str(merged)), cpuinfer=14, threadpools=1)
    got = parse_in_image(full_image, cmd.argv)
    assert got["model_path"] == merged == got["kt_weight_path"]
    assert got["kt_method"] == "BF16" and got["kt_num_gpu_experts"] == 0
    assert not got["enable_lora"] and not got["lora_paths"]
