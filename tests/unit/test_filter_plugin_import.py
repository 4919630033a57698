"""The ansible filter plugin loads without importing ktdeploy: ansible loads every filter plugin in each forked
worker of each task, so an import at load time is paid once per task per host (it was half of the controller's
CPU in a 16-host preflight). ktdeploy comes in when a ktdeploy filter is first called."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("kf", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    loaded = sorted(m for m in sys.modules if m.startswith("ktdeploy"))
    filters = mod.FilterModule().filters()
    argv = filters["ktdeploy_doctor_argv"](filters["ktdeploy_settings"]({"ktdeploy_waive_checks": ["gpu.present"]}))
    print(json.dumps({"at_load": loaded, "after_call": "ktdeploy.core.host_settings" in sys.modules, "argv": argv}))
""")


def test_loading_the_filter_plugin_imports_no_ktdeploy_module():
    import json

    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "ansible" / "filter_plugins" / "ktdeploy_settings.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["at_load"] == []
    assert out["after_call"] is True
    assert "--waive=gpu.present" in out["argv"]
