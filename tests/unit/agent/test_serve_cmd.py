"""ktdeploy serve: the sglang-kt argv from the recipe and host facts (no shell, loopback, key from env)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.agent.serve import build_serve_command
from ktdeploy.core.errors import UsageError
from ktdeploy.core.kt_methods import require_serve_method as kt_method
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.served import Served

ROOT = Path(__file__).resolve().parents[3]


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_tiny_recipe_command():
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml")
    c = build_serve_command(r, Served("adapter", "/out/tiny-sglang"), cpuinfer=14, threadpools=1,
                            environ={"HOME": "/tmp"}, uid=4242)
    a = c.argv
    assert a[:3] == ["python3", "-m", "ktdeploy.agent.sglang_launch"]
    assert flag(a, "--model-path") == r.train["model_name_or_path"] == flag(a, "--kt-weight-path")
    assert flag(a, "--host") == "127.0.0.1" and flag(a, "--kt-method") == "AMXBF16"
    assert flag(a, "--kt-num-gpu-experts") == "0" and flag(a, "--kt-cpuinfer") == "14"
    assert flag(a, "--lora-paths") == "tiny-lora=/out/tiny-sglang" and "--enable-lora" in a
    assert int(flag(a, "--max-running-requests")) >= 2 and flag(a, "--tp-size") == "1"
    assert "--api-key" not in a and c.env == {
        "CUDA_VISIBLE_DEVICES": "0", "HOME": "/tmp",
        "SGLANG_KT_LORA_CACHE_DIR": "/tmp/.cache/ktdeploy-4242/sglang-kt-lora",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/.cache/ktdeploy-4242/torchinductor"}


@pytest.mark.parametrize("setup,lora,want", [
    ("bf16", True, "AMXBF16"), ("bf16", False, "BF16"), ("fp8", True, "FP8"), ("int8", True, "AMXINT8"),
    ("int4", True, "AMXINT4"), ("amxint4", True, "AMXINT4")])
def test_kt_method(setup, lora, want):
    assert kt_method(setup, lora=lora) == want


@pytest.mark.parametrize("setup", ["fp8", "int8", "int4", "mxfp4"])
def test_no_full_finetune_method_outside_bf16(setup):
    with pytest.raises(UsageError) as ei:
        kt_method(setup, lora=False)
    assert ei.value.key == "train.kt_config.kt_expert_weight_format"


def test_cache_env_never_needs_the_user_name():
    """sglang-kt names its LoRA cache after getpass.getuser() unless SGLANG_KT_LORA_CACHE_DIR is set."""
    from ktdeploy.agent.serve import cache_env

    assert cache_env({"HOME": "/"}, uid=4242)["HOME"] == "/tmp"              # docker's HOME for an unknown uid
    assert cache_env({}, uid=7)["SGLANG_KT_LORA_CACHE_DIR"] == "/tmp/.cache/ktdeploy-7/sglang-kt-lora"
    mine = cache_env({"HOME": "/tmp", "SGLANG_KT_LORA_CACHE_DIR": "/srv/cache"}, uid=7)
    assert mine["SGLANG_KT_LORA_CACHE_DIR"] == "/srv/cache"                 # the operator's choice wins


def test_a_lora_is_not_served_by_a_build_without_sft_kernels():
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml")
    with pytest.raises(UsageError, match="no SFT kernels") as ei:
        build_serve_command(r, Served("adapter", "/a"), cpuinfer=4, threadpools=1, kt_build="avx512_vnni")
    assert ei.value.key == "deploy.image"
    assert build_serve_command(r, Served("adapter", "/a"), cpuinfer=4, threadpools=1, kt_build="avx512_bf16").argv


def test_int8_recipe_uses_converted_weights():
    r = load_recipe(ROOT / "recipes/qwen3-235b-int8-lora.yaml")
    c = build_serve_command(r, Served("adapter", "/a"), cpuinfer=60, threadpools=2)
    assert flag(c.argv, "--kt-weight-path") == r.train["kt_weight_path"]
    assert flag(c.argv, "--kt-method") == "AMXINT8" and flag(c.argv, "--kt-threadpool-count") == "2"


def test_api_key_from_env_is_redacted(monkeypatch):
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.api_key_env=KTDEPLOY_MY_KEY"])
    with pytest.raises(UsageError, match="KTDEPLOY_MY_KEY"):
        build_serve_command(r, Served("adapter", "/a"), cpuinfer=4, threadpools=1)
    monkeypatch.setenv("KTDEPLOY_MY_KEY", "top secret; rm -rf /")
    c = build_serve_command(r, Served("adapter", "/a"), cpuinfer=4, threadpools=1)
    assert "--api-key" not in c.argv and not any("top secret" in a for a in c.argv)  # never in an argv
    assert c.env["KTDEPLOY_API_KEY_ENV"] == "KTDEPLOY_MY_KEY" and "top secret" not in repr(c.env)
    assert "top secret" not in c.shell()


def _run_launcher(tmp_path, monkeypatch, argv_env_key=True):
    """Run the serve argv as a real subprocess against the sglang TEST DOUBLE; returns its report."""
    import json
    import os
    import subprocess
    import sys

    secret = "sk-ktd-" + os.urandom(8).hex()
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.api_key_env=KTDEPLOY_TEST_KEY"])
    monkeypatch.setenv("KTDEPLOY_TEST_KEY", secret)
    # HOME: this test's folder, where the launcher makes its cache folders (never the session's home)
    c = build_serve_command(r, Served("adapter", "/out/tiny-sglang"), cpuinfer=2, threadpools=1, python=sys.executable,
                            environ={**os.environ, "HOME": str(tmp_path)})
    report = tmp_path / "report.json"
    env = {**os.environ, **c.env, "FAKE_SGLANG_SECRET": secret, "FAKE_SGLANG_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests/fakes/sglang_pkg"), str(ROOT)])}
    p = subprocess.run(c.argv, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(report.read_text()), secret


def test_no_process_cmdline_holds_the_api_key(tmp_path, monkeypatch):
    got, secret = _run_launcher(tmp_path, monkeypatch)
    assert got["child_alive"] and got["child_pid"] != got["self_pid"]   # the scan ran with a spawned child up
    assert got["argv_holders"] == []                                    # no /proc/*/cmdline holds the key
    assert got["api_key_set"]                                           # ... and the server still has it
    assert got["enable_lora"] and got["lora_paths"] == ["tiny-lora=/out/tiny-sglang"]


def test_launcher_refuses_a_key_on_the_command_line(monkeypatch):
    from ktdeploy.agent.sglang_launch import main

    assert main(["--model-path", "/m", "--api-key", "k"]) == 2
    assert main(["--model-path", "/m", "--api-key=k"]) == 2
    for spelling in ("--api-ke", "--api", "--API-KEY=k", "--admin-api-key", "--hf-token"):  # argparse abbreviations too
        assert main(["--model-path", "/m", spelling, "k"]) == 2, spelling


def test_secret_option_spots_every_spelling_and_nothing_else():
    from ktdeploy.core.safeio import secret_option

    assert all(secret_option(a) for a in ("--api-key", "--api-k=x", "--admin-api-key", "--hf-token", "--db-password"))
    assert not any(secret_option(a) for a in ("--max-total-tokens", "--skip-tokenizer-init", "--a", "--apix",
                                              "api-key", "--model-path", 5))


def test_launcher_refuses_a_named_but_unset_key(monkeypatch):
    from ktdeploy.agent.sglang_launch import main

    monkeypatch.setenv("KTDEPLOY_API_KEY_ENV", "KTD_UNSET_KEY")
    monkeypatch.delenv("KTD_UNSET_KEY", raising=False)
    with pytest.raises(SystemExit) as ei:
        main(["--model-path", "/m"])
    assert ei.value.code == 2


def test_full_finetune_serves_the_weights_without_lora():
    r = load_recipe(ROOT / "recipes/glm-4.5-air-bf16-full.yaml")
    c = build_serve_command(r, Served("weights", "/data/output/glm-full"), cpuinfer=60, threadpools=2,
                            kt_build="avx512_vnni")   # a full fine-tune is served in inference mode: any build
    assert flag(c.argv, "--model-path") == "/data/output/glm-full" == flag(c.argv, "--kt-weight-path")
    # without a LoRA sglang-kt hands --kt-method to KTMoEWrapper(mode="inference"): BF16, never AMXBF16
    assert flag(c.argv, "--kt-method") == "BF16"
    assert not {"--enable-lora", "--lora-paths", "--lora-backend", "--max-loras-per-batch"} & set(c.argv)
    with pytest.raises(UsageError):
        build_serve_command(r, Served.one_of("/a", weights="/w"), cpuinfer=4, threadpools=1)


def test_extra_args_and_paths_stay_single_items():
    r = load_recipe(ROOT / "recipes/tiny-moe-lora.yaml", ["deploy.serve.extra_args=['--context-length', '4096']"])
    c = build_serve_command(r, Served("adapter", "/dir with space/a'b"), cpuinfer=4, threadpools=1)
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


def test_merged_model_is_served_as_bf16_without_lora():
    """A merged model is BF16 whatever the training format: --kt-method BF16 (sglang-kt's inference-mode method for
    plain BF16 experts) even for an AMXINT4 recipe on an AMX host, model and KT weights from the merged folder."""
    for name in ("tiny-moe-lora.yaml", "qwen35-397b-amxint4-lora.yaml", "deepseek-v3-fp8-lora.yaml"):
        r = load_recipe(ROOT / "recipes" / name)
        c = build_serve_command(r, Served("merged", "/out/run-merged"), cpuinfer=14, threadpools=1)
        assert flag(c.argv, "--model-path") == "/out/run-merged" == flag(c.argv, "--kt-weight-path"), name
        assert flag(c.argv, "--kt-method") == "BF16", name
        assert not {"--enable-lora", "--lora-paths", "--lora-backend", "--max-loras-per-batch"} & set(c.argv)
    with pytest.raises(UsageError, match="exactly one"):
        build_serve_command(r, Served.one_of("/a", merged="/m"), cpuinfer=4, threadpools=1)


def test_cli_merged_needs_a_published_merge(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = [sys.executable, "-m", "ktdeploy", "serve", str(ROOT / "recipes/tiny-moe-lora.yaml"), "--merged",
            str(tmp_path), "--kt-cpuinfer", "8", "--kt-threadpool-count", "1", "--print", "--json"]
    env = {**__import__("os").environ, "COLUMNS": "200"}
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 2 and "ktdeploy merge" in p.stderr
    (tmp_path / "ktdeploy_merge.json").write_text("{}")
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    argv = json.loads(p.stdout)["argv"]
    assert argv[argv.index("--kt-method") + 1] == "BF16" and "--enable-lora" not in argv
