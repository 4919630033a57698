"""`python -m ktdeploy.controller.facts_probes build DIR` (image build time) compiles every probe by name."""

import os
import shutil
import subprocess
import sys

import pytest

from ktdeploy.controller import facts_probes


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="needs a C compiler")
def test_build_command_compiles_each_probe_by_name(tmp_path):
    # PROBES was once rebound to (name, field, parser, model) tuples, so this command passed tuples as names
    r = subprocess.run([sys.executable, "-m", "ktdeploy.controller.facts_probes", "build", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == sorted(facts_probes.PROBES) == ["amx_probe", "numa_probe"]
    assert all(os.access(tmp_path / n, os.X_OK) for n in facts_probes.PROBES)
