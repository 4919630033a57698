"""Issue 45, class 2: `merge -o` in a shared folder never adopts a staging folder another user made.

The staging folder's name is predictable (``.<name>.ktdeploy-merge`` beside the output). A real second user
(tests/unit/adversarial/conftest.py's ``intruder``, acting in a child that setuid()s to them) makes it first in a
folder everyone may create in, as /tmp: with a journal and a forged shard whose SHA-256 the journal records (a
resume used to publish it as "kept from the interrupted merge"), or empty (the published model used to belong to
them). Root merges. Root only: skipped elsewhere, saying why."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from ktdeploy.agent.merge import MergeError, merge
from ktdeploy.agent.merge import run as mr
from ktdeploy.agent.merge.run import JOURNAL, MERGE_MANIFEST, STAGING_SUFFIX
from tests.fakes import kt_layout as kl
from tests.unit.adversarial.second_user import as_intruder
from tests.unit.agent.merge.test_merge import MINI, _plan_identity


@pytest.fixture
def pair(tmp_path):
    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2)
    kl.write_lora_adapter(str(tmp_path / "out"), base=str(tmp_path / "base"), m=MINI, seed=3)
    clean = merge(tmp_path / "out", tmp_path / "base", tmp_path / "clean")
    assert clean.kept_shards == 0
    return tmp_path / "out", tmp_path / "base", tmp_path / "clean"


def _forgery(pair) -> tuple[str, bytes, str]:
    """(shard name, forged bytes of the planned size, a journal naming them with their SHA-256)."""
    out, base, clean = pair
    name = sorted(p.name for p in clean.glob("*.safetensors"))[0]
    forged = bytearray((clean / name).read_bytes())
    forged[-2] ^= 0x55
    man = json.loads((clean / MERGE_MANIFEST).read_text())
    journal = {"plan": _plan_identity(out, base, mr),
               "shards": {name: {"size": len(forged), "sha256": hashlib.sha256(forged).hexdigest(),
                                 "input_sha256": man["base"]["files"][name]["sha256"]}}}
    return name, bytes(forged), json.dumps(journal)


def _plant(intruder, staging: Path, pair, mode: str = "0777") -> tuple[str, bytes]:
    """As the intruder: the staging folder (if missing), a journal and the forged shard in it."""
    name, forged, journal = _forgery(pair)
    as_intruder(intruder, '{ [ -d "$1" ] || { mkdir "$1" && chmod "$2" "$1"; }; } && cat > "$1/$3"', str(staging), mode, JOURNAL,
                stdin=journal)
    as_intruder(intruder, 'cat > "$1/$2"', str(staging), name, stdin=forged)
    return name, forged


def _untouched(staging: Path, name: str, forged: bytes) -> None:
    assert (staging / name).read_bytes() == forged and (staging / JOURNAL).exists()


def test_a_staging_folder_another_user_made_with_a_forged_shard_is_never_published(pair, intruder, shared_folder):
    staging = shared_folder / f".m{STAGING_SUFFIX}"
    name, forged = _plant(intruder, staging, pair)
    with pytest.raises(MergeError) as err:
        merge(pair[0], pair[1], shared_folder / "m")
    assert "belongs to" in err.value.message and "never adopted" in err.value.message and err.value.fix
    assert not (shared_folder / "m").exists()
    _untouched(staging, name, forged)


def test_an_empty_staging_folder_another_user_made_is_never_adopted(pair, intruder, shared_folder):
    """Root may write in anyone's folder: the model published from it used to belong to the other user."""
    staging = shared_folder / f".m{STAGING_SUFFIX}"
    as_intruder(intruder, 'mkdir -m 0700 "$1"', str(staging))
    with pytest.raises(MergeError, match="belongs to"):
        merge(pair[0], pair[1], shared_folder / "m")
    assert not (shared_folder / "m").exists() and os.stat(staging).st_uid == intruder[0]
    assert not list(staging.iterdir())


def test_my_staging_folder_others_may_write_is_refused(pair, intruder, shared_folder):
    """Root's own folder, left group/world-writable (an older ktdeploy, a umask of 0): the other user planted in it."""
    staging = shared_folder / f".m{STAGING_SUFFIX}"
    staging.mkdir()
    os.chmod(staging, 0o777)
    name, forged = _plant(intruder, staging, pair)
    with pytest.raises(MergeError, match="may be written by others"):
        merge(pair[0], pair[1], shared_folder / "m")
    assert not (shared_folder / "m").exists()
    _untouched(staging, name, forged)


@pytest.mark.parametrize("how", ["journal owned by the intruder", "shard owned by the intruder",
                                 "shard hard-linked from elsewhere", "journal is a link"])
def test_a_journal_or_shard_i_did_not_write_is_not_trusted(pair, intruder, tmp_path, how):
    """My private staging folder, but a journal or shard in it I did not write (copied in with its owner, a hard
    link to a file elsewhere): nothing of it is kept; the merge equals a clean one."""
    staging = tmp_path / f".m{STAGING_SUFFIX}"
    staging.mkdir(mode=0o700)
    name, forged, journal = _forgery(pair)
    (staging / name).write_bytes(forged)
    (staging / JOURNAL).write_text(journal)
    if how == "journal owned by the intruder":
        os.chown(staging / JOURNAL, *intruder)
    elif how == "shard owned by the intruder":
        os.chown(staging / name, *intruder)
    elif how == "shard hard-linked from elsewhere":
        os.link(staging / name, tmp_path / "elsewhere")
    else:
        (tmp_path / "journal.json").write_text(journal)
        (staging / JOURNAL).unlink()
        (staging / JOURNAL).symlink_to(tmp_path / "journal.json")
    s = merge(pair[0], pair[1], tmp_path / "m")
    assert s.kept_shards == 0
    assert json.loads((tmp_path / "m" / MERGE_MANIFEST).read_text())["output"]["files"] == \
        json.loads((pair[2] / MERGE_MANIFEST).read_text())["output"]["files"]
    assert (tmp_path / "m" / name).read_bytes() != forged


def test_staging_is_private_until_published(pair, tmp_path):
    """Made exclusively with mode 0700 (what the merge writes is nobody else's to read or change meanwhile), then
    published as a folder of this user's umask."""
    modes: list[int] = []
    staging = tmp_path / f".m{STAGING_SUFFIX}"

    def say(_msg: str) -> None:
        if staging.exists():
            modes.append(stat.S_IMODE(os.stat(staging).st_mode))

    old = os.umask(0o022)
    try:
        merge(pair[0], pair[1], tmp_path / "m", say=say)
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o700}, [oct(m) for m in modes]
    assert stat.S_IMODE(os.stat(tmp_path / "m").st_mode) == 0o755
