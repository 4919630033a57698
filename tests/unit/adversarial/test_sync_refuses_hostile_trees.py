"""--sync-model / --sync-data on hostile trees (Probe 3's F3, F4, F11, F15): a link out of the source is refused
and nothing is copied, a Hugging Face snapshot's blob links are followed, an upload larger than the free space is
refused before anything is made, odd names arrive intact and no partial state is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ktdeploy.core.errors import UsageError

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


# -- F3/F4/F11/F15: --sync-model / --sync-data ------------------------------------------------------------------------
def _src(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_f3_a_link_out_of_the_source_is_refused_and_nothing_is_copied(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.sync import sync_folder

    secret = _src(tmp_path / "home" / ".ssh", {"id_rsa": b"PRIVATE KEY"})
    for kind in ("file", "dir"):
        src = _src(tmp_path / f"model-{kind}", {"config.json": b"{}"})
        if kind == "file":
            (src / "tokenizer.json").symlink_to(secret / "id_rsa")
        else:
            (src / "extra").symlink_to(secret)
        target = tmp_path / f"host-{kind}" / "m"
        with pytest.raises(UsageError) as e:
            sync_folder(LocalConnector(), str(src), str(target), role="model")
        assert "outside the folder" in e.value.message and e.value.fix, e.value.message
        assert not target.exists()


def test_f3_a_hugging_face_snapshot_links_its_blobs(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.sync import sync_folder

    repo = tmp_path / "hub" / "models--org--m"
    _src(repo / "blobs", {"abc": b'{"model_type": "x"}'})
    snap = repo / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/abc")
    target = tmp_path / "host" / "m"
    sync_folder(LocalConnector(), str(snap), str(target), role="model")
    assert (target / "config.json").read_bytes() == b'{"model_type": "x"}' and not (target / "config.json").is_symlink()


def test_f4_an_upload_larger_than_the_free_space_is_refused_before_anything_is_made(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.sync import sync_folder
    from ktdeploy.core.errors import StepError

    src = _src(tmp_path / "data", {"a.json": b"[]"})
    st = os.statvfs(tmp_path)
    with open(src / "huge.bin", "wb") as f:     # sparse: larger than the free space by its size, no disk used
        f.truncate(st.f_bavail * st.f_frsize + (1 << 30))
    target = tmp_path / "host" / "data"
    with pytest.raises(StepError) as e:
        sync_folder(LocalConnector(), str(src), str(target), role="data")
    assert "free" in e.value.message and "df -h" in e.value.fix and e.value.exit_code == 4
    assert not target.exists()


def test_f11_f15_odd_names_arrive_intact_and_no_partial_state_is_left(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.sync import PARTIAL, sync_folder

    files = {"-rf": b"1", "--rsh=touch pwned": b"2", "-e x": b"3", "sub/--delete": b"4", "a'b\"c $(touch pwned)": b"5",
             " lead": b"6"}
    src = _src(tmp_path / "data", files)
    target = tmp_path / "host" / "data"
    (target / PARTIAL).mkdir(parents=True)          # left by an interrupted earlier upload
    sync_folder(LocalConnector(), str(src), str(target), role="data")
    for name, data in files.items():
        assert (target / name).read_bytes() == data, name
    assert not (target / PARTIAL).exists() and not (tmp_path / "pwned").exists()
    bad = _src(tmp_path / "bad", {"ok.json": b"{}"})
    (bad / "x\ny").write_bytes(b"")
    with pytest.raises(UsageError) as e:
        sync_folder(LocalConnector(), str(bad), str(tmp_path / "host" / "bad"), role="data")
    assert "control character" in e.value.message and not (tmp_path / "host" / "bad").exists()
