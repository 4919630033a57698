"""`ktdeploy image save --format squashfs|sif`: the runtime's own tool converts (enroot import, apptainer build); where
it is missing, or more than one build is asked for, the command says so with the fix and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.controller.images.runtime_files import convert_argv, save_for_runtime
from ktdeploy.core.errors import ImageError, UsageError

REPO = Path(__file__).resolve().parents[3]


def test_the_runtimes_own_tools_convert():
    assert convert_argv("squashfs", "/usr/bin/enroot", "ktsft:amx", Path("/s/k.sqsh")) == [
        "/usr/bin/enroot", "import", "--output", "/s/k.sqsh", "dockerd://ktsft:amx"]
    assert convert_argv("sif", "/usr/bin/apptainer", "ktsft:amx", Path("/s/k.sif")) == [
        "/usr/bin/apptainer", "build", "/s/k.sif", "docker-daemon:ktsft:amx"]


def test_one_build_per_file_and_a_missing_tool_named(tmp_path, monkeypatch):
    with pytest.raises(UsageError) as e:
        save_for_runtime("sif", ["ktsft:amx", "ktsft:avx2"], tmp_path / "k.sif")
    assert e.value.key == "--isa"
    monkeypatch.setenv("PATH", str(tmp_path))      # no enroot here
    with pytest.raises(ImageError) as e:
        save_for_runtime("squashfs", ["ktsft:amx"], tmp_path / "k.sqsh")
    assert "enroot is not installed" in e.value.message and "registry" in e.value.fix
    assert not (tmp_path / "k.sqsh").exists()


def test_the_cli_refuses_an_unknown_format(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ktdeploy", "image", "save", "--format", "zip", "--isa", "amx", "-o",
                        str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 2 and "--format" in r.stderr and "Traceback" not in r.stderr
