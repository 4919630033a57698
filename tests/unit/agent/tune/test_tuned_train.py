from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def test_train_applies_tune_record_without_touching_the_recipe(tmp_path):
    recipe = REPO / "recipes" / "tiny-moe-lora.yaml"
    before = recipe.read_bytes()
    record = tmp_path / "tune.json"
    record.write_text(json.dumps({"chosen": {"kt_num_threads": 6, "kt_threadpool_count": 1,
                                             "kt_cpu_activation": "retain"}}))
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "train", str(recipe), "--skip-doctor", "--dry-run", "--json",
                        "--tuned", str(record), "--run-root", str(tmp_path / "runs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    lines = [line.strip() for line in plan["train_yaml"].splitlines()]
    assert "kt_num_threads: 6" in lines
    assert "kt_threadpool_count: 1" in lines
    assert "kt_cpu_activation: retain" in lines
    assert plan["tuned"]["chosen"]["kt_num_threads"] == 6 and plan["tuned"]["source"] == str(record)
    assert recipe.read_bytes() == before


def test_the_run_record_says_which_tune_choice_it_trained_with(tmp_path):
    from ktdeploy.agent.train import plan_train, write_record
    from ktdeploy.agent.tune.session import tuned_choice, tuned_overrides

    record = tmp_path / "tune.json"
    record.write_text(json.dumps({"chosen": {"kt_num_threads": 12, "kt_threadpool_count": 1},
                                  "chosen_tokens_per_s": 928.0, "speedup_vs_all_cores": 1.77}))
    vol = tmp_path / "output"
    sets = [f"deploy.volumes.output={vol}", f"train.output_dir={vol}/run", *tuned_overrides(record)]
    plan = plan_train(str(REPO / "recipes" / "tiny-moe-lora.yaml"), sets, skip_doctor=True,
                      run_root=str(tmp_path / "runs"), tuned=tuned_choice(record))
    d = write_record(plan)
    assert json.loads((d / "tuned.json").read_text())["chosen"] == {"kt_num_threads": 12, "kt_threadpool_count": 1}
    assert json.loads((d / "command.json").read_text())["tuned"]["speedup_vs_all_cores"] == 1.77
    assert "  kt_num_threads: 12" in (d / "train.yaml").read_text().splitlines()


def test_train_rejects_a_bad_tune_record(tmp_path):
    bad = tmp_path / "tune.json"
    bad.write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "train", str(REPO / "recipes" / "tiny-moe-lora.yaml"),
                        "--skip-doctor", "--dry-run", "--tuned", str(bad)], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 2
    assert "not a tune record" in r.stderr and "Traceback" not in r.stderr
