"""The walkthrough on a CPU-only host with the profile, over SSH, as a newcomer types it: the tiny model and its
data uploaded from this machine (`--sync-model`, `--sync-data`: rsync through pyinfra with the session's key and
known_hosts), `up --cpu-only` through to SERVE, the same command again, `status`, `down` — each output compared
with docs/testing.md's samples (tests/docs.py) — then what the upload promises: resumable, checked, never into a model
folder with other content.

Training runs the LlamaFactory TEST DOUBLE image (tests/fakes/fake_llamafactory.py: no torch, hence
--waive stack.torch, and no LlamaFactory/kt-kernel for the stack to judge the recipe, hence --waive stack.judge); this machine's docker may not raise RLIMIT_MEMLOCK (hence --waive docker.memlock). The
tiny model is tests/fakes/tiny_model.py's double of what `ktdeploy tiny-model` writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ktdeploy.agent.tiny import build_dataset  # noqa: E402
from ktdeploy.controller.sync import PARTIAL, sync_folder  # noqa: E402
from ktdeploy.core.errors import UsageError  # noqa: E402
from ktdeploy.core.events import Synced  # noqa: E402
from tests.docs import compare  # noqa: E402
from tests.fakes.image import build_fake_image  # noqa: E402
from tests.fakes.tiny_model import WEIGHTS_BYTES, write_tiny_model  # noqa: E402
from tests.integration.cpu_trains import needs_a_training_cpu  # noqa: E402
from tests.integration.hosts import docker, host_pool  # noqa: E402, F401

pytestmark = pytest.mark.docker

PROFILE = ["--cpu-only", "--waive", "docker.memlock", "--waive", "stack.torch", "--waive", "stack.judge"]


@pytest.fixture(scope="module")
def walk(host_pool, tmp_path_factory):  # noqa: F811
    # the host's volumes: under /tmp at the same path here and in the host (its docker is this machine's)
    root = Path(tempfile.mkdtemp(prefix="ktd-walk-it-", dir="/tmp"))
    (root / "out").mkdir()
    local = tmp_path_factory.mktemp("controller")   # what the newcomer has on their own machine
    write_tiny_model(local / "tiny-qwen3-moe")
    build_dataset(local / "data", 64)
    (local / "data" / "fake_step_seconds").write_text("0.05")
    home = tmp_path_factory.mktemp("ktdhome")
    image = build_fake_image()
    host = host_pool.start("walk", shared=[str(root)], extra=["--shm-size", "2g"])
    yield {"root": root, "local": local, "home": home, "image": image, "host": host, "pool": host_pool}
    ps = docker("ps", "-a", "--filter", "label=ktdeploy.output", "--format", '{{.ID}}\t{{.Label "ktdeploy.output"}}',
                check=False).stdout
    mine = [ln.split("\t")[0] for ln in ps.splitlines() if ln.split("\t")[-1].startswith(f"{root}/")]
    if mine:
        docker("rm", "-f", *mine, check=False)
    subprocess.run(["docker", "run", "--rm", "-v", f"{root}:{root}", "--entrypoint", "sh", image, "-c",
                    'rm -rf "$1"/* "$1"/.[!.]*', "-", str(root)], capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def cli(w, *args: str) -> subprocess.CompletedProcess:
    o = w["pool"].ssh_options()
    env = {**os.environ, "KTDEPLOY_HOME": str(w["home"]), "KTDEPLOY_POLL_S": "0.3",
           "COLUMNS": os.environ.get("KTDEPLOY_DOC_COLUMNS", "200")}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args, "--ssh-key", o["key"], "--known-hosts",
                           o["known_hosts"]], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


def sets(w) -> list[str]:
    r = w["root"]
    pairs = [f"deploy.volumes.model={r}/models", f"deploy.volumes.data={r}/data", f"deploy.volumes.output={r}/out",
             f"train.model_name_or_path={r}/models/tiny-qwen3-moe", f"train.dataset_dir={r}/data",
             f"train.output_dir={r}/out/tiny-moe-lora", f"deploy.image={w['image']}", "train.max_steps=20",
             "train.save_steps=10", "train.logging_steps=5", "deploy.serve.port=31020"]
    return [a for p in pairs for a in ("--set", p)]


@needs_a_training_cpu
def test_walkthrough_on_a_cpu_only_host_with_the_profile(walk):
    w, host = walk, walk["host"]
    up = ["up", "--host", host.target, "--name", "walk", *PROFILE, "--sync-model",
          str(w["local"] / "tiny-qwen3-moe"), "--sync-data", str(w["local"] / "data"), "--no-progress", *sets(w)]
    r = cli(w, *up)
    assert r.returncode == 0, r.stdout + r.stderr
    shown = {str(w["root"]): "/v", str(w["local"]): "~/ktd", str(w["home"]): "~/.local/share/ktdeploy"}
    compare("up-session", "docs/testing.md", r.stdout, shown)
    model = w["root"] / "models" / "tiny-qwen3-moe"
    assert (model / "model.safetensors").stat().st_size == WEIGHTS_BYTES
    assert json.loads((w["root"] / "data" / "dataset_info.json").read_text())["tiny_sft"]

    again = cli(w, *up)
    assert again.returncode == 0, again.stdout + again.stderr
    compare("up-again", "docs/testing.md", again.stdout, shown)
    assert "✓ SYNC: " in again.stdout and "→ SYNC" not in again.stdout   # checked again, nothing re-sent
    st = cli(w, "status", "--run", "walk")
    assert st.returncode == 0, st.stderr
    compare("status-finished", "docs/testing.md", st.stdout, shown)
    d = cli(w, "down", "--run", "walk")
    assert d.returncode == 0, d.stderr
    after = cli(w, "status", "--run", "walk").stdout
    assert "recorded state finished" in after and "containers stopped by `ktdeploy down`" in after, after


def test_the_upload_is_resumable_checked_and_never_into_anothers_model(walk):
    w, conn = walk, walk["host"].connect()
    try:
        src = w["local"] / "tiny-qwen3-moe"
        target = f"{w['root']}/models/resumed"
        # what an interrupted rsync leaves on the host: the first bytes of the big file in the partial dir
        partial = Path(target, PARTIAL)
        partial.mkdir(parents=True)
        with open(src / "model.safetensors", "rb") as f, open(partial / "model.safetensors", "wb") as g:
            g.write(f.read(1 << 20))
        said: list = []
        res = sync_folder(conn, str(src), target, role="model", emit=said.append)
        assert res.copied == res.files and isinstance(said[-1], Synced) and not said[-1].dry_run   # checked
        for p in src.iterdir():
            assert hashlib.sha256(Path(target, p.name).read_bytes()).digest() == hashlib.sha256(p.read_bytes()).digest()
        assert not partial.exists()
        # someone else's model folder: refused before anything is copied
        theirs = Path(w["root"], "models", "theirs")
        theirs.mkdir()
        (theirs / "pytorch_model.bin").write_bytes(b"theirs")
        with pytest.raises(UsageError, match="pytorch_model.bin"):
            sync_folder(conn, str(src), str(theirs), role="model", emit=said.append)
        assert sorted(p.name for p in theirs.iterdir()) == ["pytorch_model.bin"]
    finally:
        conn.close()
    # the CLI says the same (exit 2) and `up` stops before doctor
    r = cli(w, "up", "--host", w["host"].target, *PROFILE, "--sync-model", str(w["local"] / "tiny-qwen3-moe"),
            *sets(w), "--set", f"train.model_name_or_path={w['root']}/models/theirs", "--dry-run")
    assert r.returncode == 2 and "already holds other content" in " ".join(r.stderr.split()), r.stderr


def test_hostile_folder_names_reach_no_shell(walk, tmp_path):
    """pyinfra's rsync runs through a local shell: both paths are quoted, and -s keeps the host's shell away."""
    evil = "m; touch PWNED $(touch PWNED2) `touch PWNED3`"
    src = write_tiny_model(tmp_path / evil)
    target = f"{walk['root']}/models/{evil}"
    conn = walk["host"].connect()
    try:
        res = sync_folder(conn, str(src), target, role="model")
    finally:
        conn.close()
    assert res.files == len(list(src.iterdir())) and Path(target, "config.json").exists()
    for where in (tmp_path, Path.cwd(), REPO, Path(walk["root"]), Path(walk["root"], "models")):
        assert not list(where.glob("PWNED*")), where
    assert walk["host"].exec("sh", "-c", "ls / /root | grep -c PWNED", check=False).stdout.strip() == "0"
