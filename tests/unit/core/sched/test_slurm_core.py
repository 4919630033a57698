"""Slurm, pure: node features from doctor's proof (real recorded facts), node lines, the request from the planner
and the thread plan, the fit check's reasons, the sbatch scripts (run under a real bash with fake docker/Slurm
variables), the job-state parsers on Slurm 22.05's own answers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ktdeploy.core import markers
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.plan.host_plan import shipped_recipe
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sched import slurm as sl
from ktdeploy.core.sched.batch import Launch, convert_script, train_script
from ktdeploy.core.sched.cpuset import cpu_list_text
from ktdeploy.core.sched.features import constraint, node_features, node_weight, variant_flags
from ktdeploy.core.sched.request import request_for

REPO = Path(__file__).resolve().parents[4]
GOLDEN = REPO / "tests" / "golden"


def facts(name: str) -> HostFacts:
    p = GOLDEN / name
    f = p / "facts.json" if (p / "facts.json").exists() else p / "doctor.json"
    data = json.loads(f.read_text())
    return HostFacts.model_validate(data.get("facts", data))


def tiny(*sets):
    return load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml", ["deploy.scheduler.cpus=4", *sets])


def test_features_come_from_the_proof_not_the_flags():
    amx = facts("gpu-h200-vm")          # AMX tile multiply executed there
    assert node_features(amx) == ["avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx"] and node_weight(node_features(amx)) == 100
    listed_only = amx.model_copy(deep=True)
    listed_only.probes.amx.tile_exec = False       # flags listed, the tile multiply faulted (a hypervisor)
    assert node_features(listed_only) == ["avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx"][:-1]
    no_vbmi = amx.model_copy(deep=True)
    no_vbmi.probes.amx.avx512_vbmi_exec = False    # vpermb faulted: every build that needs VBMI is off
    assert node_features(no_vbmi) == ["avx2", "avx512_base", "avx512_vnni"]
    unproven = amx.model_copy(deep=True)
    unproven.probes.amx.ran = False                 # no probe: flags alone never make an amx node
    assert "amx" not in node_features(unproven)
    assert node_features(facts("haswell-avx2-qemu")) == ["avx2"]
    assert node_weight(["avx2"]) < node_weight(["avx2", "avx512_base"]) < node_weight(["avx2", "avx512_bf16"]) \
        < node_weight(["avx2", "avx512_bf16", "amx"])


def test_variant_mapping_is_one_function():
    assert constraint("amx") == "amx" and constraint(None) is None
    assert set(variant_flags("amx")) >= {"amx_tile", "amx_bf16", "avx512f"} and "amx_tile" not in variant_flags("avx512")
    assert constraint("avx512") == "avx512_bf16"          # the old name is the avx512_bf16 build
    assert "avx512_vbmi" not in variant_flags("avx512_vnni") and "avx512_vnni" in variant_flags("avx512_vnni")
    with pytest.raises(ValueError):
        variant_flags("sse4")


def test_node_line_from_facts_and_gres():
    n = sl.node_from_facts("gpu01", facts("gpu-h200-vm"), gpus=2)
    line = n.conf_line()
    assert line.startswith("NodeName=gpu01 CPUs=16 ") and "Gres=gpu:2" in line
    assert "Features=avx2,avx512_base,avx512_vnni,avx512_vbmi,avx512_bf16,amx Weight=100" in line and f"RealMemory={n.real_memory_mib}" in line
    assert n.gres_line() == "NodeName=gpu01 Name=gpu File=/dev/nvidia[0-1]"
    conf = sl.slurm_conf("c1", "ctl", [n])
    assert "SelectType=select/cons_tres" in conf and line in conf and conf.endswith("State=UP\n")
    with pytest.raises(ValueError):
        sl.node_from_facts("bad name", facts("gpu-h200-vm"))


def test_request_from_planner_and_thread_plan():
    r = request_for(tiny(), "amx")
    assert r.cpus == 6 and r.gpus == 1 and r.constraint == "amx" and "planner upper edge" in r.mem_basis
    assert 3000 < r.mem_mib < 5000   # the tiny model's 3.6 GiB upper edge
    assert request_for(tiny("deploy.scheduler.mem_gib=10"), None).mem_mib == 10240
    assert request_for(tiny("train.kt_config.kt_num_threads=12", "deploy.reserve_cores=4"), "amx").cpus == 16
    from ktdeploy.core.errors import RecipeError

    no_threads = load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml")
    with pytest.raises(RecipeError) as e:
        request_for(no_threads, "amx")
    assert e.value.key == "deploy.scheduler.cpus"


B16 = "avx2,avx512_base,avx512_vnni,avx512_vbmi,avx512_bf16"
SINFO = (f"amx1|{B16},amx|5120|gpu:2|2|idle|100\navx1|{B16}|4608|gpu:1(S:0)|2|mixed|41\n"
         "av2|avx2|4608|(null)|2|down*|1\n")


def test_fit_names_every_node_and_its_reasons():
    nodes = sl.parse_sinfo(SINFO)
    assert [(n.name, n.gpus, n.usable) for n in nodes] == [("amx1", 2, True), ("avx1", 1, True), ("av2", 0, False)]
    ok = sl.fit_check(request_for(tiny(), "avx512_bf16"), nodes)
    # CPUs: 4 threads + 2 reserved = 6 > 2 on every node
    assert ok.status == "fail" and "6 CPUs" in ok.detail and "lower kt_num_threads" in ok.fix
    good = sl.fit_check(request_for(tiny("deploy.scheduler.cpus=1", "deploy.reserve_cores=0"), "avx512_bf16"), nodes)
    assert good.status == "pass" and good.data["fits"] == ["amx1", "avx1"]
    amx = sl.fit(request_for(tiny("deploy.scheduler.cpus=1", "deploy.reserve_cores=0"), "amx"), nodes)
    assert amx.nodes == ("amx1",) and amx.reasons["avx1"] == [f"lacks CPU feature amx (has {B16})"]


SCONTROL = ("JobId=7 JobName=ktd-x UserId=root(0) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 "
            "Restarts=1 BatchFlag=1 ExitCode=0:0 NodeList=amx1 BatchHost=amx1 Features=amx\n")


def test_job_state_parsers_and_framing(tmp_path):
    info = sl.parse_scontrol_job(SCONTROL, "7")
    assert info.succeeded and info.restarts == 1 and info.nodes == "amx1" and "requeued 1x" in info.describe()
    assert sl.parse_scontrol_job(SCONTROL, "8") is None
    old = sl.parse_sacct("7|CANCELLED by 0|amx1|0:15|0\n", "7")
    assert old.state == "CANCELLED" and old.signal == 15 and old.finished
    assert sl.parse_sbatch("42\n") == "42" and sl.parse_sbatch("42;cluster\n") == "42" and sl.parse_sbatch("") is None
    assert sl.parse_squeue("12|RUNNING\nbad\n") == [("12", "RUNNING")]
    # JOB_SH under a real sh with fake scontrol/sacct: complete, and cut short
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\nprintf '%s' '{SCONTROL}'\n")
    (bindir / "sacct").write_text("#!/bin/sh\nexit 1\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    log = tmp_path / "trainer_log.jsonl"
    log.write_text('{"current_steps": 3, "total_steps": 9}\n')
    out = subprocess.run(["sh", "-c", markers.JOB_SH, "t", "7", str(log)], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}).stdout
    blocks = markers.parse_job(out)
    assert sl.job_from_blocks(blocks, "7").state == "COMPLETED" and '"current_steps": 3' in blocks["log"]
    assert markers.parse_job(out[: out.index("@@log")]) is None


def _run_script(script: str, tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """The batch script under bash with a fake docker that records its argv (one JSON list per call)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    (bindir / "docker").write_text("#!/usr/bin/env python3\nimport json, sys\n"
                                   f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bindir / "docker").chmod(0o755)
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", **env})
    return p, [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []


def docker_launch(**kw) -> Launch:
    return Launch(runtime="docker", image="ktsft:amx", **kw)


def test_train_script_runs_the_container_with_the_allocation_and_resumes(tmp_path):
    out = tmp_path / "o; $(touch pwned)"
    r = tiny(f"deploy.volumes.output={tmp_path}", f"train.output_dir={out}")
    req = request_for(r, "amx")
    job = train_script(r, shipped_recipe(r, None), run_id="R1", request=req, launch=docker_launch(signal_seconds=300))
    head = [x for x in job.script.splitlines() if x.startswith("#SBATCH")]
    assert {"#SBATCH --gres=gpu:1", "#SBATCH --constraint=amx", f"#SBATCH --mem={req.mem_mib}M",
            "#SBATCH --cpus-per-task=6", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300"} <= set(head)
    env = {"SLURM_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "6", "SLURM_MEM_PER_NODE": "4000", "SLURM_JOB_GPUS": "2,3"}
    p, calls = _run_script(job.script, tmp_path, env)
    assert p.returncode == 0, p.stderr
    create = next(c for c in calls if c[0] == "create")
    cname = "ktd-tiny-moe-lora-" + create[create.index("--name") + 1].split("-")[-2] + "-j77"
    assert create[create.index("--name") + 1] == cname
    # docker's container is outside the job: it gets the job's cores as a cpuset (this shell's mask here), never a
    # --cpus quota (CPU time on any core)
    mine = sorted(os.sched_getaffinity(0))
    assert create[create.index("--cpuset-cpus") + 1] == cpu_list_text(mine) and "--cpus" not in create
    assert create[create.index("--memory") + 1] == "4000m"
    assert create[create.index("--gpus") + 1] == '"device=2,3"' and "ktdeploy.slurm_job=77" in create
    assert create[-2:] == ["train", "/ktdeploy-job/recipe.yaml"]           # no checkpoint: a fresh start
    assert ["start", "--attach", "--", cname] in calls and calls[-1] == ["rm", "--force", "--", cname]
    assert not (tmp_path / "pwned").exists()
    shipped = Path(f"{tmp_path}/.ktdeploy-jobs/{cname[:-4]}/ship/recipe.yaml").read_text()
    assert f"output_dir: {out}" in shipped
    (out / "checkpoint-5").mkdir(parents=True)
    (tmp_path / "calls.jsonl").unlink()
    _p, calls = _run_script(job.script, tmp_path, env)
    assert next(c for c in calls if c[0] == "create")[-4:] == ["train", "/ktdeploy-job/recipe.yaml", "--resume", "auto"]


def test_train_script_trap_stops_the_container(tmp_path):
    r = tiny(f"deploy.volumes.output={tmp_path}", f"train.output_dir={tmp_path}/o")
    job = train_script(r, shipped_recipe(r, None), run_id="R1", request=request_for(r, "amx"),
                       launch=docker_launch(gpus=False))
    # `docker start --attach` blocks like a running container; the job gets SIGTERM (scancel) once it waits
    script = job.script.replace('docker start --attach -- "$cname" &', 'sleep 30 >/dev/null & echo waiting')
    _run_script("true", tmp_path, {})            # the fake docker first: the script must never reach a real one
    import time

    p = subprocess.Popen(["bash", "-c", script], env={**os.environ, "SLURM_JOB_ID": "9",
                                                      "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while "waiting" not in p.stdout.readline():
        assert time.monotonic() < deadline and p.poll() is None
    p.terminate()
    out, _ = p.communicate(timeout=30)
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert p.returncode == 143 and "signal received" in out
    assert ["stop", "--time", "20", "--", "ktd-tiny-moe-lora-" + calls[-1][-1].split("-")[-2] + "-j9"] in calls
    assert "--gpus" not in next(c for c in calls if c[0] == "create")


def test_convert_script_waits_for_nothing_and_skips_a_converted_adapter(tmp_path):
    r = tiny(f"deploy.volumes.output={tmp_path}", f"train.output_dir={tmp_path}/o")
    job = convert_script(r, run_id="R1", request=request_for(r, "avx512_bf16"),
                         launch=Launch(runtime="docker", image="ktsft:avx512_bf16"))
    assert "#SBATCH --constraint=avx512_bf16" in job.script and "#SBATCH --gres" not in job.script
    (tmp_path / "o-sglang").mkdir()
    (tmp_path / "o-sglang" / "ktdeploy_convert.json").write_text("{}")
    p, calls = _run_script(job.script, tmp_path, {"SLURM_JOB_ID": "5"})
    assert p.returncode == 0 and "already converted" in p.stdout and calls == []     # nothing started
