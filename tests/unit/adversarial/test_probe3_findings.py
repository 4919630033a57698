"""Probe 3's findings (F1 … F18), one test (or a few) each: the attack as the probe made it, then the behaviour
that must hold — a refusal naming the key, the reason and the fix, a documented exit code, no traceback.

F1: the Slurm batch script. sbatch reads ``#SBATCH`` lines with its own tokenizer (Slurm src/sbatch/opt.c
``_get_argument``: blanks split options, ``'…'``/``"…"`` quote, ``\\`` escapes the next character, an unquoted
``#`` ends the line); ``sbatch_tokens`` below is that reader, so a test sees exactly the options sbatch would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.plan.build import shipped_recipe
from ktdeploy.core.recipe import load_recipe, validate
from ktdeploy.core.recipe.finding import errors
from ktdeploy.core.sched.batch import convert_script, job_dir_of, train_script
from ktdeploy.core.sched.render import k8s_manifests
from ktdeploy.core.sched.request import request_for
from tests.unit.adversarial.harness import invoke, problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "tiny-moe-lora.yaml"


def tiny(*sets):
    return load_recipe(TINY, ["deploy.scheduler.cpus=4", *sets])


def sbatch_tokens(line: str) -> list[str]:
    """The options sbatch reads from one ``#SBATCH`` line (after the ``#SBATCH`` word)."""
    rest, out, i = line[len("#SBATCH"):], [], 0
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            return out
        arg, quote, escape = [], None, False
        while i < len(rest) and (quote or not rest[i].isspace()) and rest[i] != "\n":
            c = rest[i]
            if escape:
                escape = False
            elif c == "\\":
                escape, i = True, i + 1
                continue
            elif quote:
                if c == quote:
                    quote, i = None, i + 1
                    continue
            elif c in "\"'":
                quote, i = c, i + 1
                continue
            elif c == "#":
                out.append("".join(arg))
                return [a for a in out if a]
            arg.append(c)
            i += 1
        out.append("".join(arg))


def sbatch_options(script: str) -> list[str]:
    """Every option the header gives sbatch (the header ends at the first line that is not a comment)."""
    opts = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            opts += sbatch_tokens(line)
    return opts


HOSTILE_DIRS = ["o --uid=0", "o' --partition=evil '", 'o" --account=x "', "o #comment", "o%u%x", "o;$(touch pwned)",
                "o\t--uid=0"]


@pytest.mark.parametrize("name", HOSTILE_DIRS)
def test_f1_output_volume_never_adds_an_sbatch_option(tmp_path, name):
    vol = tmp_path / name
    sets = [f"deploy.volumes.output={vol}", f"train.output_dir={vol}/run"]
    if "\t" in name:     # a control character cannot be written on one #SBATCH line: check refuses it, naming the key
        errs = errors(validate(tiny(*sets)))
        assert {"deploy.volumes.output", "train.output_dir"} <= {f.path for f in errs}
        return
    r = tiny(*sets)
    req = request_for(r, "amx")
    for job in (train_script(r, shipped_recipe(r, None), image="ktsft:amx", run_id="R", request=req),
                convert_script(r, image="ktsft:amx", run_id="R", request=req)):
        opts = sbatch_options(job.script)
        names = [o.split("=", 1)[0] for o in opts]
        assert set(names) <= {"--job-name", "--output", "--open-mode", "--time", "--mem", "--cpus-per-task", "--hint",
                              "--gres", "--constraint", "--requeue", "--signal", "--no-requeue"}, opts
        assert len(names) == len(set(names)), opts
        out = next(o.split("=", 1)[1] for o in opts if o.startswith("--output="))
        assert out == f"{job_dir_of(r).replace('%', '%%')}/{job.role}-%j.out"
        assert subprocess.run(["bash", "-n"], input=job.script, text=True, capture_output=True).returncode == 0


def test_f1_backslash_in_the_output_volume_is_refused_for_slurm(tmp_path):
    r = tiny(f"deploy.volumes.output={tmp_path}/a\\b", f"train.output_dir={tmp_path}/a\\b/run")
    with pytest.raises(RecipeError) as e:
        train_script(r, shipped_recipe(r, None), image="ktsft:amx", run_id="R", request=request_for(r, "amx"))
    assert e.value.key == "deploy.volumes.output" and e.value.fix


@pytest.mark.parametrize("key,value", [("train.output_dir", "/srv/ktdeploy/output/run\n#SBATCH --uid=0"),
                                       ("train.output_dir", "/srv/ktdeploy/output/r\x1b]0;owned\x07"),
                                       ("deploy.image_repo", "ktsft\r"),
                                       ("deploy.serve.extra_args", ["--x", "a\nb"])])
def test_f1_control_characters_refused_at_check_naming_the_key(key, value):
    import json

    r = load_recipe(TINY, [f"{key}={json.dumps(value)}"])
    errs = errors(validate(r))
    assert any(f.path.startswith(key) and f.fix for f in errs), [(f.path, f.message) for f in errs]


def test_f1_check_cli_refuses_a_newline_volume_cleanly(tmp_path):
    recipe = tmp_path / "r.yaml"
    text = TINY.read_text()
    assert "output: /srv/ktdeploy/output" in text
    recipe.write_text(text.replace("output: /srv/ktdeploy/output", 'output: "/srv/ktdeploy/output\\n#SBATCH --uid=0"'))
    rc, out, _ = invoke(["check", str(recipe)], cwd=tmp_path)
    assert rc == 2 and "deploy.volumes.output" in out and not problems(rc, out)
    rc, out, _ = invoke(["render", "--slurm", "--variant", "amx", "--set", "deploy.scheduler.cpus=4", str(recipe)],
                        cwd=tmp_path)
    assert rc == 2 and "#SBATCH --uid" not in out.replace("\\n#SBATCH", "") and not problems(rc, out)


def test_f1_k8s_manifests_come_from_the_yaml_library_and_a_bad_namespace_is_refused():
    import json

    import yaml

    odd = "/srv/o: x\" #y"
    r = tiny(f"deploy.volumes.output={json.dumps(odd)}", f"train.output_dir={json.dumps(odd + '/run')}")
    assert r.deploy.volumes.output == odd
    from ktdeploy.core.sched.k8s import render_yaml

    docs = k8s_manifests(r, "amx")
    assert list(yaml.safe_load_all(render_yaml(docs))) == docs     # a path with ': ', '"', '#' round-trips
    for ns in ("default\nkind: Secret", "Evil", "-x", "a" * 64, ""):
        with pytest.raises(UsageError) as e:
            k8s_manifests(r, "amx", namespace=ns)
        assert e.value.key == "--namespace"


# -- F10: render --slurm/--k8s to a terminal ----------------------------------------------------------------------
def _on_a_terminal(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit code, everything it printed)."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def test_f10_render_to_a_terminal_shows_control_characters_as_escapes():
    import json
    import sys

    bidi = "a\u202eb\u2066c"
    rc, out = _on_a_terminal([sys.executable, "-m", "ktdeploy", "render", "--k8s", "--variant", "amx", "--set",
                              "deploy.scheduler.cpus=4", "--set", f"train.run_name={json.dumps(bidi)}", str(TINY)])
    assert rc == 0, out
    assert "kind: Job" in out and "a\\u202eb\\u2066c" in out
    assert "\u202e" not in out and "\u2066" not in out


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


# -- F16: --name that reads as a run id --------------------------------------------------------------------------
def test_f16_a_name_that_is_or_starts_a_run_id_is_refused(tmp_path, monkeypatch):
    import json

    from ktdeploy.controller.api import check_run_name

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


# -- F17: other spellings of deploy.image ------------------------------------------------------------------------
@pytest.mark.parametrize("image", ["AMX", " amx", "amx\u00a0", "Auto", "AVX512_BF16", "ktsft:AMX", "ktsft:amx",
                                   "reg.example.com/team/ktsft:avx512", "./ktsft-amx.tar", "/images/amx",
                                   "../amx", "-amx", "ktsft: amx"])
def test_f17_another_spelling_of_an_image_is_refused_at_check(image):
    import json

    errs = [f for f in errors(validate(tiny(f"deploy.image={json.dumps(image)}"))) if f.path == "deploy.image"]
    assert errs and errs[0].fix, image


@pytest.mark.parametrize("image", ["auto", "amx", "avx512", "reg/x:1", "ktdeploy/fake-trainer:0123abcd",
                                   "registry.example.com:5000/team/trainer:v2"])
def test_f17_the_exact_spellings_still_pass(image):
    assert not [f for f in errors(validate(tiny(f"deploy.image={image}"))) if f.path == "deploy.image"]


# -- F5/F6: one run, one lock — up --slurm too, and every spelling of one output folder -------------------------------
def test_f5_up_slurm_takes_the_job_lock(tmp_path, monkeypatch):
    from ktdeploy.controller.runs import job_lock
    from ktdeploy.core.plan.build import job_name

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    with job_lock("login01", job_name(tiny())):
        rc, out, secs = invoke(["up", "--slurm", "login01", "--set", "deploy.scheduler.cpus=4", str(TINY)], cwd=tmp_path)
    assert rc == 6 and "already working on the job" in " ".join(out.split()) and secs < 5, out
    assert not problems(rc, out)
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


@pytest.mark.parametrize("spelling", ["//srv/ktdeploy/output/tiny-moe-lora", "/srv/ktdeploy/output/./tiny-moe-lora",
                                      "/srv/ktdeploy//output/tiny-moe-lora/", "/srv/ktdeploy/output/x/../tiny-moe-lora"])
def test_f6_spellings_of_one_output_folder_are_one_job(spelling):
    from ktdeploy.core.plan.build import job_name

    assert job_name(tiny(f"train.output_dir={spelling}")) == job_name(tiny("train.output_dir=/srv/ktdeploy/output/tiny-moe-lora"))


def test_f6_a_link_to_the_output_folder_takes_the_same_lock(tmp_path, monkeypatch):
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.runs import output_lock
    from ktdeploy.core.errors import RunRecordError

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    real = tmp_path / "out" / "run"
    real.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "out")
    with output_lock(LocalConnector(), "localhost", str(real)):
        with pytest.raises(RunRecordError) as e, output_lock(LocalConnector(), "localhost",
                                                            str(tmp_path / "alias" / "run")):
            pass
        assert "already working" in e.value.message and e.value.fix
        with output_lock(LocalConnector(), "localhost", str(tmp_path / "out" / "other")):
            pass    # another folder: its own lock


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


# -- F2: volumes at system folders --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["model", "data", "output"])
@pytest.mark.parametrize("path", ["/etc", "/usr/local", "/proc", "/sys/fs", "/dev", "/boot", "/var/run/docker.sock",
                                  "/run/docker.sock", "/home/alice", "/root", "/home", "//etc/", "/srv/../etc"])
def test_f2_a_volume_at_a_system_folder_is_refused_naming_the_key(key, path):
    sets = [f"deploy.volumes.{key}={path}"]
    errs = [f for f in errors(validate(tiny(*sets))) if f.path == f"deploy.volumes.{key}" and f.rule ==
            "deploy.system_volumes"]
    assert errs and errs[0].fix, (key, path)


@pytest.mark.parametrize("path", ["/srv/ktdeploy/models", "/home/alice/models", "/data/etc", "/mnt/usr"])
def test_f2_ordinary_folders_still_pass(path):
    assert not [f for f in validate(tiny(f"deploy.volumes.model={path}")) if f.rule == "deploy.system_volumes"]


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


# -- F18: SIGTERM during up --slurm ----------------------------------------------------------------------------------
def test_f18_sigterm_while_following_cancels_the_jobs_it_submitted(tmp_path, monkeypatch):
    import json as _json

    from ktdeploy.controller import api
    from ktdeploy.controller.runs import latest_run
    from ktdeploy.core import markers
    from ktdeploy.core.errors import Terminated
    from tests.fakes.connector import FakeConnector, ok

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    ids = iter(["101", "102"])

    def sigterm(argv):
        raise Terminated()

    conn = (FakeConnector(name="login01")
            .on(["sinfo"], ok("n1|avx2,avx512_base,avx512_vnni,avx512_vbmi,avx512_bf16,amx|900000|gpu:1|64|idle|100\n"))
            .on(["squeue"], ok(""))
            .on(["sbatch"], lambda argv: ok(next(ids) + "\n"))
            .on(["scancel"], ok(""))
            .on(lambda argv: argv[:3] == ["sh", "-c", markers.JOB_SH], sigterm)
            .on(lambda argv: True, ok("")))
    with pytest.raises(Terminated):
        api.up_slurm("login01", str(TINY), overrides=["deploy.scheduler.cpus=4", "deploy.image=amx"],
                     connector=conn)
    cancelled = [c.argv for c in conn.calls if c.argv[:1] == ["scancel"]]
    assert sorted(cancelled) == [["scancel", "--", "101"], ["scancel", "--", "102"]], cancelled
    st = latest_run().status()
    assert st["state"] == "stopped" and "SIGTERM" in st["note"] and st["slurm_jobs"] == {"train": "101",
                                                                                         "convert": "102"}
    assert _json.dumps(st["down"])


def test_f18_the_cli_maps_sigterm_of_up_slurm_to_143(tmp_path, monkeypatch):
    from ktdeploy.controller import api
    from ktdeploy.core.errors import Terminated

    def terminated(*a, **k):
        raise Terminated()

    monkeypatch.setattr(api, "up_slurm", terminated)
    rc, out, _ = invoke(["up", "--slurm", "login01", str(TINY)], cwd=tmp_path)
    assert rc == 143 and not problems(rc, out), out


def test_f7_every_remote_command_has_a_timeout():
    """Each connector call in the controller names its timeout (testinfra's connector has its own default)."""
    import ast

    missing = []
    for p in (REPO / "ktdeploy").rglob("*.py"):
        if p.name == "testinfra.py":
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("run", "run_shell"):
                owner = ast.unparse(n.func.value)
                if any(k in owner for k in ("conn", "connector", "self")) and "subprocess" not in owner \
                        and not any(k.arg == "timeout" for k in n.keywords):
                    missing.append(f"{p.relative_to(REPO)}:{n.lineno} {ast.unparse(n)[:80]}")
    assert not missing, missing


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
