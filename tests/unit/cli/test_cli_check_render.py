"""`ktdeploy check` / `ktdeploy render` through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ktdeploy.cli import main
from tests.unit.core.recipe.conftest import RECIPES


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_check_valid_exit_0(capsys):
    code, out, _ = run_cli(["check", str(RECIPES / "tiny-moe-lora.yaml")], capsys)
    assert code == 0
    assert "valid" in out


def test_check_invalid_exit_2_json(tmp_path, capsys):
    text = (RECIPES / "tiny-moe-lora.yaml").read_text().replace("overwrite_output_dir: false", "overwrite_output_dir: true")
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    code, out, _ = run_cli(["check", str(p), "--json"], capsys)
    assert code == 2
    data = json.loads(out)
    assert data["valid"] is False
    (f,) = [f for f in data["findings"] if f["severity"] == "error"]
    assert f["path"] == "train.overwrite_output_dir"
    assert f["file"] == str(p)
    assert text.splitlines()[f["line"] - 1].strip() == "overwrite_output_dir: true"


def test_check_garbage_yaml_is_clean_error(tmp_path, capsys):
    p = tmp_path / "g.yaml"
    p.write_text("train:\n  a: [1,\n")
    code, out, err = run_cli(["check", str(p)], capsys)
    assert code == 2
    assert "not valid YAML" in err
    assert "Traceback" not in out + err


def test_check_missing_file_exit_2(capsys):
    code, _, err = run_cli(["check", "/nonexistent/recipe.yaml"], capsys)
    assert code == 2
    assert "no such file" in err


def test_set_override_applies(capsys):
    code, out, _ = run_cli(["check", str(RECIPES / "tiny-moe-lora.yaml"), "--json", "--set", "accelerate.num_processes=2"],
                           capsys)
    assert code == 2
    assert "deploy.gpus" in {f["path"] for f in json.loads(out)["findings"]}
    code, _, _ = run_cli(["check", str(RECIPES / "tiny-moe-lora.yaml"), "--set", "accelerate.num_processes=2",
                          "--set", "deploy.gpus=[0,1]"], capsys)
    assert code == 0


def test_bad_set_syntax_is_usage_error(capsys):
    code, _, err = run_cli(["check", str(RECIPES / "tiny-moe-lora.yaml"), "--set", "cutoff_len=5"], capsys)
    assert code == 2
    assert "SECTION.KEY=VALUE" in err


def test_render_is_byte_identical_and_round_trips(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        code, _, _ = run_cli(["render", str(RECIPES / "qwen35-397b-bf16-lora.yaml"), "-o", str(d)], capsys)
        assert code == 0
    for name in ("train.yaml", "accelerate.yaml", "launch.sh"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    launch = (a / "launch.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=0,1" in launch
    assert "accelerate launch --main_process_port 0 --config_file accelerate.yaml -m llamafactory.launcher train.yaml" in launch
    code, _, _ = run_cli(["check", "--train", str(a / "train.yaml"), "--accelerate", str(a / "accelerate.yaml")], capsys)
    assert code == 0
    # the rendered training YAML holds exactly the recipe's train section
    from ruamel.yaml import YAML

    from ktdeploy.core.recipe import load_recipe

    assert YAML(typ="safe").load((a / "train.yaml").read_text()) == load_recipe(RECIPES / "qwen35-397b-bf16-lora.yaml").train


def test_native_pair_reports_file_of_each_section(tmp_path, capsys):
    run_cli(["render", str(RECIPES / "tiny-moe-lora.yaml"), "-o", str(tmp_path)], capsys)
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(acc.read_text() + "kt_config:\n  kt_backend: auto\n")
    code, out, _ = run_cli(["check", "--train", str(tmp_path / "train.yaml"), "--accelerate", str(acc), "--json"], capsys)
    assert code == 2
    (f,) = [f for f in json.loads(out)["findings"] if f["path"] == "accelerate.kt_config"]
    assert f["file"] == str(acc)


def test_render_refuses_invalid_recipe(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text((RECIPES / "tiny-moe-lora.yaml").read_text().replace("num_processes: 1", "num_processes: 3"))
    code, _, err = run_cli(["render", str(p), "-o", str(tmp_path / "out")], capsys)
    assert code == 2
    assert "deploy.gpus" in err
    assert not (tmp_path / "out").exists()


def test_console_script_runs_without_traceback(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("- just\n- a list\n")
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "check", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "mapping" in r.stderr


def test_rendered_yaml_reads_the_same_under_yaml_1_1(tmp_path, capsys):
    """LlamaFactory (OmegaConf) and Accelerate load with PyYAML, a YAML 1.1 reader: `save_strategy: no` unquoted
    is the boolean false there and the run dies in TrainingArguments (seen on the GPU machine)."""
    import yaml as pyyaml
    from ruamel.yaml import YAML

    from ktdeploy.core.recipe.render import dump_yaml

    tricky = {"a": "no", "b": "On", "c": "y", "d": "1:30", "e": "0755", "f": "1_000", "g": "~", "h": "2026-12-02",
              "i": "0x1F", "j": ".5", "k": "OFF", "l": "plain", "m": "0o17", "n": "1e3", "o": "", "p": 5, "q": True,
              "r": None, "s": 1.5, "t": ["yes", "n"], "u": {"v": "off"}}
    text = dump_yaml(tricky)
    assert pyyaml.safe_load(text) == tricky
    assert YAML(typ="safe", pure=True).load(text) == tricky
    # --set reads a value as LlamaFactory reads it (OmegaConf.from_cli is YAML 1.1 too): bare `no` is false,
    # which TrainingArguments' SaveStrategy rejects; the check says to quote it.
    code, out, err = run_cli(["render", str(RECIPES / "tiny-moe-lora.yaml"), "-o", str(tmp_path / "bad"),
                              "--set", "train.save_strategy=no"], capsys)
    assert code == 2 and "train.save_strategy" in out + err and "quote" in out + err
    code, _, _ = run_cli(["render", str(RECIPES / "tiny-moe-lora.yaml"), "-o", str(tmp_path / "r"),
                          "--set", "train.save_strategy='no'"], capsys)
    assert code == 0
    train = (tmp_path / "r" / "train.yaml").read_text()
    assert "save_strategy: 'no'" in train
    assert pyyaml.safe_load(train)["save_strategy"] == "no"


def test_model_config_goes_with_stack(capsys):
    code, out, err = run_cli(["check", str(RECIPES / "tiny-moe-lora.yaml"), "--model-config",
                              str(RECIPES / "models" / "tiny-qwen3-moe.json")], capsys)
    assert code == 2 and "--model-config" in out + err and "add --stack" in out + err
