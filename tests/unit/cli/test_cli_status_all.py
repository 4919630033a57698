"""`ktdeploy status --all` prints run ids whole (they are what --run takes), at 80 columns and wide."""

import os
import re
import subprocess
import sys

import pytest

from ktdeploy.controller import runs

LONG = "glm-4.5-air-bf16-lora-long-recipe-name-here"


@pytest.mark.parametrize("columns", [80, 100, 240])
def test_status_all_prints_every_id_and_container_whole(tmp_path, monkeypatch, columns):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    ids = []
    for i in range(2):
        r = runs.RunRecord.create(LONG)
        r.set_status("detached", host="ssh://someuser@gpu-host-number-01.example.org:2222", recipe=LONG,
                     container="ktd-glm-4.5-air-bf16-lora-0123456789ab", created=float(i))
        ids.append(r.id)
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "status", "--all"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": str(columns)}, timeout=60)
    assert p.returncode == 0, p.stderr
    assert all(len(line) <= columns for line in p.stdout.splitlines()), p.stdout
    tokens = set(re.split(r"[\s│┃]+", p.stdout))
    for rid in ids:
        assert rid in tokens, p.stdout           # whole, as one token: --run accepts what was printed
        assert runs.latest_run(run_id=rid).id == rid
    assert "ktd-glm-4.5-air-bf16-lora-0123456789ab" in tokens
