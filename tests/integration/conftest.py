"""Integration fixtures: test hosts (sshd containers) from tests/integration/hosts.py, and the reduced ktsft images
built from this checkout. Every test runs apart from the user's own state (tests/user_state.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.hosts import host_pool  # noqa: E402,F401  (session fixture)
from tests.user_state import pytest_sessionfinish, pytest_sessionstart  # noqa: E402,F401  (pytest hooks)

ROOT = Path(__file__).resolve().parents[2]
KTSFT_REDUCED_REPO = os.environ.get("KTSFT_REPO", "ktsft-reduced")


@pytest.fixture(scope="session")
def reduced_images():
    """ktsft-reduced:<build> for every kt-kernel build, built from THIS checkout by docker/ci-build-reduced.sh
    (idempotent: the layer cache makes a rebuild fast). Always run, never skipped when a tag exists: a tag left
    by an older checkout on the same engine holds an older ktdeploy (a CI try once judged today's code by one)."""
    if shutil.which("docker") is None or subprocess.run(["docker", "version"], capture_output=True).returncode != 0:
        pytest.fail("the docker integration tier needs a running docker engine")
    env = {**os.environ, "KTSFT_REPO": KTSFT_REDUCED_REPO,
           "KTDEPLOY_BASE_IMAGE": os.environ.get("KTDEPLOY_BASE_IMAGE", "ktdeploy/base:bookworm")}
    proc = subprocess.run(["bash", str(ROOT / "docker" / "ci-build-reduced.sh")], capture_output=True,
                          text=True, timeout=1500, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from ktdeploy.core import variants as V
    return {v: f"{KTSFT_REDUCED_REPO}:{v}" for v in V.NAMES}
