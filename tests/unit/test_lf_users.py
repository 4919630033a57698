"""What LlamaFactory and SkyPilot users expect: `up`/`train` take the native --train/--accelerate pair, `recipe
from-lf` turns their YAML into a recipe (never over a file), `--sync-model/--sync-data` upload a folder
(resumable, checked by size and SHA-256, never into a model folder with other content), and runs have names."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from ktdeploy.cli.events_view import plain_lines
from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.controller.runs import RunRecord, latest_run
from ktdeploy.controller.sync import PARTIAL, sync_folder
from ktdeploy.controller.up_inputs import check_run_name
from ktdeploy.core.errors import StepError, UsageError
from ktdeploy.core.events import Mark, Said, Synced
from tests.fakes.image import image_archive

REPO = Path(__file__).resolve().parents[2]
FACTS = str(REPO / "examples/facts/gpu-h200-1gpu.json")


def cli(*args, home: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                          timeout=180, cwd=cwd)


@pytest.fixture
def lf_pair(tmp_path) -> tuple[Path, Path]:
    """The tiny recipe's two sections as a LlamaFactory user has them: two plain YAML files."""
    from ktdeploy.core.recipe import load_recipe

    r = load_recipe(REPO / "recipes/tiny-moe-lora.yaml")   # its host paths made absolute under deploy.root
    y = YAML()
    with open(tmp_path / "train.yaml", "w") as f:
        y.dump(r.train, f)
    with open(tmp_path / "accelerate.yaml", "w") as f:
        y.dump(r.accelerate, f)
    return tmp_path / "train.yaml", tmp_path / "accelerate.yaml"


def test_recipe_from_lf_writes_a_valid_recipe_and_never_overwrites(tmp_path, lf_pair):
    t, a = lf_pair
    r = cli("recipe", "from-lf", str(t), str(a), "-o", "mine.yaml", home=tmp_path, cwd=tmp_path)
    assert r.returncode == 0 and "mine.yaml is valid" in r.stdout, r.stdout + r.stderr
    doc = YAML(typ="safe").load((tmp_path / "mine.yaml").read_text())
    assert doc["deploy"]["volumes"] == {"model": "/srv/ktdeploy/models", "data": "/srv/ktdeploy/data",
                                        "output": "/srv/ktdeploy/output"}
    assert doc["deploy"]["gpus"] == [0] and doc["train"]["kt_config"]["kt_backend"] == "auto"
    before = (tmp_path / "mine.yaml").read_bytes()
    again = cli("recipe", "from-lf", str(t), str(a), "-o", "mine.yaml", home=tmp_path, cwd=tmp_path)
    err = " ".join(again.stderr.split())
    assert again.returncode == 6 and f"{tmp_path / 'mine.yaml'} exists; not overwritten" in err, err
    assert f"ktdeploy recipe from-lf {t} {a} -o mine.yaml --force" in err and "-o FILE" in err, err
    assert (tmp_path / "mine.yaml").read_bytes() == before


def test_recipe_from_lf_force_replaces_it_whole_or_not_at_all(tmp_path, lf_pair):
    t, a = lf_pair
    assert cli("recipe", "from-lf", str(t), str(a), "-o", "mine.yaml", home=tmp_path, cwd=tmp_path).returncode == 0
    before = (tmp_path / "mine.yaml").read_bytes()
    t.write_text(t.read_text().replace("learning_rate: 0.0001", "learning_rate: 0.0002"))
    r = cli("recipe", "from-lf", str(t), str(a), "-o", "mine.yaml", "--force", home=tmp_path, cwd=tmp_path)
    assert r.returncode == 0 and "Next: ktdeploy plan mine.yaml" in " ".join(r.stdout.split()), r.stdout + r.stderr
    assert "HOST" not in r.stdout   # the next step is a command to run, not a placeholder
    assert YAML(typ="safe").load((tmp_path / "mine.yaml").read_text())["train"]["learning_rate"] == 0.0002
    # the safe writer leaves no temporary file behind
    assert {p.name for p in tmp_path.iterdir()} <= {"accelerate.yaml", "mine.yaml", "train.yaml", "runs"}
    # refused before anything is written (a secret in the training YAML): the recipe there stays whole
    now = (tmp_path / "mine.yaml").read_bytes()
    assert now != before
    t.write_text(t.read_text() + "hub_token: hf_abcdefghijklmnopqrstuvwxyz0123456789\n")
    r = cli("recipe", "from-lf", str(t), str(a), "-o", "mine.yaml", "--force", home=tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and (tmp_path / "mine.yaml").read_bytes() == now, r.stderr
    # a link planted where the recipe goes is never followed, --force or not
    (tmp_path / "victim.yaml").write_text("keep\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "victim.yaml")
    t.write_text(t.read_text().replace("hub_token: hf_abcdefghijklmnopqrstuvwxyz0123456789\n", ""))
    r = cli("recipe", "from-lf", str(t), str(a), "-o", "link.yaml", "--force", home=tmp_path, cwd=tmp_path)
    assert r.returncode != 0 and (tmp_path / "victim.yaml").read_text() == "keep\n", r.stderr


def test_recipe_from_lf_with_the_training_yaml_alone(tmp_path, lf_pair):
    t, _ = lf_pair
    r = cli("recipe", "from-lf", str(t), home=tmp_path, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = YAML(typ="safe").load((tmp_path / "train-recipe.yaml").read_text())
    assert doc["accelerate"]["fsdp_config"]["fsdp_version"] == 2 and doc["accelerate"]["num_processes"] == 1


def test_recipe_from_lf_reports_what_it_cannot_derive(tmp_path, lf_pair):
    t, a = lf_pair
    text = t.read_text().replace("/srv/ktdeploy/output/tiny-moe-lora", "saves/tiny")
    t.write_text(text)
    r = cli("recipe", "from-lf", str(t), str(a), home=tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and (tmp_path / "train-recipe.yaml").exists(), r.stdout
    assert "train.output_dir is not an absolute host path" in r.stdout
    recipe = tmp_path / "x-recipe.yaml"
    recipe.write_text((REPO / "recipes/tiny-moe-lora.yaml").read_text())
    r = cli("recipe", "from-lf", str(recipe), home=tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and "is a ktdeploy recipe already" in " ".join(r.stderr.split())


def test_up_and_train_take_the_native_pair(tmp_path, lf_pair):
    t, a = lf_pair
    r = cli("up", "--host", "gpu01", "--train", str(t), "--accelerate", str(a), "--dry-run", "--facts", FACTS,
            "--image-tar", str(image_archive(tmp_path / "ktsft.tar")), home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "docker create --name ktd-train-" in r.stdout and "source=/srv/ktdeploy/models" in r.stdout
    r = cli("up", "--host", "gpu01", "--train", str(t), home=tmp_path)
    assert r.returncode == 2 and "--train and --accelerate go together" in r.stderr
    r = cli("up", "--host", "gpu01", str(REPO / "recipes/tiny-moe-lora.yaml"), "--train", str(t), "--accelerate",
            str(a), home=tmp_path)
    assert r.returncode == 2 and "either a RECIPE or --train/--accelerate" in r.stderr
    r = cli("train", "--train", str(t), "--accelerate", str(a), "--dry-run", "--skip-doctor", home=tmp_path)
    assert r.returncode == 0 and "accelerate.commands.launch" in r.stdout and "kt_config" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------- --sync-model / --sync-data (this machine)

def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


MODEL = {"config.json": b'{"model_type": "qwen3_moe"}', "tokenizer.json": b"{}",
         "model.safetensors": os.urandom(300_000), "sub/extra.txt": b"x"}


def test_sync_uploads_checks_and_skips_what_is_there(tmp_path):
    src = _folder(tmp_path / "local", MODEL)
    target = tmp_path / "host" / "models" / "m"
    said: list = []
    res = sync_folder(LocalConnector(), str(src), str(target), role="model", emit=said.append)
    assert res.files == 4 and res.copied == 4
    for name, data in MODEL.items():
        assert (target / name).read_bytes() == data
    assert not (target / PARTIAL).exists()
    assert [type(e) for e in said] == [Said, Synced] and said[0].mark is Mark.GO and said[-1].record() == {**res.to_json(), "dry_run": False}
    assert plain_lines(said[-1])[0].endswith("checked by size and SHA-256")
    said.clear()
    again = sync_folder(LocalConnector(), str(src), str(target), role="model", emit=said.append)
    assert again.copied == 0 and [type(e) for e in said] == [Synced]   # checked, nothing sent


def test_sync_never_writes_into_a_model_folder_with_other_content(tmp_path):
    src = _folder(tmp_path / "local", MODEL)
    target = _folder(tmp_path / "host", {"theirs.safetensors": b"someone else's"})
    with pytest.raises(UsageError) as ei:
        sync_folder(LocalConnector(), str(src), str(target), role="model")
    assert "theirs.safetensors (not in the local folder)" in ei.value.message
    assert sorted(p.name for p in target.iterdir()) == ["theirs.safetensors"]   # nothing was copied


def test_sync_finds_a_file_of_the_same_size_with_other_content(tmp_path):
    src = _folder(tmp_path / "local", MODEL)
    forged = bytearray(MODEL["model.safetensors"])
    forged[100] ^= 0xFF
    target = _folder(tmp_path / "host", {"model.safetensors": bytes(forged)})
    with pytest.raises(StepError) as ei:
        sync_folder(LocalConnector(), str(src), str(target), role="data")
    assert "holds other content" in ei.value.message and "model.safetensors" in ei.value.message
    assert (target / "model.safetensors").read_bytes() == bytes(forged)   # never replaced


def test_sync_resumes_a_file_cut_off_mid_copy(tmp_path):
    """What an interrupted rsync leaves (--partial-dir): the file's first bytes under .ktdeploy-partial; the next
    run finishes it and the result is checked by hash."""
    src = _folder(tmp_path / "local", MODEL)
    target = tmp_path / "host"
    (target / PARTIAL).mkdir(parents=True)
    (target / PARTIAL / "model.safetensors").write_bytes(MODEL["model.safetensors"][:100_000])
    res = sync_folder(LocalConnector(), str(src), str(target), role="model")
    assert res.copied == 4
    digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    assert digest == hashlib.sha256(MODEL["model.safetensors"]).hexdigest()
    assert not (target / PARTIAL).exists()


def test_sync_in_a_dry_run_copies_nothing(tmp_path):
    src = _folder(tmp_path / "local", MODEL)
    said: list = []
    sync_folder(LocalConnector(), str(src), str(tmp_path / "host"), role="model", dry_run=True, emit=said.append)
    assert [type(e) for e in said] == [Said, Synced] and said[0].mark is Mark.NOT and said[-1].dry_run and plain_lines(said[-1]) == []
    assert not (tmp_path / "host").exists() and "would upload 4 of 4 file(s)" in plain_lines(said[0])[0]


# ---------------------------------------------------------------- named runs

def _run(root: Path, name: str, host: str, container: str) -> RunRecord:
    rec = RunRecord.create(name, root=root)
    rec.set_status("finished", name=name, host=host, container=container, created=time.time(), recipe="r")
    return rec


def test_run_names_are_validated_unique_and_found_by_status(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    rec = _run(tmp_path / "runs", "qwen-v1", "gpu01", "ktd-a-1")
    for bad in ("../x", "a b", "-x", "x" * 65, ""):
        with pytest.raises(UsageError):
            check_run_name(bad, "gpu01", "ktd-a-1")
    check_run_name("qwen-v1", "gpu01", "ktd-a-1")          # the same job again keeps its name
    with pytest.raises(UsageError, match="has that name"):
        check_run_name("qwen-v1", "gpu02", "ktd-a-1")       # another host's run
    assert latest_run(run_id="qwen-v1").id == rec.id
    r = cli("up", "--host", "gpu01", "--name", "a b", "--dry-run", "--facts", FACTS, home=tmp_path)
    assert r.returncode == 2 and "--name" in r.stderr
