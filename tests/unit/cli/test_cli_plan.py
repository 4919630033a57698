"""`ktdeploy plan` through the real console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktdeploy.cli import main

REPO = Path(__file__).resolve().parents[3]
RECIPES = REPO / "recipes"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_shipped_recipe_plans_out_of_the_box(recipe, capsys):
    code, out, err = run_cli(["plan", str(RECIPES / recipe), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert {"host_memory_gib", "gpu_memory_gib_per_gpu", "disk_gib", "breakdown"} <= set(d)
    assert d["host_memory_gib"] > 0 and d["gpu_memory_gib_per_gpu"] > 0 and d["disk_gib"] > 0
    assert all({"name", "gib", "explanation", "resource"} <= set(t) for t in d["breakdown"])
    host = sum(t["gib"] for t in d["breakdown"] if t["resource"] == "host")
    assert host == pytest.approx(d["host_memory_gib"], abs=0.05)


def test_gpus_option_changes_per_gpu_memory(capsys):
    recipe = str(RECIPES / "qwen35-397b-bf16-lora.yaml")
    _, out2, _ = run_cli(["plan", recipe, "--json"], capsys)
    _, out4, _ = run_cli(["plan", recipe, "--json", "--gpus", "4"], capsys)
    assert json.loads(out4)["gpu_memory_gib_per_gpu"] < json.loads(out2)["gpu_memory_gib_per_gpu"]


def test_amxint4_recipe_needs_less_host_than_bf16(capsys):
    _, bf16, _ = run_cli(["plan", str(RECIPES / "qwen35-397b-bf16-lora.yaml"), "--json"], capsys)
    _, int4, _ = run_cli(["plan", str(RECIPES / "qwen35-397b-amxint4-lora.yaml"), "--json"], capsys)
    assert json.loads(int4)["host_memory_gib"] < 0.5 * json.loads(bf16)["host_memory_gib"]


def test_explain_lists_terms(capsys):
    code, out, _ = run_cli(["plan", str(RECIPES / "deepseek-v3-fp8-lora.yaml"), "--explain"], capsys)
    assert code == 0
    assert "routed experts (fp8)" in out and "KT forward cache" in out and "checkpoints" in out
    assert "routed experts (CPU GEMM)" in out      # the time terms too


def _rows(out: str) -> dict[str, str]:
    """The summary's rows: label -> its text (continuation lines joined)."""
    rows: dict[str, str] = {}
    label = ""
    for line in out.splitlines():
        head, text = line[:13].strip(), line[13:].strip()
        label = head or label
        rows[label] = f"{rows.get(label, '')} {text}".strip()
    return rows


def test_the_default_is_the_figures_and_a_verdict(capsys):
    recipe = str(RECIPES / "tiny-moe-lora.yaml")
    code, out, _ = run_cli(["plan", recipe, "--samples", "400"], capsys)
    _, full, _ = run_cli(["plan", recipe, "--json", "--samples", "400"], capsys)
    d = json.loads(full)
    assert code == 0 and len(out.splitlines()) <= 20, out   # at 80 columns, the full path twice
    assert "KT forward cache" not in out and "┃" not in out          # no term tables
    rows = _rows(out)
    assert set(rows) >= {"recipe", "host memory", "GPU memory", "disk", "time", "verdict"}, rows
    from ktdeploy.core.sizing.calibration import band
    host = d["error_band"]["host"]
    assert rows["host memory"].startswith(f"{d['host_memory_gib']:.1f} GiB peak RSS ± {band('host', 1) * 100:.1f} %")
    assert f"{host['upper_edge_gib']:.1f} GiB" in rows["host memory"]
    assert rows["GPU memory"].startswith(f"{d['gpu_memory_gib_per_gpu']:.1f} GiB per GPU ± {band('gpu', 1) * 100:.1f} %")
    t = d["throughput"]
    assert rows["time"].startswith(f"{t['tokens_per_s']['value']:.1f} tokens/s ± {t['band'] * 100:.0f} %")
    assert f"{t['steps']} steps:" in rows["time"] and "reference host" in rows["time"]
    assert rows["verdict"].startswith(f"needs {host['upper_edge_gib']:.1f} GiB of available host memory")
    assert f"ktdeploy doctor --recipe {recipe}" in rows["verdict"]
    assert f"ktdeploy plan {recipe} --explain" in " ".join(out.split())


def test_with_facts_the_verdict_is_doctors_plan_checks(capsys):
    facts = str(REPO / "examples/facts/gpu-h200-1gpu.json")
    code, out, _ = run_cli(["plan", str(RECIPES / "tiny-moe-lora.yaml"), "--facts", facts], capsys)
    assert code == 0 and _rows(out)["verdict"].startswith("fits this host"), out
    code, out, _ = run_cli(["plan", str(RECIPES / "qwen35-397b-bf16-lora.yaml"), "--facts", facts], capsys)
    verdict = _rows(out)["verdict"]
    assert code == 0 and verdict.startswith("does not fit this host: plan.host_memory"), out
    assert "short by" in verdict and "fix:" in verdict


def test_a_host_without_a_gpu_does_not_fit(capsys, tmp_path):
    d = json.loads((REPO / "examples/facts/gpu-h200-1gpu.json").read_text())
    d["facts"]["gpu"] = {"nvidia_smi": "missing", "error": "nvidia-smi: command not found", "gpus": [],
                         "device_nodes": []}
    facts = tmp_path / "cpu-only.json"
    facts.write_text(json.dumps(d))
    code, out, _ = run_cli(["plan", str(RECIPES / "tiny-moe-lora.yaml"), "--facts", str(facts)], capsys)
    verdict = _rows(out)["verdict"]
    assert code == 0 and verdict.startswith("does not fit this host: gpu.present"), out


def test_json_is_the_same_with_or_without_explain(capsys):
    recipe = str(RECIPES / "qwen3-235b-int8-lora.yaml")
    _, a, _ = run_cli(["plan", recipe, "--json"], capsys)
    _, b, _ = run_cli(["plan", recipe, "--json", "--explain"], capsys)
    assert json.loads(a) == json.loads(b) and {"host_memory_gib", "throughput", "error_band"} <= set(json.loads(a))


def test_explicit_model_config_and_unknown_architecture(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}))
    code, out, err = run_cli(["plan", str(RECIPES / "tiny-moe-lora.yaml"), "--model-config", str(cfg)], capsys)
    assert code == 2
    assert "LlamaForCausalLM" in err and "num_experts_per_tok" in err and "Traceback" not in err


def test_missing_model_config_is_a_one_screen_error(tmp_path, capsys):
    text = (RECIPES / "tiny-moe-lora.yaml").read_text().replace(
        "model_name_or_path: models/tiny-qwen3-moe", "model_name_or_path: models/no-such-model")
    p = tmp_path / "r.yaml"
    p.write_text(text)
    code, _, err = run_cli(["plan", str(p)], capsys)
    assert code == 2 and "--model-config" in err and "Traceback" not in err


def test_each_figure_carries_its_calibration_band(capsys):
    from ktdeploy.core.sizing.calibration import band
    recipe = str(RECIPES / "qwen35-397b-bf16-lora.yaml")
    _, out, _ = run_cli(["plan", recipe, "--json"], capsys)
    d = json.loads(out)
    n = d["setup"]["num_processes"]
    for res, key in (("host", "host_memory_gib"), ("gpu", "gpu_memory_gib_per_gpu")):
        eb = d["error_band"][res]
        assert eb["setting"] == ("multi-GPU" if n > 1 else "single-GPU")
        assert eb["band"] == pytest.approx(band(res, n), abs=1e-4)
        # the band is printed to 4 decimals and the figure to 2: both roundings bound the difference
        assert eb["upper_edge_gib"] == pytest.approx(d[key] * (1 + eb["band"]), rel=1e-4, abs=0.02)
    _, human, _ = run_cli(["plan", recipe], capsys)
    assert f"± {band('host', n) * 100:.1f} %" in human and "upper edge" in human
    _, one, _ = run_cli(["plan", str(RECIPES / "tiny-moe-lora.yaml"), "--json", "--gpus", "1"], capsys)
    assert json.loads(one)["error_band"]["gpu"]["setting"] == "single-GPU"


def test_explain_counts_a_tiny_models_parameters_in_millions(capsys):
    """The tiny recipe's --explain said "0.0 B params, 0.0 B in routed experts" (a random 33 M model)."""
    _, out, _ = run_cli(["plan", str(RECIPES / "tiny-moe-lora.yaml"), "--explain"], capsys)
    flat = " ".join(out.split())
    assert "0.0 B" not in flat and " M params" in flat and " M in routed experts" in flat, flat[:300]
    _, big, _ = run_cli(["plan", str(RECIPES / "deepseek-v3-fp8-lora.yaml"), "--explain"], capsys)
    assert " B params" in " ".join(big.split())
