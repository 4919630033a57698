"""`ktdeploy tiny-model` leaves nothing behind when it fails (no torch on a controller, or a failure mid-build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.agent.tiny import _staged

REPO = Path(__file__).resolve().parents[3]
HIDE_ML = "import sys\nfor m in ('torch', 'transformers', 'tokenizers'): sys.modules[m] = None\n" \
          "from ktdeploy.cli import main\nmain(sys.argv[1:])\n"


def test_tiny_model_without_torch_leaves_no_folder(tmp_path):
    model, data = tmp_path / "new" / "models" / "tiny", tmp_path / "new" / "data"
    p = subprocess.run([sys.executable, "-c", HIDE_ML, "tiny-model", str(model), "--data-dir", str(data)],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "120"}, timeout=120)
    err = " ".join(p.stderr.split())
    assert p.returncode == 2 and "needs torch" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
    # what it is doing is said before torch loads (seconds in the image, silent before): stderr, stdout stays JSON
    assert err.startswith(f"tiny-model: building a random Qwen3-MoE in {model}"), err


def test_a_failure_mid_build_removes_the_partial_folder_and_the_parents_it_made(tmp_path):
    target = tmp_path / "a" / "b" / "tiny"
    with pytest.raises(RuntimeError), _staged(target) as tmp:
        (tmp / "tokenizer.json").write_text("{}")
        raise RuntimeError("out of disk while saving the weights")
    assert list(tmp_path.iterdir()) == []


def test_success_renames_whole_or_replaces_files_in_an_existing_folder(tmp_path):
    target = tmp_path / "tiny"
    with _staged(target) as tmp:
        (tmp / "config.json").write_text("1")
    assert (target / "config.json").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["tiny"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask   # not mkdtemp's 0700: the training user reads it
    (target / "keep.txt").write_text("user file")
    with _staged(target) as tmp:
        (tmp / "config.json").write_text("2")
    assert (target / "config.json").read_text() == "2" and (target / "keep.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_published_files_are_readable_by_the_training_user(tmp_path):
    """safetensors writes 0600; the image trains as another uid than the one that built the model."""
    target = tmp_path / "tiny"
    with _staged(target) as tmp:
        f = tmp / "model.safetensors"
        f.write_bytes(b"x")
        os.chmod(f, 0o600)
    umask = os.umask(0)
    os.umask(umask)
    assert (target / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
