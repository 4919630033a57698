"""Forged, truncated or foreign run records, and run names (Probe 3's F8, F12, F16): `status`/`logs`/`down` give a
documented exit (never 70) on a record whose keys or values are not what ktdeploy writes, act on no record another
user wrote, and a --name that reads as a run id is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ktdeploy.core.errors import UsageError
from tests.unit.adversarial.harness import invoke, problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


# -- F8/F12: forged or truncated run records: status/logs/down give a documented exit, never 70 ------------------
GOOD = {"id": "r1", "host": "ssh://u@127.0.0.1:1", "recipe": "tiny", "state": "running", "container": "ktd-a",
        "serve_container": "ktd-a-serve", "output_dir": "/o", "created": 1.0}
SLURM = {**GOOD, "scheduler": "slurm", "slurm_jobs": {"train": "12"}, "job_dir": "/o/.ktdeploy-jobs/ktd-a"}
ODD_VALUES = [None, 5, -1, 10 ** 40, 1.5, True, "", "x\x1b[2J", [], ["a", 5], {}, {"a": [1]}, "9" * 5000]
FORGED_KEYS = ("id", "name", "state", "created", "updated", "error", "fix", "failed_checks", "failed_stage",
               "stage", "exit_code", "down", "live", "stops_at", "stop_reason", "dry_run", "scheduler")
SLURM_KEYS = ("slurm_jobs", "job_dir")


def _forged_records():
    for key in FORGED_KEYS:
        for v in ODD_VALUES:
            yield f"{key}={v!r:.30}", {**GOOD, key: v}
    for key in SLURM_KEYS:
        for v in ODD_VALUES + [{"train": 12}, {"train": "12; rm -rf /"}, {"train": "1" * 400}, {5: "1"}]:
            yield f"slurm {key}={v!r:.30}", {**SLURM, key: v}
    for key in ("host", "recipe", "container", "output_dir", "state"):
        yield f"no {key}", {k: v for k, v in GOOD.items() if k != key}
    yield "truncated", json.dumps(GOOD)[:40]
    yield "empty", ""
    yield "not utf-8", b"\xff\xfe{"


def test_f8_f12_forged_records_give_a_documented_exit(tmp_path, monkeypatch):
    import json

    from tests.unit.adversarial.harness import tally

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KTDEPLOY_CONNECT_TIMEOUT_S", "2")
    bad = []
    for i, (label, st) in enumerate(_forged_records()):
        d = tmp_path / "home" / "runs" / f"r{i}"
        d.mkdir(parents=True)
        raw = st if isinstance(st, bytes) else (st if isinstance(st, str) else json.dumps(st)).encode()
        (d / "status.json").write_bytes(raw)
        for args in (["status", "--run", f"r{i}"], ["status", "--run", f"r{i}", "--json"], ["status", "--all"],
                     ["logs", "--run", f"r{i}"], ["down", "--run", f"r{i}"]):
            rc, out, _ = invoke(args, cwd=tmp_path)
            p = problems(rc, out)
            tally("probe3.forged_records", f"{label} {args[0]}", p)
            if p:
                bad.append((label, args, rc, p, out[-300:]))
        import shutil

        shutil.rmtree(d)
    assert not bad, "\n".join(sorted({f"{b[0]} | {b[1][0]} | {b[2]} | {b[4][-150:]!r}" for b in bad}))


# -- F16: --name that reads as a run id --------------------------------------------------------------------------
def test_f16_a_name_that_is_or_starts_a_run_id_is_refused(tmp_path, monkeypatch):
    import json

    from ktdeploy.controller.up_inputs import check_run_name

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    rid = "20261204-204500-tiny-moe-lora-abc123"
    d = tmp_path / "home" / "runs" / rid
    d.mkdir(parents=True)
    (d / "status.json").write_text(json.dumps({**GOOD, "id": rid}))
    for name in (rid, rid[:10], "20261205-000000-x", "1", "-x"):
        with pytest.raises(UsageError) as e:
            check_run_name(name, "h", "ktd-b")
        assert e.value.key == "--name" and e.value.fix, name
    forged = tmp_path / "home" / "runs" / "qwen-v2"          # a record folder named like a name: --run takes the id
    forged.mkdir()
    (forged / "status.json").write_text(json.dumps({**GOOD, "id": "qwen-v2"}))
    with pytest.raises(UsageError):
        check_run_name("qwen-v2", "h", "ktd-b")
    check_run_name("qwen-v3", "h", "ktd-b")
    rc, out, _ = invoke(["up", "--dry-run", "--host", "gpu01", "--facts", str(REPO / "examples/facts/gpu-h200-1gpu.json"),
                         "--name", rid[:8], str(TINY)], cwd=tmp_path)
    assert rc == 2 and "--name" in out and not problems(rc, out), out


@pytest.mark.skipif(os.getuid() != 0, reason="a record written as another user needs root to make")
def test_f8_a_record_another_user_wrote_is_not_acted_on(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    d = tmp_path / "home" / "runs" / "r-theirs"
    d.mkdir(parents=True)
    (d / "status.json").write_text(json.dumps({**GOOD, "id": "r-theirs"}))
    os.chown(d / "status.json", 4242, 4242)
    for args in (["status", "--run", "r-theirs"], ["logs", "--run", "r-theirs"], ["down", "--run", "r-theirs"]):
        rc, out, _ = invoke(args, cwd=tmp_path)
        assert rc == 6 and "uid 4242" in " ".join(out.split()) and not problems(rc, out), (args, out)
    rc, out, _ = invoke(["status", "--all"], cwd=tmp_path)
    assert rc == 0 and "r-theirs" not in out
