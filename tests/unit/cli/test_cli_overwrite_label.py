"""A file that would be overwritten is exit 6 (README's table) and is said as what it is — OverwriteRefused, with
the --force fix — not as a "RunRecordError" (a newcomer re-running `render -o out` has no run record in sight)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)})


def test_render_twice_and_from_lf_twice_say_overwrite_refused(tmp_path):
    recipe = str(ROOT / "recipes" / "tiny-moe-lora.yaml")
    assert cli("render", recipe, "-o", "out", cwd=tmp_path).returncode == 0
    again = cli("render", recipe, "-o", "out", cwd=tmp_path)
    assert again.returncode == 6 and again.stderr.startswith("OverwriteRefused:"), again.stderr
    assert "--force" in again.stderr and "RunRecordError" not in again.stderr
    lf = [str(tmp_path / "out" / "train.yaml"), str(tmp_path / "out" / "accelerate.yaml"), "-o", "r.yaml"]
    assert cli("recipe", "from-lf", *lf, cwd=tmp_path).returncode == 0
    again = cli("recipe", "from-lf", *lf, cwd=tmp_path)
    assert again.returncode == 6 and again.stderr.startswith("OverwriteRefused:"), again.stderr
    assert "--force" in again.stderr
