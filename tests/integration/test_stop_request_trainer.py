"""lf_entry's SaveOnStopRequest against transformers' real Trainer, in the full ktsft image (the training entry
point's own callback, not the test double's copy of its contract): a stop request during step 7 makes the Trainer
save checkpoint-7 at that step's end and training ends there with StoppedAfterSave (nothing after trainer.train()
runs: LlamaFactory's final save and results never happen); a new Trainer resumes from exactly checkpoint-7; two real
processes (gloo) agree to stop when only one of them saw the request. Skips where no full image is on this engine
(CI builds only the reduced images); stop_request_trainer.py is what runs inside it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.full_image import find_full_image

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
CANDIDATES = ("ktsft:amx", "ktsft:avx512_bf16", "ktsft:avx512_vbmi", "ktsft:avx512_vnni", "ktsft:avx512_base",
              "ktsft:avx2")


def test_save_on_stop_request_with_the_real_trainer(tmp_path):
    image = find_full_image(CANDIDATES)
    if image is None:
        pytest.skip("no full ktsft image with torch and transformers on this engine (ktdeploy image build --stack full)")
    tmp_path.chmod(0o777)
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--name",
                        f"{os.environ.get('KTDEPLOY_TEST_PREFIX', 'ktd')}-stoptest-{os.getpid()}",
                        "-v", f"{REPO}:/opt/ktdeploy-wt:ro", "-v", f"{tmp_path}:/work", "--env",
                        "PYTHONPATH=/opt/ktdeploy-wt", "--env", "CUDA_VISIBLE_DEVICES=", "--entrypoint",
                        "/opt/venv/bin/python", image, "/opt/ktdeploy-wt/tests/integration/stop_request_trainer.py",
                        "/work"], capture_output=True, text=True, timeout=900)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(line[len("RESULT "):])
    assert r["stopped"] == [7, "/work/out/checkpoint-7"] and r["steps_run"] == list(range(1, 8)), r
    assert r["marker"] == {"step": 7, "checkpoint": "/work/out/checkpoint-7", "reason": "USR1"}
    assert r["out"] == ["checkpoint-7"] and r["checkpoint_step"] == 7        # nothing but the requested checkpoint
    assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(r["checkpoint_files"])
    assert r["resumed_steps"] == [8, 9, 10]                                 # exactly where it stopped
    assert r["ranks_agree"] == [True, True]
    print(f"\nreal Trainer (transformers {r['transformers']}, torch {r['torch']}): saved at 7, resumed at 8")
