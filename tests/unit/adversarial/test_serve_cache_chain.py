"""The serve caches' folder chain (Probe 3's F13): a chain another user made (theirs, open to all, a link) is
refused; one of our own is made private."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


# -- F13: the serve caches' chain ------------------------------------------------------------------------------------
@pytest.mark.skipif(os.getuid() != 0, reason="planting a folder as another user needs root")
@pytest.mark.parametrize("plant", ["foreign-cache", "open-cache", "linked-cache"])
def test_f13_a_cache_chain_another_user_made_is_refused(tmp_path, plant):
    from ktdeploy.agent.serve import cache_env
    from ktdeploy.agent.sglang_launch import main

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)
    cache = home / ".cache"
    if plant == "foreign-cache":        # made first by uid 4242, open to them
        cache.mkdir()
        os.chown(cache, 4242, 4242)
    elif plant == "open-cache":         # ours, but anyone may rename what is inside
        cache.mkdir()
        os.chmod(cache, 0o777)
    else:                               # a link to a folder of another user
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4242, 4242)
        cache.symlink_to(theirs)
    env = cache_env({"HOME": str(home)}, uid=os.getuid())
    old = dict(os.environ)
    os.environ.update(env)
    try:
        assert main(["--model-path", "/nonexistent"]) == 2
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert not list(cache.iterdir()) if cache.is_dir() else True
    assert not any(p.name.startswith("ktdeploy-") for p in (tmp_path / "theirs").glob("*")) \
        if (tmp_path / "theirs").exists() else True


def test_f13_an_own_cache_chain_is_made_private(tmp_path):
    from ktdeploy.agent.serve import cache_env
    from ktdeploy.agent.sglang_launch import _prepare_caches

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)
    env = cache_env({"HOME": str(home)}, uid=os.getuid())
    _prepare_caches(env)
    for key in ("SGLANG_KT_LORA_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        st = os.lstat(env[key])
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
