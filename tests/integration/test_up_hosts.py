"""`ktdeploy up` against real SSH hosts (sshd containers driving this machine's docker engine).

Training runs the LlamaFactory TEST DOUBLE (tests/fakes/fake_llamafactory.py) in an image built FROM the
ktdeploy base image; the real trainer is proven on the GPU machine. The hosts have no GPU and this engine
cannot raise RLIMIT_MEMLOCK, so those checks are waived explicitly (and the waiver is asserted to be recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # tests.fakes / tests.integration.hosts, whatever pytest's import mode

from ktdeploy.agent.tiny import build_dataset  # noqa: E402 (after the sys.path insert)
from ktdeploy.controller import up_host  # noqa: E402 (after the sys.path insert)
from ktdeploy.controller.runs import RunRecord  # noqa: E402 (after the sys.path insert)
from ktdeploy.core.command_requests import SshOptions, UpRequest  # noqa: E402 (after the sys.path insert)
from ktdeploy.core.errors import StepError  # noqa: E402 (after the sys.path insert)
from tests.fakes import kt_layout  # noqa: E402 (after the sys.path insert)
from tests.fakes.image import build_fake_image  # noqa: E402 (after the sys.path insert)
from tests.fakes.tiny_model import write_tiny_model  # noqa: E402 (after the sys.path insert)
from tests.integration.cpu_trains import needs_a_training_cpu  # noqa: E402 (after the sys.path insert)
from tests.integration.hosts import docker, host_pool  # noqa: E402, F401  (fixture)

pytestmark = pytest.mark.docker

SHM = ["--shm-size", "2g"]  # a training host's /dev/shm (doctor's memory.shm wants >= 1 GiB)
# stack.torch: the fake trainer image (a test double FROM the base image) has no torch; IMAGE's image.check says so.
# stack.judge: nor LlamaFactory/kt-kernel (nor ktdeploy's judge), so the stack's judgement of the recipe cannot run
WAIVE = ("gpu.present", "gpu.count_vs_recipe", "docker.nvidia_runtime", "docker.memlock", "stack.torch",
         "stack.judge")


def up(target: str, recipe, *, ssh: dict, overrides=(), on_event=None, **request):
    """`up` of ``recipe`` on a test host, through the SSH options of the host pool."""
    return up_host.up(UpRequest(host=target, recipe=recipe, overrides=tuple(overrides), ssh=SshOptions(**ssh),
                                **request), on_event=on_event)


@pytest.fixture(scope="module")
def env(host_pool, tmp_path_factory):  # noqa: F811 (pytest injects the fixture by name)
    import tempfile

    # Under /tmp with the same path here and in the hosts (the daemon resolves mount sources on this machine).
    root = Path(tempfile.mkdtemp(prefix="ktd-up-it-", dir="/tmp"))
    for d in ("data", "out"):
        (root / d).mkdir(parents=True)
    write_tiny_model(root / "models" / "tiny")   # what `ktdeploy tiny-model` writes: doctor's model.* checks read it
    (root / "data" / "fake_step_seconds").write_text("0.05")
    # the tiny recipe's dataset and its dataset_info.json entry, as `ktdeploy tiny-model` writes them (doctor's
    # data.* checks read them on the host)
    build_dataset(root / "data", 64)
    home = tmp_path_factory.mktemp("ktdhome")
    old = os.environ.get("KTDEPLOY_HOME")
    os.environ["KTDEPLOY_HOME"] = str(home)
    os.environ["KTDEPLOY_POLL_S"] = "0.3"
    image = build_fake_image()
    hosts = {n: host_pool.start(n, shared=[str(root)], extra=SHM) for n in ("fresh", "second")}
    yield {"root": root, "image": image, "hosts": hosts, "pool": host_pool, "home": home}
    # remove only the containers this module started (their output dir is under root)
    ps = docker("ps", "-a", "--filter", "label=ktdeploy.output", "--format", '{{.ID}}\t{{.Label "ktdeploy.output"}}',
                check=False).stdout
    mine = [line.split("\t")[0] for line in ps.splitlines() if line.split("\t")[-1].startswith(f"{root}/")]
    if mine:
        docker("rm", "-f", *mine, check=False)
    # files written by containers (root-owned on some engines): removed from a container, then the dir itself
    subprocess.run(["docker", "run", "--rm", "-v", f"{root}:{root}", "--entrypoint", "sh", image, "-c",
                    'rm -rf "$1"/* "$1"/.[!.]*', "-", str(root)], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    if old is None:
        os.environ.pop("KTDEPLOY_HOME", None)
    else:
        os.environ["KTDEPLOY_HOME"] = old


def sets(env, out: str, *extra, port: int = 31000) -> list[str]:
    r = env["root"]
    return [f"deploy.volumes.model={r}/models", f"deploy.volumes.data={r}/data", f"deploy.volumes.output={r}/out",
            f"train.model_name_or_path={r}/models/tiny", f"train.dataset_dir={r}/data", f"train.output_dir={out}",
            f"deploy.image={env['image']}", "train.max_steps=20", "train.save_steps=5", "train.logging_steps=2",
            f"deploy.serve.port={port}", *extra]


def cli(*args, env_vars=None) -> subprocess.CompletedProcess:
    e = {**os.environ, "COLUMNS": "200", **(env_vars or {})}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=e,
                           timeout=300, cwd=REPO)


def ssh_args(env) -> list[str]:
    o = env["pool"].ssh_options()
    return ["--ssh-key", o["key"], "--known-hosts", o["known_hosts"]]


def events(rec: RunRecord, kind: str) -> list[dict]:
    return [e for e in rec.events() if e["event"] == kind]


@needs_a_training_cpu
def test_fresh_host_hostile_names_then_second_up_changes_nothing(env):
    root, host = env["root"], env["hosts"]["fresh"]
    # A hostile output dir and recipe file name: must reach no shell unquoted.
    out = f"{root}/out/x; touch {root}/pwned $(touch {root}/pwned2) `touch {root}/pwned3`"
    recipe_file = root / "my recipe; $(touch pwned4).yaml"
    recipe_file.write_text((REPO / "recipes" / "tiny-moe-lora.yaml").read_text())
    said: list = []
    secret = "sk-ktdeploy-test-" + os.urandom(6).hex()
    os.environ["KTDEPLOY_TEST_API_KEY"] = secret      # served with an API key taken from the controller's environment
    overrides = [*sets(env, out), "deploy.serve.api_key_env=KTDEPLOY_TEST_API_KEY"]
    t0 = time.monotonic()
    res = up(host.target, recipe_file, waive=WAIVE, overrides=overrides,
                 ssh=env["pool"].ssh_options(), on_event=said.append)
    first_s = time.monotonic() - t0
    assert res.state == "finished", said
    rec = res.record
    st = rec.status()
    assert st["state"] == "finished" and st["waived"] == list(WAIVE)
    # IMAGE ran the container readiness check in the image with the training flags (waivers applied)
    (chk,) = events(rec, "image_check")
    by = {c["name"]: c["status"] for c in chk["checks"]}
    assert chk["failed"] == [] and set(chk["waived"]) == {"gpu.present", "gpu.count_vs_recipe", "stack.torch",
                                                          "stack.judge"}, chk
    assert by["image.run"] == "pass" and by["stack.python_headers"] == "pass" and by["memory.shm"] == "pass"
    judge = next(c for c in chk["checks"] if c["name"] == "stack.judge")
    assert judge["data"]["verdict"] == "absent" and judge["data"]["missing"] == ["ktdeploy"], judge
    assert not list(root.glob("pwned*")) and not (REPO / "pwned4").exists()
    # training ran in the container through the real docker engine, LlamaFactory's files are on the volume
    lines = [json.loads(x) for x in Path(out, "trainer_log.jsonl").read_text().splitlines()]
    assert lines[-1]["current_steps"] == 20 and lines[-1]["total_steps"] == 20
    assert Path(out, "checkpoint-20", "trainer_state.json").exists()
    # loss plot + summary fetched to the controller; adapter converted; server up
    for a in ("training_loss.png", "train_results.json", "trainer_log.jsonl"):
        assert (rec.path / "artifacts" / a).stat().st_size > 0
    # KT's real layout was written (test double for the training loop only) and the REAL converter made the
    # adapter in the sibling <output_dir>-sglang, from the newest files, with the manifest's SHA-256s checked
    manifest = json.loads(Path(out, "kt_adapter_manifest.json").read_text())
    assert manifest["status"] == "ready" and set(manifest["artifacts"]) == {
        "adapter_config.json", "adapter_model.safetensors", "fused_expert_lora.safetensors"}
    prov = json.loads(Path(f"{out}-sglang", "ktdeploy_convert.json").read_text())["summary"]
    assert prov["expert_tensors"] == 384 and prov["nonexpert_tensors"] == 40 and len(prov["checks"]) == 3
    assert not Path(out, "sglang_adapter").exists()
    plan = rec.read_json("plan.json")
    job = plan["job"]
    inspect = json.loads(docker("inspect", job).stdout)[0]
    assert [c.removeprefix("CAP_") for c in inspect["HostConfig"]["CapAdd"]] == ["SYS_NICE"] and inspect["HostConfig"]["IpcMode"] == "host"
    assert not inspect["HostConfig"]["Privileged"]
    ro = {m["Destination"]: m["RW"] for m in inspect["Mounts"]}
    assert ro[f"{root}/models"] is False and ro[f"{root}/out"] is True
    assert inspect["Config"]["Labels"]["ktdeploy.output"] == out
    serve = json.loads(docker("inspect", f"{job}-serve").stdout)[0]
    assert serve["State"]["Running"]
    assert f"KTDEPLOY_TEST_API_KEY={secret}" in serve["Config"]["Env"]               # the server got the key ...
    assert not any(secret in a for a in serve["Config"]["Cmd"] + serve["Args"])  # ... not through argv
    assert serve["Args"][-3:] == ["/ktdeploy-job/recipe.yaml", "--adapter", f"{out}-sglang"]
    assert not any(secret in p.read_text(errors="replace") for p in rec.path.rglob("*") if p.is_file())
    assert "serve.ready" in {e["step"] for e in events(rec, "step_done")}       # /health answered
    started = inspect["State"]["StartedAt"]
    progress = events(rec, "progress")
    assert progress and progress[-1]["current_steps"] == 20
    for f in ("recipe.yaml", "plan.json", "facts.json", "doctor.json", "events.jsonl", "status.json",
              "rendered/train.yaml", "rendered/accelerate.yaml", "rendered/ship/recipe.yaml"):
        assert (rec.path / f).exists(), f

    # status from "another shell" (the CLI), while the server runs
    s = cli("status", "--host", host.target, "--json", *ssh_args(env))
    assert s.returncode == 0, s.stderr
    live = json.loads(s.stdout)["live"]
    assert live["container"]["exit_code"] == 0 and live["progress"]["current_steps"] == 20
    assert live["serve"]["status"] == "running"

    # second up: nothing changes
    t0 = time.monotonic()
    res2 = up(host.target, recipe_file, waive=WAIVE, overrides=overrides, ssh=env["pool"].ssh_options(),
                  on_event=said.append)
    second_s = time.monotonic() - t0
    assert res2.state == "finished"
    started_steps = {e["step"] for e in events(res2.record, "step_start")}
    assert not started_steps & {"train.create", "train.start", "convert.adapter", "serve.create", "serve.start",
                                "volumes.output"}, started_steps
    assert json.loads(docker("inspect", job).stdout)[0]["State"]["StartedAt"] == started
    assert len(Path(out, "trainer_log.jsonl").read_text().splitlines()) == len(lines)
    print(f"\nfirst up {first_s:.1f}s, second up {second_s:.1f}s")

    # down: containers gone, output kept
    d = cli("down", "--host", host.target, *ssh_args(env))
    assert d.returncode == 0, d.stderr
    assert docker("inspect", job, check=False).returncode != 0
    assert Path(out, "checkpoint-20").is_dir()


@needs_a_training_cpu
def test_dry_run_prints_plan_and_changes_nothing(env):
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/dry"
    r = cli("up", "--host", host.target, "--dry-run", *[a for w in WAIVE for a in ("--waive", w)],
            *[a for s in sets(env, out) for a in ("--set", s)], *ssh_args(env))
    assert r.returncode == 0, r.stderr
    assert "[5/8] TRAIN" in r.stdout and "$ docker create --name ktd-tiny-moe-lora-" in r.stdout
    assert "rendered/train.yaml" in r.stdout
    assert not Path(out).exists()
    assert docker("ps", "-aq", "--filter", f"label=ktdeploy.output={out}").stdout.strip() == ""


def test_unreachable_host_exits_3_without_traceback(env):
    h = env["pool"].start("gone", docker_socket=False)
    target = h.target
    h.stop()
    r = cli("up", "--host", target, *ssh_args(env))
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "ConnectError" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_unknown_host_key_is_refused(env):
    h = env["pool"].start("nokey", record_key=False)
    r = cli("up", "--host", h.target, *ssh_args(env))
    assert r.returncode == 3 and "host key" in r.stderr.lower(), r.stderr
    h.stop()


@needs_a_training_cpu
def test_docker_without_nvidia_runtime_fails_clearly_unless_waived(env):
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/nvidia"
    waive = [a for w in ("gpu.present", "gpu.count_vs_recipe", "docker.memlock") for a in ("--waive", w)]
    r = cli("up", "--host", host.target, *waive, *[a for s in sets(env, out) for a in ("--set", s)], *ssh_args(env))
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "nvidia-container-toolkit" in r.stderr and "Traceback" not in r.stderr
    assert not Path(out).exists()


@needs_a_training_cpu
def test_image_check_stops_up_before_training(env):
    """Without the stack.torch waiver the fake trainer image (no torch) fails IMAGE's image.check: up stops with
    doctor's report and exit 1, and no training container is created."""
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/imgcheck"
    r = cli("up", "--host", host.target, *[a for w in WAIVE if w != "stack.torch" for a in ("--waive", w)],
            *[a for s in sets(env, out) for a in ("--set", s)], *ssh_args(env))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "stack.torch" in r.stderr and "not ready" in r.stderr and "Traceback" not in r.stderr, r.stderr
    ps = docker("ps", "-a", "--filter", f"label=ktdeploy.output={out}", "--format", "{{.ID}}", check=False).stdout
    assert ps.strip() == "" and not Path(out, "trainer_log.jsonl").exists()


@needs_a_training_cpu
def test_the_stack_judge_runs_in_the_image_stage_and_an_absent_stack_stops_up(env):
    """up runs the stack's own judgement of the recipe inside the image, in IMAGE's image.check (stack.judge). The
    fake trainer image holds no LlamaFactory/kt-kernel stack: the judge says so distinctly (not a refusal of the
    recipe), and up stops before training (exit 1) unless --waive stack.judge, as the other tests here do."""
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/judge"
    r = cli("up", "--host", host.target, *[a for w in WAIVE if w != "stack.judge" for a in ("--waive", w)],
            *[a for s in sets(env, out) for a in ("--set", s)], *ssh_args(env))
    assert r.returncode == 1, (r.stdout, r.stderr)
    said = " ".join(r.stderr.split())     # the error panel wraps its lines
    assert "stack.judge" in said and "no ktdeploy stack judge" in said, r.stderr
    assert "Traceback" not in r.stderr
    ps = docker("ps", "-a", "--filter", f"label=ktdeploy.output={out}", "--format", "{{.ID}}", check=False).stdout
    assert ps.strip() == "" and not Path(out, "trainer_log.jsonl").exists()


def test_missing_model_and_full_disk_stop_at_doctor(env):
    host = env["hosts"]["second"]
    r = cli("up", "--host", host.target, *[a for w in WAIVE for a in ("--waive", w)],
            *[a for s in sets(env, f"{env['root']}/out/m") for a in ("--set", s)],
            "--set", f"deploy.volumes.model={env['root']}/nomodel",
            "--set", f"train.model_name_or_path={env['root']}/nomodel/tiny", *ssh_args(env))
    assert r.returncode == 1 and "path.model_exists" in r.stderr, r.stderr
    full = env["pool"].start("full", extra=["--tmpfs", "/full:size=64k", *SHM], shared=[str(env["root"])])
    r = cli("up", "--host", full.target, *[a for w in WAIVE for a in ("--waive", w)],
            *[a for s in sets(env, "/full/out/run") for a in ("--set", s)], "--set", "deploy.volumes.output=/full/out",
            *ssh_args(env))
    # the tiny model's config.json is readable here (the volumes are shared), so the planner's plan.disk gates the
    # full disk; without a model config the threshold check disk.output does
    assert r.returncode == 1 and ("plan.disk" in r.stderr or "disk.output" in r.stderr), r.stderr
    full.stop()


@needs_a_training_cpu
def test_killed_container_reported_then_resumed_from_newest_complete_checkpoint(env):
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/resume"
    ssh = env["pool"].ssh_options()
    (env["root"] / "data" / "fake_step_seconds").write_text("0.15")
    try:
        res = up(host.target, None, waive=WAIVE, overrides=sets(env, out, "train.max_steps=40", port=31001),
                     ssh=ssh, detach=True)
        assert res.state == "detached"
        job = res.plan.job
        deadline = time.monotonic() + 60
        while not Path(out, "checkpoint-10", "trainer_state.json").exists():
            assert time.monotonic() < deadline, "no checkpoint-10"
            time.sleep(0.2)
        docker("kill", job)
    finally:
        (env["root"] / "data" / "fake_step_seconds").write_text("0.05")
    done = max(int(p.name.split("-")[1]) for p in Path(out).glob("checkpoint-*")
               if (p / "trainer_state.json").exists())
    # a checkpoint cut off mid-save (as a kill during save leaves it): never chosen
    partial = Path(out, f"checkpoint-{done + 5}")
    docker("run", "--rm", "-v", f"{env['root']}:{env['root']}", "--entrypoint", "sh", env["image"], "-c",
           'mkdir -p "$1" && : > "$1/adapter_model.safetensors"', "-", str(partial))

    # without --resume: the crash is reported (exit code, last lines, advice), nothing started
    r = cli("up", "--host", host.target, *[a for w in WAIVE for a in ("--waive", w)],
            *[a for s in sets(env, out, "train.max_steps=40", port=31001) for a in ("--set", s)], *ssh_args(env))
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "exit code 137" in r.stderr.replace("\n", " ") or "exit code: 137" in r.stderr, r.stderr
    assert "--resume auto" in r.stderr and "last log lines" in r.stderr

    res = up(host.target, None, waive=WAIVE, overrides=sets(env, out, "train.max_steps=40", port=31001),
                 ssh=ssh, resume="auto")
    assert res.state == "finished"
    assert res.plan.resume_from == f"{out}/checkpoint-{done}"
    # the cut-off folder was set aside untouched; training re-saved a complete one under the name
    assert sorted(os.listdir(Path(out, f"incomplete-checkpoint-{done + 5}"))) == ["adapter_model.safetensors"]
    assert Path(partial, "trainer_state.json").exists()
    steps = [json.loads(x)["current_steps"] for x in Path(out, "trainer_log.jsonl").read_text().splitlines()]
    assert steps[-1] == 40
    assert done + 2 in steps  # first logging step after the checkpoint (logging_steps=2)
    log = (res.record.path / "artifacts" / "container.log").read_text()
    assert f"Resuming training from {out}/checkpoint-{done} (step {done})" in log
    progress = [e["current_steps"] for e in events(res.record, "progress")]
    assert min(progress) >= done and progress[-1] == 40  # the bar starts at the resumed step, never at 0
    assert (res.record.path / "artifacts" / "previous-container.log").read_text().count("loss") >= 1


@needs_a_training_cpu
def test_crash_at_step_is_reported_with_log_lines(env):
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/crash"
    data = env["root"] / "data"
    (data / "fake_crash_at_step").write_text("7")
    try:
        with pytest.raises(StepError) as ei:
            up(host.target, None, waive=WAIVE, overrides=sets(env, out, "deploy.serve.enabled=false", port=31002),
                   ssh=env["pool"].ssh_options())
    finally:
        (data / "fake_crash_at_step").unlink()
    msg = ei.value.message
    assert "exit code: 1" in msg and "fake crash at step 7" in msg and ei.value.exit_code == 4
    assert "--resume auto" in ei.value.fix


CTRL_C_ABLE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'ktdeploy'; runpy.run_module('ktdeploy', run_name='__main__', alter_sys=True)")


@needs_a_training_cpu
def test_ctrl_c_leaves_training_running_then_logs_and_up_finish_it(env):
    import signal

    host = env["hosts"]["second"]
    out = f"{env['root']}/out/ctrlc"
    args = ["up", "--host", host.target, *[a for w in WAIVE for a in ("--waive", w)], "--no-progress",
            *[a for s in sets(env, out, "train.max_steps=40", "deploy.serve.enabled=false") for a in ("--set", s)],
            *ssh_args(env)]
    (env["root"] / "data" / "fake_step_seconds").write_text("0.15")
    try:
        # A Ctrl-C at a terminal: SIGINT handled as Python does by default. Started from a background job of a
        # non-interactive shell (`.ci/run &`), this process and its children inherit SIGINT *ignored*, and Python
        # keeps an inherited ignore (so does ktdeploy, as any Unix tool started with `&`): set the handler first.
        p = subprocess.Popen([sys.executable, "-c", CTRL_C_ABLE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
        deadline = time.monotonic() + 600   # image start + doctor on 2 loaded cores: slow, not a failure
        while not Path(out, "trainer_log.jsonl").exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "no trainer_log.jsonl after 600 s"
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        (env["root"] / "data" / "fake_step_seconds").write_text("0.05")
    assert p.returncode == 130, (stdout, stderr)   # Ctrl-C's code (docs/security.md); the run is detached
    assert "keeps running" in " ".join(stdout.split()) and "Traceback" not in stderr
    job = json.loads(cli("status", "--host", host.target, "--json", *ssh_args(env)).stdout)
    assert job["state"] == "detached" and job["live"]["container"]["status"] == "running"
    # `ktdeploy logs -f` from another shell follows it to the end
    r = cli("logs", "-f", "--host", host.target, *ssh_args(env))
    assert r.returncode == 0 and "[fake-llamafactory] training finished" in r.stdout, r.stderr
    # and `up` again picks the finished job up: no new training, the adapter is converted
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    steps = [json.loads(x)["current_steps"] for x in Path(out, "trainer_log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # one uninterrupted run
    assert Path(f"{out}-sglang", "adapter_config.json").exists()


@needs_a_training_cpu
def test_full_finetune_is_regrouped_and_served_as_weights(env):
    """finetuning_type: full: the real converter regroups kt-kernel's KT Full experts next to the HF weights in
    <output_dir>-sglang; the serving container gets --weights <output_dir>-sglang (no adapter, no LoRA)."""
    root, host = env["root"], env["hosts"]["second"]
    out = f"{root}/out/full"
    recipe_file = root / "tiny-full.yaml"
    text = (REPO / "recipes" / "tiny-moe-lora.yaml").read_text().replace("finetuning_type: lora", "finetuning_type: full")
    recipe_file.write_text("\n".join(x for x in text.splitlines() if not x.startswith("  lora_")) + "\n")
    said: list = []
    res = up(host.target, recipe_file, waive=WAIVE, overrides=[*sets(env, out, port=31002), "train.save_steps=10"],
                 ssh=env["pool"].ssh_options(), on_event=said.append)
    assert res.state == "finished", said
    rec = res.record
    plan = rec.read_json("plan.json")
    assert Path(out, "kt_full_experts.index.json").is_file() and not Path(out, "kt_adapter_manifest.json").exists()
    prov = json.loads(Path(f"{out}-sglang", "ktdeploy_convert.json").read_text())["summary"]
    assert prov["kind"] == "full" and prov["expert_tensors"] == 4 * 16 * 3
    wm = json.loads(Path(f"{out}-sglang", "model.safetensors.index.json").read_text())["weight_map"]
    assert wm["model.layers.3.mlp.experts.15.down_proj.weight"] == "model-kt-experts.safetensors"
    done = {e["step"] for e in events(rec, "step_done")}
    assert {"convert.adapter", "serve.ready"} <= done
    serve = json.loads(docker("inspect", f"{plan['job']}-serve").stdout)[0]
    assert serve["State"]["Running"]
    assert serve["Args"][-3:] == ["/ktdeploy-job/recipe.yaml", "--weights", f"{out}-sglang"]
    docker("rm", "-f", f"{plan['job']}-serve", check=False)  # free the port; the fixture removes the rest


@needs_a_training_cpu
def test_merge_true_merges_the_lora_and_serves_the_merged_model(env):
    """deploy.serve.merge: true: CONVERT converts the adapter AND runs the real `ktdeploy merge` (numpy, in the
    image) into <output_dir>-merged, against a base with its routed experts (kt_layout, the tiny model's shapes);
    SERVE gets --merged <output_dir>-merged (the oracle test parses that argv: --kt-method BF16, no LoRA flags).
    A second up changes nothing; a base the adapter does not fit stops CONVERT with the merge's error and publishes
    nothing."""
    root, host = env["root"], env["hosts"]["second"]
    base = root / "models" / "tiny-base"
    kt_layout.write_base_model(str(base), shards=2)
    out = f"{root}/out/merged-run"
    overrides = [*sets(env, out, port=31003), "deploy.serve.merge=true", f"train.model_name_or_path={base}",
                 "train.save_steps=10"]
    said: list = []
    res = up(host.target, REPO / "recipes" / "tiny-moe-lora.yaml", waive=WAIVE, overrides=overrides,
                 ssh=env["pool"].ssh_options(), on_event=said.append)
    assert res.state == "finished", said
    rec = res.record
    plan = rec.read_json("plan.json")
    merged = Path(f"{out}-merged")
    man = json.loads((merged / "ktdeploy_merge.json").read_text())
    assert man["tensors"]["expert"] == 4 * 16 * 3 and man["tensors"]["nonexpert"] == 4 * 5
    for name, r in man["output"]["files"].items():
        assert (merged / name).stat().st_size == r["size"], name
    assert man["adapter"]["files"]["fused_expert_lora.safetensors"]["sha256"] == \
        json.loads(Path(out, "kt_adapter_manifest.json").read_text())["artifacts"]["fused_expert_lora.safetensors"]["sha256"]
    b, m = (base / "model-00001-of-00002.safetensors").read_bytes(), (merged / "model-00001-of-00002.safetensors").read_bytes()
    assert len(b) == len(m) and b != m                       # same layout, merged values
    assert Path(f"{out}-sglang", "ktdeploy_convert.json").is_file()   # the adapter is converted beside it
    done = {e["step"] for e in events(rec, "step_done")}
    assert {"convert.adapter", "convert.merge", "serve.ready"} <= done
    step = next(st for stage in plan["stages"] for st in stage["steps"] if st["id"] == "convert.merge")
    assert step["argv"][-8:] == ["merge", out, "--base", str(base), "--base-root", f"{root}/models", "-o", str(merged)]
    serve = json.loads(docker("inspect", f"{plan['job']}-serve").stdout)[0]
    assert serve["State"]["Running"]
    assert serve["Args"][-3:] == ["/ktdeploy-job/recipe.yaml", "--merged", str(merged)]
    assert any(n.endswith("(model=tiny-base)") for n in plan["notes"]), plan["notes"]   # no :lora suffix
    # second up: nothing runs again
    res2 = up(host.target, REPO / "recipes" / "tiny-moe-lora.yaml", waive=WAIVE, overrides=overrides,
                  ssh=env["pool"].ssh_options(), on_event=said.append)
    assert res2.state == "finished"
    assert not {e["step"] for e in events(res2.record, "step_start")} & {"convert.merge", "convert.adapter", "serve.create"}
    docker("rm", "-f", f"{plan['job']}-serve", check=False)  # free the port; the fixture removes the rest

    # a base of another shape: the merge refuses before writing, up stops in CONVERT, nothing is published
    other = root / "models" / "other-base"
    kt_layout.write_base_model(str(other), m={**kt_layout.SMALL, "moe_inter": 128}, shards=1)
    bad_out = f"{root}/out/merged-bad"
    r = cli("up", "--host", host.target, *[a for w in WAIVE for a in ("--waive", w)],
            *[a for x in [*sets(env, bad_out, port=31004), "deploy.serve.merge=true",
                          f"train.model_name_or_path={other}", "train.save_steps=10"] for a in ("--set", x)],
            *ssh_args(env))
    assert r.returncode == 4, (r.stdout[-2000:], r.stderr[-3000:])
    said_all = r.stdout + r.stderr
    assert "is [128, 512] but the expert LoRA needs [256, 512]" in said_all and "Traceback" not in said_all, said_all[-4000:]
    assert not Path(f"{bad_out}-merged").exists()


@needs_a_training_cpu
def test_eval_stage_scores_the_served_model_on_rows_held_out_before_training(env):
    """deploy.eval: the training container's `ktdeploy train` carve (the real agent/holdout.py, in the double's image)
    holds 8 rows out of tiny_sft before training; EVAL, from this machine, asks the served model (the sglang-kt double
    answers the adapter's name with the prompt, the base's with a fixed sentence) and the base, scores both with
    LlamaFactory's metrics and records the files; status names them and the loss curve. The server listens on the
    test network's gateway: an address of this machine that the SSH host's docker (this engine) binds."""
    root, host = env["root"], env["hosts"]["fresh"]
    gateway = docker("network", "inspect", env["pool"].network, "--format",
                     "{{(index .IPAM.Config 0).Gateway}}").stdout.strip()
    out = f"{root}/out/eval-run"
    overrides = [*sets(env, out, port=31006), "deploy.eval.holdout=8", "deploy.eval.seed=3",
                 f"deploy.serve.host={gateway}", "deploy.eval.max_tokens=32"]
    said: list = []
    res = up(host.target, REPO / "recipes" / "tiny-moe-lora.yaml", waive=WAIVE, overrides=overrides,
                 ssh=env["pool"].ssh_options(), on_event=said.append)
    assert res.state == "finished", said
    held = Path(f"{out}-holdout")
    manifest = json.loads((held / "holdout.json").read_text())
    assert manifest["seed"] == 3 and manifest["datasets"]["tiny_sft"]["held_rows"] == 8
    train = {json.dumps(r, sort_keys=True) for r in json.loads((held / "tiny_sft.train.json").read_text())}
    held_rows = json.loads((held / "tiny_sft.holdout.json").read_text())
    assert not train & {json.dumps(r, sort_keys=True) for r in held_rows}
    st = res.record.status()["eval"]
    assert st["samples"] == 8 and set(st) >= {"tuned", "base", "delta", "summary_file", "samples_file"}
    rows = [json.loads(x) for x in Path(st["samples_file"]).read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [r["instruction"] for r in held_rows]
    assert all(r["base"]["text"] == "I do not know." and r["tuned"]["text"] == r["prompt"] for r in rows)
    assert st["tuned"]["failed"] == 0 and st["base"]["failed"] == 0
    assert [e["event"] for e in res.record.events() if e["event"].startswith("eval")] == ["eval_start", "eval"]
    r = cli("status", "--run", res.record.id, *ssh_args(env))
    assert r.returncode == 0, r.stderr
    assert f"evaluation result: {st['summary_file']}" in r.stdout and "loss curve: " in r.stdout
    assert (res.record.path / "artifacts" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    r = cli("status", "--run", res.record.id, "--plot", *ssh_args(env))
    assert r.returncode == 0 and "training loss" in r.stdout, r.stderr
    docker("rm", "-f", f"{res.record.status()['serve_container']}", check=False)   # free the port


# KTDEPLOY_DROP_REPEAT=20 repeats the drop on the same hosts (one pytest session): the 20x stability loop.
@needs_a_training_cpu
@pytest.mark.parametrize("attempt", range(int(os.environ.get("KTDEPLOY_DROP_REPEAT", "1"))))
def test_dropped_connection_leaves_training_running(env, attempt):
    host = env["hosts"]["second"]
    out = f"{env['root']}/out/drop{attempt}"
    steps_total = 30
    args = ["up", "--host", host.target, *[a for w in WAIVE for a in ("--waive", w)], "--no-progress",
            *[a for s in sets(env, out, f"train.max_steps={steps_total}", "deploy.serve.enabled=false")
              for a in ("--set", s)], *ssh_args(env)]
    # 9 s of training after the first log line: room for the drop to land while training runs, on a loaded machine
    (env["root"] / "data" / "fake_step_seconds").write_text("0.3")
    try:
        p = subprocess.Popen([sys.executable, "-m", "ktdeploy", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO,
                             # polling back to back keeps a follow command in flight most of the time, so the
                             # drop usually lands mid-command (paramiko: channel closed, no exit status), the case
                             # once misread as "container removed"
                             env={**os.environ, "COLUMNS": "200", "KTDEPLOY_FOLLOW_TIMEOUT_S": "5",
                                  "KTDEPLOY_POLL_S": "0.02"})
        deadline = time.monotonic() + 600   # image start + doctor on 2 loaded cores: slow, not a failure
        while not Path(out, "trainer_log.jsonl").exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "no trainer_log.jsonl after 600 s"
            time.sleep(0.1)
        # drop the SSH session: kill the per-connection sshd processes (the listener, PID 1, stays)
        host.exec("sh", "-c", 'for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = sshd ] && '
                              '[ "${d#/proc/}" != 1 ] && kill -9 "${d#/proc/}"; done; true')
        stdout, stderr = p.communicate(timeout=60)
    finally:
        (env["root"] / "data" / "fake_step_seconds").write_text("0.05")
    assert p.returncode == 3, (stdout, stderr)
    err = " ".join(stderr.split())
    assert "ConnectError" in err and "keeps running" in err and "re-run `ktdeploy up`" in err, err
    assert "disappeared" not in err and "--resume auto" not in err and "Traceback" not in err, err
    job = json.loads(cli("status", "--host", host.target, "--json", *ssh_args(env)).stdout)
    assert job["state"] == "detached" and job["live"]["container"]["status"] in ("running", "exited")
    r = cli(*args)  # reconnect: follows the same container to the end
    assert r.returncode == 0, r.stderr
    steps = [json.loads(x)["current_steps"] for x in Path(out, "trainer_log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == steps_total


def _tiny_image(tag: str, fallback: str) -> str:
    """A few-MB image whose entrypoint exits 0 (a static busybox FROM scratch), so shipping it over SFTP is quick;
    without a static busybox here, the fake trainer image (330 MB, slow) under a new tag."""
    import shutil as sh
    import tempfile

    bb = sh.which("busybox")
    static = bb and b"statically linked" in subprocess.run(["file", "-L", bb], capture_output=True).stdout
    if not static:
        docker("tag", fallback, tag)
        return tag
    with tempfile.TemporaryDirectory() as ctx:
        sh.copy(bb, Path(ctx) / "busybox")
        Path(ctx, "Dockerfile").write_text('FROM scratch\nCOPY busybox /busybox\nENTRYPOINT ["/busybox", "true"]\n')
        docker("build", "-q", "-t", tag, ctx)
    return tag


@needs_a_training_cpu
def test_image_missing_then_shipped_as_tarball_and_loaded(env, tmp_path):
    import secrets

    host = env["hosts"]["second"]
    out = f"{env['root']}/out/shipped"
    tag = _tiny_image(f"ktdeploy/up-test-shipped:{secrets.token_hex(3)}", env["image"])
    tar = tmp_path / "image.tar"
    docker("save", "--output", str(tar), tag)
    docker("rmi", tag)  # the host (this engine) no longer has it
    over = sets(env, out, f"deploy.image={tag}")
    try:
        with pytest.raises(StepError) as ei:
            up(host.target, None, waive=WAIVE, overrides=over, ssh=env["pool"].ssh_options())
        assert "not on the host" in ei.value.message and "--image-tar" in ei.value.fix
        assert not Path(out).exists()
        res = up(host.target, None, waive=WAIVE, overrides=over, ssh=env["pool"].ssh_options(),
                     image_tar=str(tar), detach=True)
        assert res.state == "detached"
        done = {e["step"] for e in events(res.record, "step_done")}
        assert {"image.ship", "image.load", "image.cleanup", "train.start"} <= done
        assert docker("image", "inspect", tag, check=False).returncode == 0
        assert host.exec("test", "-e", f"{res.plan.job_dir}/image.tar", check=False).returncode == 1
        # a second up finds the image present: nothing shipped again
        res2 = up(host.target, None, waive=WAIVE, overrides=over, ssh=env["pool"].ssh_options(),
                      image_tar=str(tar), detach=True)
        assert not {e["step"] for e in events(res2.record, "step_start")} & {"image.ship", "image.load"}
    finally:
        ps = docker("ps", "-aq", "--filter", f"ancestor={tag}", check=False).stdout.split()
        if ps:
            docker("rm", "-f", *ps, check=False)
        docker("rmi", "--force", tag, check=False)


def test_readme_first_command_stops_at_doctor_on_a_host_that_cannot_train(tmp_path):
    """`ktdeploy up --host localhost` (no recipe: the shipped tiny one) on this GPU-less machine: every stage it
    can (connect, facts, doctor), then doctor's report, exit 1, no traceback, nothing started."""
    before = docker("ps", "-aq", "--filter", "label=ktdeploy.role=train").stdout.split()
    r = cli("up", "--host", "localhost", env_vars={"KTDEPLOY_HOME": str(tmp_path)})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "CheckFailed" in r.stderr and "gpu.present" in r.stderr and "Traceback" not in r.stdout + r.stderr
    assert "connected to localhost" in r.stdout and "doctor on localhost" in r.stdout
    assert docker("ps", "-aq", "--filter", "label=ktdeploy.role=train").stdout.split() == before
    (run,) = (tmp_path / "runs").iterdir()
    st = json.loads((run / "status.json").read_text())
    assert st["state"] == "failed" and st["error_type"] == "CheckFailed" and (run / "doctor.json").exists()


@needs_a_training_cpu
def test_tune_runs_in_the_image_then_training_uses_its_choice(env):
    root, host = env["root"], env["hosts"]["second"]
    out = f"{root}/out/tuned-run"
    res = up(host.target, REPO / "recipes" / "tiny-moe-lora.yaml", waive=WAIVE, detach=True, tune=True,
                 tune_budget_minutes=2, overrides=sets(env, out, port=31007), ssh=env["pool"].ssh_options())
    assert res.state in ("detached", "started", "running", "finished"), res.state
    done = {e["step"] for e in events(res.record, "step_done")}
    assert {"tune.create", "tune.run", "tune.fetch", "train.create"} <= done
    record = json.loads((res.record.path / "artifacts" / "tune.json").read_text())
    assert record["chosen"] == {"kt_num_threads": 3, "kt_threadpool_count": 1}
    applied = Path(out, "ktdeploy_tuned_applied.json")
    for _ in range(100):
        if applied.exists():
            break
        time.sleep(0.2)
    assert json.loads(applied.read_text()) == record["chosen"]      # the training container got --tuned
    job = res.record.read_json("plan.json")["job"]
    assert docker("inspect", f"{job}-tune", check=False).returncode != 0   # the tuning container is gone
