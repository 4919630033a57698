"""The Slurm training job per runtime (core/sched/runtimes.py, batch.py, supervise.py), run under a real bash with
stand-ins for podman/srun/scontrol that record their argv: rootless podman inside the job (its cgroup, the job's
GPUs by CDI name, the image loaded once from the shared file), the time limit's USR1 -> stop request -> checkpoint ->
``scontrol requeue``, TERM (scancel) -> stopped, never requeued. pyxis and apptainer are rendered and held to the
options their own sources define (tests/slurm-recorded/runtime-flags.json); they do not run here."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan.host_plan import shipped_recipe
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sched import runtimes as rt
from ktdeploy.core.sched.batch import Launch, convert_script, train_script
from ktdeploy.core.sched.job_files import render_runtime, slurm_scripts
from ktdeploy.core.sched.request import request_for

REPO = Path(__file__).resolve().parents[4]
FLAGS = json.loads((REPO / "tests" / "slurm-recorded" / "runtime-flags.json").read_text())

# podman's stand-in: every call recorded; `run` plays the trainer (ktdeploy's contract, agent/stop_request.py): a
# step every 50 ms, and at the step after the stop request appears it writes the stopped marker and exits 75
FAKE_PODMAN = """#!/usr/bin/env python3
import json, os, sys, time
open(os.environ["CALLS"], "a").write(json.dumps(["podman", *sys.argv[1:]]) + "\\n")
if "exists" in sys.argv:
    sys.exit(int(os.environ.get("IMAGE_MISSING", "0")))
if "stop" in sys.argv and os.path.exists(os.environ["STARTED"]):    # the container (this stand-in's `run`) ends
    import signal
    os.kill(int(open(os.environ["STARTED"]).read()), signal.SIGKILL)
if "run" in sys.argv:
    req, stopped = os.environ["STOP_REQUEST"], os.environ["STOPPED"]
    open(os.environ["STARTED"], "w").write(str(os.getpid()))
    for step in range(1, 2000):
        time.sleep(0.05)
        if os.path.exists(req):
            if os.environ.get("CRASH_ON_REQUEST"):
                sys.exit(1)
            json.dump({"step": step, "checkpoint": f"checkpoint-{step}"}, open(stopped, "w"))
            sys.exit(75)
"""
RECORD = """#!/usr/bin/env python3
import json, os, sys
open(os.environ["CALLS"], "a").write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


def tiny(tmp_path: Path, *sets: str):
    return load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml",
                       ["deploy.scheduler.cpus=4", f"deploy.volumes.output={tmp_path}",
                        f"train.output_dir={tmp_path}/o", *sets])


def script_for(tmp_path: Path, runtime: str = "podman", image: str = "ktsft:amx", image_file: str | None = None,
               *sets: str) -> str:
    r = tiny(tmp_path, *sets)
    launch = Launch(runtime=runtime, image=image, image_file=image_file, signal_seconds=300)
    return train_script(r, shipped_recipe(r, None), run_id="R1", request=request_for(r, "amx"), launch=launch).script


def stand_ins(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in (("podman", FAKE_PODMAN), ("scontrol", RECORD), ("srun", RECORD)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    layout = JobLayout(f"{tmp_path}/o")
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls.jsonl"),
            "STOP_REQUEST": layout.stop_request, "STOPPED": layout.stopped_marker,
            "STARTED": str(tmp_path / "started"), "SLURM_JOB_ID": "41", "SLURM_CPUS_PER_TASK": "6"}


def calls(tmp_path: Path) -> list[list[str]]:
    p = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def start(tmp_path: Path, script: str, **env: str) -> subprocess.Popen:
    p = subprocess.Popen(["bash", "-c", script], env={**os.environ, **stand_ins(tmp_path), **env},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
        time.sleep(0.02)
    return p


def test_podman_runs_rootless_in_the_job_with_its_gpus_and_resumes(tmp_path):
    script = script_for(tmp_path, "podman", "ktsft:amx", f"{tmp_path}/ktsft-amx.tar")
    assert "#SBATCH --signal=B:USR1@300" in script and "#SBATCH --requeue" in script
    (tmp_path / "o" / "checkpoint-5").mkdir(parents=True)
    p = start(tmp_path, script, SLURM_JOB_GPUS="1,3", IMAGE_MISSING="1")
    (Path(stand_ins(tmp_path)["STOP_REQUEST"])).write_text("test\n")   # ends the stand-in's loop
    out, _ = p.communicate(timeout=30)
    got = calls(tmp_path)
    run = next(c for c in got if "run" in c)
    flags = run[:run.index("--")]
    assert {"--cgroups=disabled", "--network=host", "--ipc=host"} <= set(flags), run
    assert flags[flags.index("--ulimit"):flags.index("--ulimit") + 2] == ["--ulimit", "host"]
    assert ["--device", "nvidia.com/gpu=1"] in [flags[i:i + 2] for i in range(len(flags))]
    assert ["--device", "nvidia.com/gpu=3"] in [flags[i:i + 2] for i in range(len(flags))]
    assert "--memory" not in flags and "--cpus" not in flags           # the job's cgroup is the limit, not a quota
    assert f"type=bind,source={tmp_path}/.ktdeploy-jobs/{run[run.index('--name') + 1][:-4]}/ship,target=/ktdeploy-job," \
           "readonly" in flags
    assert run[run.index("--") + 1:] == ["ktsft:amx", "train", "/ktdeploy-job/recipe.yaml", "--resume", "auto"]
    # the image: missing from this user's store on this node, loaded once from the shared file
    assert ["podman", "load", "--quiet", "--input", f"{tmp_path}/ktsft-amx.tar"] in got
    assert "runtime podman CPUs" in out


@pytest.mark.parametrize("attempt", range(int(os.environ.get("KTDEPLOY_REPEAT", "1"))))
def test_usr1_saves_at_the_next_step_then_requeues(tmp_path, attempt):
    p = start(tmp_path, script_for(tmp_path))
    p.send_signal(signal.SIGUSR1)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert "USR1 from Slurm" in out and "checkpoint saved on request" in out and '"checkpoint": "checkpoint-' in out
    assert ["scontrol", "requeue", "41"] in calls(tmp_path)
    assert Path(stand_ins(tmp_path)["STOP_REQUEST"]).read_text() == "USR1\n"


def test_term_stops_at_once_and_is_never_requeued(tmp_path):
    p = start(tmp_path, script_for(tmp_path))
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    got = calls(tmp_path)
    assert p.returncode == 143 and "signal received, stopping" in out
    assert any(c[:3] == ["podman", "stop", "--time"] for c in got) and not any(c[0] == "scontrol" for c in got)


def test_a_trainer_that_fails_instead_of_saving_is_not_requeued(tmp_path):
    p = start(tmp_path, script_for(tmp_path), CRASH_ON_REQUEST="1")
    p.send_signal(signal.SIGUSR1)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 1 and "exited 1" in out and not any(c[0] == "scontrol" for c in calls(tmp_path))


def test_a_stale_request_is_removed_before_the_start(tmp_path):
    stale = Path(stand_ins(tmp_path)["STOP_REQUEST"])
    stale.parent.mkdir(parents=True)
    stale.write_text("left by an earlier run\n")
    p = start(tmp_path, script_for(tmp_path))
    time.sleep(0.3)
    assert p.poll() is None          # the trainer runs on: the old request was not this run's
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)


def _options(argv: list[str], prefix: str = "--") -> list[str]:
    return [a[2:].split("=", 1)[0] for a in argv if a.startswith(prefix)]


def _line(script: str, word: str) -> list[str]:
    line = next(x for x in script.splitlines() if x.startswith(word))
    return shlex.split(line.replace('"${resume[@]}"', "").replace("&", ""))


def test_pyxis_renders_documented_options_and_an_enroot_image(tmp_path):
    s = script_for(tmp_path, "pyxis", "registry.example.com/ktsft:amx")
    argv = _line(s, "srun ")
    opts = _options(argv[:argv.index("/opt/venv/bin/python")])
    assert set(opts) <= set(FLAGS["pyxis"]) | set(FLAGS["srun"]), opts
    assert "--container-image=registry.example.com#ktsft:amx" in argv
    mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert "/srv/ktdeploy/models:/srv/ktdeploy/models:ro" in mounts and any(m.endswith(":/ktdeploy-job:ro") for m in mounts)
    assert argv[argv.index("/opt/venv/bin/python"):][:5] == ["/opt/venv/bin/python", "-m", "ktdeploy.cli.image_entry",
                                                            "train", "/ktdeploy-job/recipe.yaml"]
    assert 'export NVIDIA_VISIBLE_DEVICES="${SLURM_JOB_GPUS:-void}"' in s and "command -v srun" in s
    sq = script_for(tmp_path, "pyxis", "ktsft:amx", "/shared/images/ktsft-amx.sqsh")
    assert "--container-image=/shared/images/ktsft-amx.sqsh" in _line(sq, "srun ")


def test_apptainer_renders_documented_options_on_a_sif(tmp_path):
    s = script_for(tmp_path, "apptainer", "ktsft:amx", "/shared/images/ktsft-amx.sif")
    argv = _line(s, "srun ")
    at = argv.index("apptainer")
    assert set(_options(argv[:at])) <= set(FLAGS["srun"])
    assert argv[at:at + 3] == ["apptainer", "exec", "--nv"] and set(_options(argv[at + 2:argv.index(
        "/shared/images/ktsft-amx.sif")])) <= set(FLAGS["apptainer_exec"])
    assert "/srv/ktdeploy/data:/srv/ktdeploy/data" in argv and "command -v apptainer" in s
    reg = script_for(tmp_path, "apptainer", "registry.example.com/ktsft:amx")
    assert "docker://registry.example.com/ktsft:amx" in _line(reg, "srun ")


def test_the_image_agent_is_the_dockerfiles_entrypoint():
    text = (REPO / "Dockerfile").read_text()
    entry = json.loads(next(x for x in text.splitlines() if x.startswith("ENTRYPOINT"))[len("ENTRYPOINT"):])
    assert entry == ["/usr/bin/tini", "--", *rt.IMAGE_AGENT]


@pytest.mark.parametrize("runtime,image,file,key,why", [
    ("pyxis", "ktsft:amx", None, "deploy.scheduler.image_file", "local tag"),
    ("apptainer", "ktsft:amx", "/shared/ktsft-amx.tar", "deploy.scheduler.image_file", "not what apptainer reads"),
    ("pyxis", "ktsft:amx", "/shared/a:b/ktsft.sqsh", "deploy.scheduler.image_file", "mount syntax"),
])
def test_what_a_runtime_cannot_read_is_refused_naming_the_key(tmp_path, runtime, image, file, key, why):
    with pytest.raises(RecipeError) as e:
        script_for(tmp_path, runtime, image, file)
    assert e.value.key == key and why in e.value.message and e.value.fix


def test_a_volume_apptainer_would_split_is_refused(tmp_path):
    with pytest.raises(RecipeError) as e:
        script_for(tmp_path, "apptainer", "registry.example.com/ktsft:amx", None, "deploy.volumes.data=/srv/d,x")
    assert e.value.key == "deploy.volumes.data"


def test_docker_is_only_taken_when_named_and_says_why(tmp_path):
    r = tiny(tmp_path)
    assert render_runtime(r, None) == "podman"                 # auto without a cluster: podman
    assert render_runtime(tiny(tmp_path, "deploy.scheduler.runtime=docker"), None) == "docker"
    with pytest.raises(UsageError):
        render_runtime(tiny(tmp_path, "deploy.scheduler.runtime=pyxis"), "podman")
    jobs = slurm_scripts(r, "amx", runtime="docker")
    assert "docker create" in jobs[0].script and "--cpuset-cpus" in jobs[0].script
    assert "cgroup" in rt.DOCKER_WHY and "docker group" in rt.DOCKER_WHY


def test_convert_job_uses_the_same_runtime_without_gpus_or_requeue(tmp_path):
    r = tiny(tmp_path)
    job = convert_script(r, run_id="R1", request=request_for(r, "amx"),
                         launch=Launch(runtime="podman", image="ktsft:amx", image_file=f"{tmp_path}/i.tar"))
    assert "#SBATCH --no-requeue" in job.script and "--signal" not in job.script and "nvidia.com/gpu" not in job.script
    run = _line(job.script, "podman --cgroup-manager")
    assert run[run.index("--") + 1:] == ["ktsft:amx", "convert", f"{tmp_path}/o", "-o", f"{tmp_path}/o-sglang"]
