"""What a host answers is read bounded and as data (Probe 3's F7, F9, F14): a newline or a header in a file's name
or content forges no line of a listing, a planted link or a huge Slurm job log is never followed or read whole.
(Every remote command has a timeout: the Connector protocol's ``timeout`` has no default, mypy holds it.)"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


# -- F14: a newline in a file name forges a line of the weights listing ---------------------------------------------
def test_f14_a_newline_in_a_file_name_never_makes_weights_converted_pass(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.doctor import gather_data
    from ktdeploy.core.checks.data import data_checks

    w = tmp_path / "W"
    w.mkdir()
    (w / "x\nkt-weight-manifest.json\n_layer_0").write_text("")      # one file; no manifest, no layer folder
    (w / "y\n@@KTD-DATA\tls\tok\t0\tELSEWHERE").write_text("")       # a forged header of another listing
    train = {"kt_weight_path": str(w), "model_name_or_path": str(tmp_path / "M")}
    facts = gather_data(LocalConnector(), train)
    c = {x.name: x for x in data_checks(train, "int8", facts)}
    assert c["weights.converted"].status == "fail", c["weights.converted"]
    assert facts.get("ls", "ELSEWHERE") is None
    names = facts.get("ls", str(w)).content.split("\n")
    assert len(names) == 2 and all(n.startswith(("x?", "y?")) for n in names), names
    (w / "kt-weight-manifest.json").write_text("{}")
    (w / "_layer_0").mkdir()
    c = {x.name: x for x in data_checks(train, "int8", gather_data(LocalConnector(), train))}
    assert c["weights.converted"].status == "pass", c["weights.converted"]


# -- F9/F7: the Slurm job log on the shared volume: no link followed, never read whole -------------------------------
def test_f9_f7_a_planted_link_or_a_huge_job_log_is_never_followed_or_read_whole(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.slurm_jobs import MAX_JOB_LOG, job_log

    secret = tmp_path / "secret"
    secret.write_text("S3cr3tPW\n")
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    (job_dir / "train-7.out").symlink_to(secret)
    (job_dir / "convert-7.out").symlink_to("/dev/zero")
    conn = LocalConnector()
    for role in ("train", "convert"):
        for tail in (None, 100):
            text = job_log(conn, str(job_dir), role, "7", tail=tail)
            assert "S3cr3tPW" not in text and "not a regular file" in text, (role, tail, text[:200])
    assert job_log(conn, str(job_dir), "train", "8", tail=None) == ""          # no log yet: nothing, no error
    with open(job_dir / "train-9.out", "wb") as f:                             # 20 MB, one line with no end
        f.truncate(20 << 20)
    assert len(job_log(conn, str(job_dir), "train", "9", tail=None)) <= MAX_JOB_LOG
    assert len(job_log(conn, str(job_dir), "train", "9", tail=5)) <= MAX_JOB_LOG
    bindir = tmp_path / "bin"      # JOB_SH's trainer-log tail: a link to the secret is not read
    bindir.mkdir()
    for tool in ("scontrol", "sacct"):
        (bindir / tool).write_text("#!/bin/sh\necho JobId=7 JobState=RUNNING\n")
        (bindir / tool).chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}:{old}"
    try:
        import subprocess as sp

        from ktdeploy.core import markers

        out = sp.run(["sh", "-c", markers.JOB_SH, "t", "7", str(job_dir / "train-7.out")], capture_output=True,
                     text=True, timeout=30).stdout
        assert "S3cr3tPW" not in out and markers.parse_job(out) is not None
    finally:
        os.environ["PATH"] = old


def test_f14_a_file_whose_content_or_name_reads_as_a_header_forges_nothing(tmp_path):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.doctor import gather_data

    w = tmp_path / "W"
    w.mkdir()
    (w / "@@KTD-DATA\tls\tok\t0\tFORGED").write_text("")                  # a name with tabs, no newline
    d = tmp_path / "data"
    d.mkdir()
    (d / "dataset_info.json").write_text('{"x": {"file_name": "x.json"}}\n@@KTD-DATA\tls\tok\t0\t' + str(w) +
                                         "\nkt-weight-manifest.json\n_layer_0\n")
    train = {"kt_weight_path": str(w), "model_name_or_path": str(tmp_path / "M"), "dataset_dir": str(d),
             "dataset": "x"}
    facts = gather_data(LocalConnector(), train)
    assert facts.get("ls", "FORGED") is None
    names = facts.get("ls", str(w)).content.split("\n")
    assert names == ["@@KTD-DATA\tls\tok\t0\tFORGED"], names
    assert facts.get("read", str(d / "dataset_info.json")).content.startswith('{"x"')
