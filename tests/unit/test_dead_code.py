"""No dead code in ktdeploy/: vulture (configured in pyproject.toml [tool.vulture]) reads ktdeploy/ and every
place that may use it (tests, tools, bench, ansible filter plugins, docker/); a finding in ktdeploy/ fails.
A name used only by a framework or kept as data goes into tools/dead_code_allowlist.py with its reason."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_dead_code_in_ktdeploy():
    r = subprocess.run([sys.executable, "-m", "vulture"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stderr    # 3: dead code found (anywhere); 1/2: vulture itself failed
    dead = [ln for ln in r.stdout.splitlines() if ln.startswith("ktdeploy/")]
    assert not dead, "dead code (remove it, or allow-list a framework's name with its reason):\n" + "\n".join(dead)


def test_the_check_finds_an_unused_function(tmp_path):
    (tmp_path / "mod.py").write_text("def used():\n    return 1\n\n\ndef never_called():\n    return 2\n\n\nused()\n")
    r = subprocess.run([sys.executable, "-m", "vulture", "--min-confidence", "60", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "never_called" in r.stdout and "'used'" not in r.stdout
