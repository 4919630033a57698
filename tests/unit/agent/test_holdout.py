"""agent/holdout.py: the trainer reads the training rows less the held-out ones; the split is published whole,
reused by a resumed run, and never overwritten by another."""

import json

import pytest

from ktdeploy.agent.holdout import carve
from ktdeploy.core.errors import RunRecordError, UsageError
from ktdeploy.core.eval import split as sp


def _data(tmp_path, n=40):
    d = tmp_path / "data"
    d.mkdir()
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(n)]
    (d / "s.json").write_text(json.dumps(rows))
    (d / "dataset_info.json").write_text(json.dumps({"s": {"file_name": "s.json"}}))
    return d, rows


def test_the_split_holds_disjoint_parts_and_a_manifest(tmp_path):
    d, rows = _data(tmp_path)
    out = tmp_path / "out" / "run"
    target = carve(str(d), ["s"], str(out), 0.25, 7)
    assert target == str(out) + "-holdout"
    info = json.loads((tmp_path / "out" / "run-holdout" / "dataset_info.json").read_text())
    assert info == {"s": {"file_name": "s.train.json"}, "s.holdout": {"file_name": "s.holdout.json"}}
    train = json.loads((tmp_path / "out" / "run-holdout" / "s.train.json").read_text())
    held = json.loads((tmp_path / "out" / "run-holdout" / "s.holdout.json").read_text())
    assert len(held) == 10 and len(train) == 30
    assert not {json.dumps(r) for r in train} & {json.dumps(r) for r in held}
    m = json.loads((tmp_path / "out" / "run-holdout" / sp.MANIFEST).read_text())
    assert m["seed"] == 7 and m["datasets"]["s"]["held"] == sorted(rows.index(r) for r in held)
    assert not list((tmp_path / "out").glob(".ktdeploy-holdout-*"))   # the staging folder is gone


def test_the_other_entries_stay_readable_from_the_split_folder(tmp_path):
    d, _ = _data(tmp_path)
    (d / "dataset_info.json").write_text(json.dumps({"s": {"file_name": "s.json"}, "ev": {"file_name": "ev.json"},
                                                     "hub": {"hf_hub_url": "x/y"}}))
    carve(str(d), ["s"], str(tmp_path / "out" / "run"), 0.25, 7)
    info = json.loads((tmp_path / "out" / "run-holdout" / "dataset_info.json").read_text())
    assert info["ev"] == {"file_name": str(d / "ev.json")} and info["hub"] == {"hf_hub_url": "x/y"}


def test_a_second_run_reuses_the_split_and_another_split_is_never_written_over(tmp_path):
    d, _ = _data(tmp_path)
    out = str(tmp_path / "out" / "run")
    carve(str(d), ["s"], out, 0.25, 7)
    before = (tmp_path / "out" / "run-holdout" / "s.train.json").read_bytes()
    assert carve(str(d), ["s"], out, 0.25, 7) == out + "-holdout"
    assert (tmp_path / "out" / "run-holdout" / "s.train.json").read_bytes() == before
    with pytest.raises(RunRecordError, match="never overwrites"):
        carve(str(d), ["s"], out, 0.25, 8)


def test_a_dry_run_writes_nothing_and_a_folder_dataset_is_refused(tmp_path):
    d, _ = _data(tmp_path)
    out = str(tmp_path / "out" / "run")
    assert carve(str(d), ["s"], out, 0.25, 7, write=False) == out + "-holdout"
    assert not (tmp_path / "out").exists()
    (d / "dir").mkdir()
    (d / "dataset_info.json").write_text(json.dumps({"s": {"file_name": "dir"}}))
    with pytest.raises(UsageError, match="is a folder"):
        carve(str(d), ["s"], out, 0.25, 7)


def test_train_points_the_trainer_at_the_split(tmp_path):
    """plan_train names the split (and writes nothing: a dry run leaves no folder); execute's carve writes it."""
    from ktdeploy.agent.train import ThisHost, carve_holdout, plan_train

    d, _ = _data(tmp_path)
    out = tmp_path / "out" / "run"
    sets = [f"train.dataset_dir={d}", "train.dataset=s", f"train.output_dir={out}", f"deploy.volumes.data={d}",
            f"deploy.volumes.output={tmp_path / 'out'}"]
    plan = plan_train("recipes/tiny-moe-lora.yaml", [*sets, "deploy.eval.holdout=5"], host=ThisHost(doctor=_no_doctor))
    assert f"dataset_dir: {out}-holdout" in plan.train_yaml and plan.holdout is not None
    assert not (tmp_path / "out").exists()
    carve_holdout(plan)
    assert len(json.loads((tmp_path / "out" / "run-holdout" / "s.holdout.json").read_text())) == 5
    plain = plan_train("recipes/tiny-moe-lora.yaml", sets, host=ThisHost(doctor=_no_doctor))
    assert plain.holdout is None and f"dataset_dir: {d}" in plain.train_yaml


def _no_doctor(recipe, skip):
    return {}, None, []


def test_the_gpu_proofs_task_splits_into_540_training_and_60_held_out_rows(tmp_path):
    """bench/gpu/eval_proof.py's dataset through the real carve, as `ktdeploy train` does on the GPU machine."""
    import sys
    from pathlib import Path

    sys.path[:0] = [str(Path(__file__).resolve().parents[3] / "bench" / "gpu")]
    import eval_proof

    eval_proof.write_task(tmp_path / "data")
    rows = json.loads((tmp_path / "data" / "add.json").read_text())
    assert len({json.dumps(r) for r in rows}) == eval_proof.ROWS and rows == eval_proof.task_rows()
    carve(str(tmp_path / "data"), ["add"], str(tmp_path / "out" / "p"), eval_proof.HOLDOUT, eval_proof.SEED)
    held = json.loads((tmp_path / "out" / "p-holdout" / "add.holdout.json").read_text())
    train = json.loads((tmp_path / "out" / "p-holdout" / "add.train.json").read_text())
    assert (len(train), len(held)) == (540, 60)
    assert all(r["output"] == f"The sum of {r['input'].replace(' + ', ' and ')} is {eval(r['input'])}." for r in held)
