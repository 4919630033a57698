"""`ktdeploy plan`'s time plan through the real entry point: JSON with bands, --facts, --tuned, clean errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.cli.test_cli_plan import run_cli

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes/tiny-moe-lora.yaml"
DOCTOR = REPO / "bench/results/gpu/proof/run_record/doctor.json"


def _json(capsys, *args):
    code, out, err = run_cli(["plan", str(RECIPE), "--json", *args], capsys)
    assert code == 0, err
    return json.loads(out)["throughput"]


def test_json_has_tokens_step_and_wall_time_with_bands(capsys):
    t = _json(capsys, "--samples", "400")
    for key in ("tokens_per_s", "step_s", "wall_time_s"):
        assert t[key]["low"] < t[key]["value"] < t[key]["high"], key
    assert t["steps"] and t["host"]["cores"] == 16 and t["breakdown"]
    assert all(term["resource"] in ("time", "wall") and "s" in term for term in t["breakdown"])


def test_facts_set_the_host(capsys, tmp_path):
    facts = json.loads(DOCTOR.read_text())
    facts["facts"]["cpu"]["physical_cores"] = 64
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(facts))
    ref = _json(capsys)
    big = _json(capsys, "--facts", str(p), "--set", "train.kt_config.kt_num_threads=60")
    assert big["host"]["cores"] == 64 and "doctor" in big["host"]["source"]
    assert big["tokens_per_s"]["value"] > ref["tokens_per_s"]["value"]


def test_tuned_on_the_same_recipe_uses_the_measurement(capsys, tmp_path):
    tune = json.loads((REPO / "bench/results/tune/tune.json").read_text())
    tune["recipe"] = str(RECIPE)
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(tune))
    t = _json(capsys, "--tuned", str(p))
    assert t["tokens_per_s"]["value"] == 928.0 and t["measured_tokens_per_s"] == 928.0
    assert t["predicted_tokens_per_s"] and t["band"] == 0.1
    code, out, _ = run_cli(["plan", str(RECIPE), "--tuned", str(p)], capsys)
    assert code == 0 and "measured" in out and "predicted" in out


def test_tuned_on_another_recipe_scales_the_prediction(capsys, tmp_path):
    tune = json.loads((REPO / "bench/results/tune/tune.json").read_text())
    tune["recipe"] = str(REPO / "recipes/tiny-moe-int8-lora.yaml")
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(tune))
    t = _json(capsys, "--tuned", str(p))
    assert t["measured_tokens_per_s"] != 928.0 and any("scaled by" in n for n in t["notes"])


@pytest.mark.parametrize("content,flag", [("not json", "--facts"), ('{"cpu": {}}', "--facts"), ("[]", "--facts"),
                                          ('{"chosen_tokens_per_s": null}', "--tuned")])
def test_bad_files_are_a_clean_error(capsys, tmp_path, content, flag):
    p = tmp_path / "x.json"
    p.write_text(content)
    code, out, err = run_cli(["plan", str(RECIPE), flag, str(p)], capsys)
    assert code not in (0, 70) and "Traceback" not in err + out
    assert "fix:" in err


def test_human_output_shows_the_band(capsys):
    code, out, _ = run_cli(["plan", str(RECIPE), "--samples", "400"], capsys)
    assert code == 0 and "tokens/s ±" in out and "steps:" in out


def test_short_samples_are_padded_as_estimated_or_as_given(capsys):
    filled = _json(capsys)
    est = _json(capsys, "--sample-tokens", "264")
    given = _json(capsys, "--sample-tokens", "264", "--padded-ratio", "1.8")
    assert [n for n in filled["notes"] if n.startswith("padding:")] == []
    assert any(n.startswith("padding:") and "1.35x" in n and "estimated" in n for n in est["notes"])
    assert any("1.80x" in n and "--padded-ratio" in n for n in given["notes"])
    assert given["step_s"]["value"] > est["step_s"]["value"]        # more padding, a longer step, same real tokens
    assert given["tokens_per_s"]["value"] < est["tokens_per_s"]["value"]


@pytest.mark.parametrize("args", [["--padded-ratio", "1.3"], ["--sample-tokens", "264", "--padded-ratio", "0.5"],
                                  ["--sample-tokens", "264", "--padded-ratio", "nan"]])
def test_a_padded_ratio_that_means_nothing_is_a_clean_error(capsys, args):
    code, out, err = run_cli(["plan", str(RECIPE), *args], capsys)
    assert code not in (0, 70) and "Traceback" not in err + out and "--padded-ratio" in err + out


def _run_record(home: Path, step_times: list[float], *, cores: int = 16, model: str | None = "current") -> str:
    """A run record as `up` leaves it: its host facts (facts.json) and the ETA of steps seen at ``step_times``
    (eta.json), both written by the code `up` uses."""
    from ktdeploy.controller.eta_plan import planned_eta
    from ktdeploy.controller.runs import RunRecord
    from ktdeploy.core.facts.host import HostFacts
    from ktdeploy.core.recipe import load_recipe

    doctor = json.loads(DOCTOR.read_text())["facts"]
    doctor["cpu"]["physical_cores"] = cores
    facts = HostFacts.model_validate(doctor)
    eta = planned_eta(load_recipe(RECIPE), facts)
    for step, t in enumerate(step_times, start=1):
        eta.update(step, t)
    if model != "current":
        eta.time_model = model
    rec = RunRecord.create("tiny-moe-lora", root=home / "runs")
    rec.write_json("facts.json", facts.model_dump(mode="json"))
    rec.write_json("eta.json", eta.record())
    rec.set_status("finished")
    return rec.id


def test_from_run_scales_the_plan_by_the_runs_measured_over_planned(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    plain = _json(capsys)
    planned = plain["step_s"]["value"]
    run = _run_record(tmp_path, [0.0, 2 * planned, 4 * planned])       # two steps of twice the planned time
    t = _json(capsys, "--from-run", run)
    assert t["step_s"]["value"] == pytest.approx(2 * planned, rel=0.01)
    assert t["tokens_per_s"]["value"] == pytest.approx(plain["tokens_per_s"]["value"] / 2, rel=0.01)
    assert t["predicted_tokens_per_s"] == pytest.approx(plain["tokens_per_s"]["value"], rel=0.01)
    assert t["band"] == 0.1 and any(f"run {run}" in n and "measured/plan 2.00" in n for n in t["notes"])
    assert f"run {run}'s host facts" in t["host"]["source"]


def test_from_run_plans_on_the_runs_host_unless_facts_say_otherwise(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    big = _run_record(tmp_path, [0.0, 1.0, 2.0], cores=64)
    assert _json(capsys, "--from-run", big)["host"]["cores"] == 64
    assert _json(capsys, "--from-run", big, "--facts", str(DOCTOR))["host"]["cores"] == 16


@pytest.mark.parametrize("times,model,says", [([0.0], "current", "measured no step time"),
                                              ([0.0, 1.0, 2.0], None, "did not name its time model"),
                                              ([0.0, 1.0, 2.0], "tm-000000000000", "another time model")])
def test_a_run_whose_ratio_does_not_apply_is_a_clean_error(capsys, tmp_path, monkeypatch, times, model, says):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    run = _run_record(tmp_path, times, model=model)
    code, out, err = run_cli(["plan", str(RECIPE), "--from-run", run], capsys)
    assert code == 2 and "Traceback" not in err + out
    err = " ".join(err.split())       # the error is wrapped to the terminal
    assert says in err and "--from-run" in err and "fix:" in err


@pytest.mark.parametrize("args,key", [(["--from-run", "nope"], "no run record matches"),
                                      (["--from-run", "../../etc"], "run"),
                                      (["--from-run", "x", "--tuned", str(DOCTOR)], "give one"),
                                      (["--from-run", "x", "--sample-tokens", "200"], "already carries")])
def test_from_run_refuses_what_it_cannot_use(capsys, tmp_path, monkeypatch, args, key):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    code, out, err = run_cli(["plan", str(RECIPE), *args], capsys)
    assert code not in (0, 70) and "Traceback" not in err + out and key in " ".join((err + out).split())


def _forged(home: Path, eta: object = None, facts: object = None) -> str:
    """A run record as `_run_record` writes it, then its eta.json and/or facts.json replaced by ``eta``/``facts``."""
    run = _run_record(home, [0.0, 1.0, 2.0])
    rec = home / "runs" / run
    for name, value in (("eta.json", eta), ("facts.json", facts)):
        if value is not None:
            (rec / name).write_text(json.dumps(value))
    return run


@pytest.mark.parametrize("planned,measured", [(1e-308, 1.0), (1e-300, 9.9e8), (9.9e8, 1e-300), (5e-324, 1e8),
                                              (1.0, 1e6), (1.0, 1e-6), (1.0, 101.0), (1e-4, 1e-4)])
def test_a_ratio_no_run_can_mean_is_refused(capsys, tmp_path, monkeypatch, planned, measured):
    """Found by an independent attack: these gave exit 70 (inf into the wall time), JSON with Infinity, a zero scale
    silently dropped, or figures a million times off."""
    from ktdeploy.core.sizing.throughput import time_model_id

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    run = _forged(tmp_path, eta={"planned_step_s": planned, "measured_step_s": measured, "time_model": time_model_id()})
    for extra in ([], ["--samples", "400"], ["--json", "--samples", "400"]):
        code, out, err = run_cli(["plan", str(RECIPE), "--from-run", run, *extra], capsys)
        assert code == 2 and "Traceback" not in err + out and "Infinity" not in out, (code, err[-300:])
        assert "outside what a run can mean" in " ".join(err.split())


def test_the_ratio_bounds_let_a_slow_or_fast_host_through(capsys, tmp_path, monkeypatch):
    from ktdeploy.core.sizing.throughput import time_model_id

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    for measured in (0.02, 50.0):       # 50x faster or slower than planned: a real host can be
        run = _forged(tmp_path, eta={"planned_step_s": 1.0, "measured_step_s": measured, "time_model": time_model_id()})
        t = _json(capsys, "--from-run", run, "--samples", "400")
        assert t["tokens_per_s"]["value"] == pytest.approx(_json(capsys)["tokens_per_s"]["value"] / measured, rel=0.01)


@pytest.mark.parametrize("cpu", [{"flags": [[1]], "physical_cores": 4}, {"flags": [{"a": 1}], "physical_cores": 4},
                                 {"flags": 5, "physical_cores": 4}, {"physical_cores": 10 ** 300},
                                 {"physical_cores": True}, {"physical_cores": 2, "numa_nodes": [{}] * 2000}])
def test_forged_host_facts_are_a_clean_error(capsys, tmp_path, monkeypatch, cpu):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    run = _forged(tmp_path, facts={"cpu": cpu})
    code, out, err = run_cli(["plan", str(RECIPE), "--from-run", run], capsys)
    assert code == 2 and "Traceback" not in err + out and "--from-run" in err
    p = tmp_path / "facts.json"                      # the same facts through --facts
    p.write_text(json.dumps({"cpu": cpu}))
    code, out, err = run_cli(["plan", str(RECIPE), "--facts", str(p)], capsys)
    assert code == 2 and "Traceback" not in err + out and "--facts" in err


def test_a_linked_eta_of_another_user_is_refused_like_the_file_itself(capsys, tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    run = _run_record(tmp_path, [0.0, 1.0, 2.0])
    rec = tmp_path / "runs" / run
    theirs = tmp_path / "theirs.json"
    theirs.write_text((rec / "eta.json").read_text())
    os.chown(theirs, 1234, 1234)
    (rec / "eta.json").unlink()
    (rec / "eta.json").symlink_to(theirs)
    code, out, err = run_cli(["plan", str(RECIPE), "--from-run", run], capsys)
    assert code == 6 and "uid 1234" in err and "--from-run" in err


@pytest.mark.parametrize("eta", [[1, 2], "x", 3])
def test_an_eta_that_is_not_an_object_says_so(capsys, tmp_path, monkeypatch, eta):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    run = _forged(tmp_path, eta=eta)
    code, _out, err = run_cli(["plan", str(RECIPE), "--from-run", run], capsys)
    assert code == 2 and "not an object" in err


def test_an_ambiguous_prefix_says_how_many_runs_it_names(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    _run_record(tmp_path, [0.0, 1.0, 2.0])
    _run_record(tmp_path, [0.0, 1.0, 2.0])
    code, _out, err = run_cli(["plan", str(RECIPE), "--from-run", "2"], capsys)
    assert code == 6 and "2 run records start with" in " ".join(err.split())


def test_a_cpuset_of_few_cores_on_a_host_of_many_nodes_is_a_host(capsys, tmp_path):
    """2 allowed CPUs on a host of 8 NUMA nodes (sub-NUMA clustering, memory-only nodes): real facts, planned."""
    facts = json.loads(DOCTOR.read_text())
    facts["facts"]["cpu"]["physical_cores"] = 2
    facts["facts"]["cpu"]["numa_nodes"] = [{"node": n} for n in range(8)]
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(facts))
    t = _json(capsys, "--facts", str(p))
    assert t["host"]["cores"] == 2 and t["host"]["numa_nodes"] == 8
