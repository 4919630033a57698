"""The variant image config as data: commit changes and the `docker load` config say the same; the history of the
dependency image; the sparse load archive."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from ktdeploy.controller.images.image_config import (
    LAYER_COMMENT,
    commit_changes,
    history_entries,
    image_config,
    variant_settings,
)
from ktdeploy.controller.images.layer_load import LayerFile, restage, write_archive

GOLDEN = Path(__file__).parent / "golden" / "deps-history-reduced.jsonl"
DEPS_INSPECT = {
    "Architecture": "amd64", "Os": "linux",
    "Config": {"Env": ["LANG=C.UTF-8", "KTSFT_VARIANT=stale"], "Cmd": ["/bin/bash"], "User": "",
               "Labels": {"io.ktdeploy.base.suite": "bookworm"}},
    "RootFS": {"Type": "layers", "Layers": [f"sha256:{i:064x}" for i in range(1, 6)]},
}


def rows() -> list[dict]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines()]


def test_history_of_the_reduced_deps_image_marks_its_five_layers():
    # recorded from `docker history --no-trunc --human=false --format '{{json .}}'` of a reduced deps image
    h = history_entries(rows(), 5)
    assert len(h) == 14
    made = [e for e in h if not e.get("empty_layer")]
    assert len(made) == 5
    assert made[0]["created_by"] == "" and made[0]["comment"].startswith("debootstrap bookworm")  # oldest first
    assert "pip install" in made[-1]["created_by"]
    # the zero-byte RUN (nothing in the reduced stack's cuda part) and the WORKDIR that existed made no layer
    zero_run = [e for e in h if "cuda.lock" in e["created_by"]]
    assert zero_run and zero_run[0]["empty_layer"] is True


def test_history_that_cannot_be_matched_is_one_anonymous_entry_per_layer():
    # one more layer than the rows with bytes, two zero-byte candidates: which one made it is not guessed
    h = history_entries(rows(), 6)
    assert len(h) == 6 and not any(e.get("empty_layer") for e in h)
    assert all(e["created_by"].startswith("(dependency image layer") for e in h)
    # a count the zero-byte candidates do fill exactly: both made one
    h7 = history_entries(rows(), 7)
    assert sum(1 for e in h7 if not e.get("empty_layer")) == 7 and len(h7) == 14


def test_commit_changes_and_the_load_config_give_the_same_variant():
    labels = {"org.opencontainers.image.version": "9.9.9", "x": 'a" b'}
    settings = variant_settings("avx512_bf16", labels)
    changes = commit_changes("avx512_bf16", labels)
    cfg = image_config(DEPS_INSPECT, history_entries(rows(), 5), "sha256:" + "f" * 64, "2026-01-01T00:00:00Z",
                       settings)
    c = cfg["config"]
    env = dict(e.split("=", 1) for e in c["Env"])
    (env_change,) = [ch for ch in changes if ch.startswith("ENV ")]
    assert env_change == "ENV " + " ".join(f"{k}={v}" for k, v in settings.env.items())
    assert env["KTSFT_VARIANT"] == "avx512_bf16" == env["KT_KERNEL_CPU_VARIANT"]
    assert [e for e in c["Env"] if e.startswith("KTSFT_VARIANT=")] == ["KTSFT_VARIANT=avx512_bf16"]   # replaced
    assert f"USER {c['User']}" in changes and f"WORKDIR {c['WorkingDir']}" in changes
    assert f"ENTRYPOINT {json.dumps(c['Entrypoint'])}" in changes and f"CMD {json.dumps(c['Cmd'])}" in changes
    assert c["Labels"]["io.ktdeploy.isa"] == "avx512_bf16" and c["Labels"]["x"] == 'a" b'
    assert c["Labels"]["io.ktdeploy.base.suite"] == "bookworm"          # the base's labels stay
    assert cfg["rootfs"]["diff_ids"] == [*DEPS_INSPECT["RootFS"]["Layers"], "sha256:" + "f" * 64]
    assert cfg["history"][-1]["created_by"] == LAYER_COMMENT and not cfg["history"][-1].get("empty_layer")
    assert sum(1 for e in cfg["history"] if not e.get("empty_layer")) == len(cfg["rootfs"]["diff_ids"])
    # without settings: the dependency image's own config (the verification's image)
    plain = image_config(DEPS_INSPECT, [], "sha256:" + "f" * 64, "2026-01-01T00:00:00Z")
    assert plain["config"] == DEPS_INSPECT["Config"]


def _layer(tmp_path: Path) -> LayerFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("opt/ktdeploy/x")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    path = tmp_path / "layer.tar"
    path.write_bytes(buf.getvalue())
    return LayerFile(path, "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest(), ["/opt/ktdeploy/x"])


def test_the_archive_names_every_layer_but_carries_only_the_new_one(tmp_path):
    layer = _layer(tmp_path)
    cfgs = [(image_config(DEPS_INSPECT, [], layer.diff_id, "t", variant_settings(isa, {})), [f"r:{isa}"])
            for isa in ("amx", "avx2")]
    ids = write_archive(tmp_path / "a.tar", layer, cfgs)
    with tarfile.open(tmp_path / "a.tar") as t:
        names = t.getnames()
        manifest = json.loads(t.extractfile("manifest.json").read())  # type: ignore[union-attr]
        for entry, image_id in zip(manifest, ids, strict=True):
            raw = t.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
            assert "sha256:" + hashlib.sha256(raw).hexdigest() == image_id   # the image ID is the config's hash
            assert len(entry["Layers"]) == 6
    new = layer.diff_id.split(":")[1] + "/layer.tar"
    assert new in names and not any(n.endswith("layer.tar") and n != new for n in names)
    assert [m["RepoTags"] for m in manifest] == [["r:amx"], ["r:avx2"]]
    assert len(set(ids)) == 2
    with pytest.raises(ValueError):   # an image that does not end in the carried layer is refused
        write_archive(tmp_path / "b.tar", layer, [(image_config(DEPS_INSPECT, [], "sha256:" + "0" * 64, "t"), [])])


def test_restage_strips_the_stage_prefix_and_links_follow(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind in (("stage", tarfile.DIRTYPE), ("stage/opt", tarfile.DIRTYPE)):
            i = tarfile.TarInfo(name)
            i.type = kind
            t.addfile(i)
        f = tarfile.TarInfo("stage/opt/a")
        f.size = 2
        t.addfile(f, io.BytesIO(b"hi"))
        ln = tarfile.TarInfo("stage/opt/b")
        ln.type, ln.linkname = tarfile.LNKTYPE, "stage/opt/a"
        t.addfile(ln)
    buf.seek(0)
    out = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="r|") as src, tarfile.open(fileobj=out, mode="w|") as dst:
        copied = restage(src, dst)
    assert copied == ["/opt/a", "/opt/b"]
    out.seek(0)
    with tarfile.open(fileobj=out) as t:
        assert t.getnames() == ["opt", "opt/a", "opt/b"]
        assert t.getmember("opt/b").linkname == "opt/a"
