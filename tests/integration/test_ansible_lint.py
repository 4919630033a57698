"""The fleet playbooks pass ansible-lint (profile production, ansible/.ansible-lint) and --syntax-check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# No docker needed, but they belong to the integration tier (run-tests.sh selects it with -m docker).
pytestmark = pytest.mark.docker
ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed (pip install '.[fleet]')")
    return found


def run(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), NO_COLOR="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(list(argv), cwd=ANSIBLE, env=env, capture_output=True, text=True, timeout=300)


def test_site_yml_syntax_check():
    r = run(tool("ansible-playbook"), "--syntax-check", "-i", "inventory.example.yml", "site.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_example_inventory_parses_with_its_host_vars():
    r = run(tool("ansible-inventory"), "-i", "inventory.example.yml", "--host", "gpu03")
    assert r.returncode == 0, r.stderr
    assert '"ktsft_isa": "avx512_bf16"' in r.stdout and '"ktdeploy_gpus"' in r.stdout


def test_ansible_lint_production_profile():
    r = run(tool("ansible-lint"), "--offline", "--profile", "production", "--nocolor")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Profile 'production' was required, and it passed" in out
