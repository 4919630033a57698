import shlex

from ktdeploy.core.facts.host import CpuFacts, DockerFacts, HostFacts
from ktdeploy.core.plan import UpOptions, build_plan, job_name, parse_state, plan_text, shipped_recipe
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.state import STATE_SCRIPT, ContainerState, JobState
from ktdeploy.core.recipe import builtin_recipe, load_recipe

AVX512 = ["avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512vbmi"]
FULL = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]


def facts(nvidia=True, flags=AVX512):
    return HostFacts(cpu=CpuFacts(flags=sorted(flags)),
                     docker=DockerFacts(present=True, reachable=True, server_version="24.0",
                                        runtimes=["runc", "nvidia"] if nvidia else ["runc"]))


def recipe(*sets):
    return load_recipe(builtin_recipe(), list(sets))


def state(**kw):
    s = JobState(home="/home/u", image_id="sha256:abc")
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def steps(plan):
    return {s.id: s for _, s in plan.steps()}


def test_fresh_host_plan_has_every_stage_and_kt_flags():
    p = build_plan(recipe(), facts(), state(), UpOptions(host="gpu01", run_id="r1"))
    assert [s.name for s in p.stages] == ["PREFLIGHT", "RUNTIME", "IMAGE", "VOLUMES", "TRAIN", "FOLLOW", "CONVERT", "SERVE"]
    assert p.image == "ktsft:avx512_bf16" and p.variant == "avx512_bf16"
    create = steps(p)["train.create"].argv
    assert create[:2] == ("docker", "create") and "--privileged" not in create
    for flag in ("--ipc=host", "SYS_NICE", "memlock=-1:-1"):
        assert flag in create
    assert create[create.index("--gpus") + 1] == '"device=0"'
    assert "type=bind,source=/srv/ktdeploy/models,target=/srv/ktdeploy/models,readonly" in create
    assert create[-3:] == ("ktsft:avx512_bf16", "train", "/ktdeploy-job/recipe.yaml")
    assert p.job == job_name(recipe()) and p.job.startswith("ktd-tiny-moe-lora-")
    text = plan_text(p)
    assert "$ docker create --name " + p.job in text and "[5/8] TRAIN" in text


def test_job_name_is_deterministic_per_output_dir():
    assert job_name(recipe()) == job_name(recipe())
    assert job_name(recipe()) != job_name(recipe("train.output_dir=/srv/ktdeploy/output/other"))


def test_running_or_finished_job_changes_nothing():
    running = ContainerState(status="running", started_at="t")
    p = build_plan(recipe(), facts(), state(container=running), UpOptions())
    s = steps(p)
    assert s["train.start"].satisfied and "train.create" not in s
    done = ContainerState(status="exited", exit_code=0)
    p2 = build_plan(recipe(), facts(), state(container=done, adapter_present=True,
                                              serve=ContainerState(status="running")), UpOptions())
    # every remaining command is guarded by a probe that is true on such a host
    mutating = [s for _, s in p2.steps() if s.argv and not s.satisfied and not s.probe]
    assert mutating == []


def test_refuses_finished_or_dirty_output_dir_without_resume():
    p = build_plan(recipe(), facts(), state(output_exists=True, top_level=["all_results.json", "train_results.json"]),
                   UpOptions())
    s = steps(p)["volumes.output_dir"]
    assert s.action == "fail" and "finished" in s.why and "--resume auto" in s.fix
    p = build_plan(recipe(), facts(), state(output_exists=True, top_level=["notes.txt"]), UpOptions())
    assert "not empty" in steps(p)["volumes.output_dir"].why
    p = build_plan(recipe(), facts(), state(output_exists=True, top_level=["checkpoint-10"],
                                            listing={"checkpoint-10": FULL}), UpOptions())
    assert "--resume auto" in steps(p)["volumes.output_dir"].fix


def test_crashed_container_is_reported_then_resumed_from_newest_complete():
    crashed = ContainerState(status="exited", exit_code=137, oom_killed=True)
    listing = {"checkpoint-10": FULL, "checkpoint-20": FULL, "checkpoint-30": FULL[:2]}
    st = state(container=crashed, output_exists=True, top_level=sorted(listing), listing=listing)
    p = build_plan(recipe(), facts(), st, UpOptions())
    s = steps(p)["train.crashed"]
    assert s.action == "fail" and "OOM-killed" in s.why and "--resume auto" in s.fix
    p = build_plan(recipe(), facts(), st, UpOptions(resume="auto"))
    s = steps(p)
    out = p.output_dir
    assert p.resume_from == f"{out}/checkpoint-20"
    assert s["train.remove_old"].argv == ("docker", "rm", "--force", "--", p.job)
    aside = s["train.set_aside.checkpoint-30"].argv
    assert aside == ("mv", "-n", "--", f"{out}/checkpoint-30", f"{out}/incomplete-checkpoint-30")
    order = [x.id for _, x in p.steps()]
    assert order.index("train.remove_old") < order.index("train.set_aside.checkpoint-30") < order.index("train.create")
    doc = shipped_recipe(recipe(), p.resume_from)
    assert doc["train"]["resume_from_checkpoint"] == f"{out}/checkpoint-20"


def test_resume_needs_same_world_size_and_complete_named_checkpoint():
    listing = {"checkpoint-10": ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json",
                                 "rng_state_0.pth", "rng_state_1.pth"]}
    st = state(output_exists=True, top_level=["checkpoint-10"], listing=listing)
    p = build_plan(recipe(), facts(), st, UpOptions(resume="auto"))
    s = steps(p)["train.resume"]
    assert s.action == "fail" and "2 processes" in s.why
    st = state(output_exists=True, top_level=["checkpoint-10"], listing={"checkpoint-10": FULL[:1]})
    p = build_plan(recipe(), facts(), st, UpOptions(resume="checkpoint-10"))
    assert "incomplete" in steps(p)["train.resume"].why


def test_runtime_stage_installs_nvidia_runtime_unless_waived():
    p = build_plan(recipe(), facts(nvidia=False), state(), UpOptions())
    s = steps(p)["runtime.nvidia"]
    assert s.argv[:2] == ("sh", "-c") and "nvidia-container-toolkit" in s.argv[2] and s.fix
    p = build_plan(recipe(), facts(nvidia=False), state(), UpOptions(waive=("docker.nvidia_runtime",)))
    assert steps(p)["runtime.nvidia"].satisfied
    assert "--gpus" not in steps(p)["train.create"].argv
    assert any("WITHOUT --gpus" in n for n in p.notes)


def test_image_sources():
    p = build_plan(recipe("deploy.registry=reg.example:5000"), facts(), state(image_id=None), UpOptions())
    assert steps(p)["image.pull"].argv == ("docker", "pull", "--", "reg.example:5000/ktsft:avx512_bf16")
    p = build_plan(recipe(), facts(), state(image_id=None), UpOptions(image_tar="/c/img.tar"))
    s = steps(p)
    assert s["image.ship"].action == "put" and s["image.load"].argv[-1].endswith("/image.tar")
    p = build_plan(recipe(), facts(), state(image_id=None), UpOptions())
    assert steps(p)["image.present"].action == "fail" and "--image-tar" in steps(p)["image.present"].fix
    assert "`ktdeploy image build`" in steps(p)["image.present"].fix
    p = build_plan(recipe("deploy.image=reg/x:1"), facts(), state(), UpOptions())
    assert p.image == "reg/x:1" and p.variant is None


def test_detach_skips_follow_convert_serve():
    p = build_plan(recipe(), facts(), state(), UpOptions(detach=True))
    assert all(p.stage(n).skipped for n in ("FOLLOW", "CONVERT", "SERVE"))


def test_hostile_values_stay_single_argv_items():
    bad = "/srv/ktdeploy/output/x; touch /tmp/pwned $(id)"
    r = recipe(f"train.output_dir={bad}")
    p = build_plan(r, facts(), state(), UpOptions())
    assert p.output_dir == bad
    s = steps(p)
    assert f"ktdeploy.output={bad}" in s["train.create"].argv
    assert shlex.split(s["train.create"].command()) == list(s["train.create"].argv)
    assert shlex.split(s["convert.adapter"].command())[-3:] == [bad, "-o", f"{bad}-sglang"]
    assert dk.mount("/a,b:c", readonly=True) == ["--mount", 'type=bind,"source=/a,b:c","target=/a,b:c",readonly']


def test_shipped_recipe_renumbers_gpus():
    doc = shipped_recipe(recipe("deploy.gpus=[2,3]", "accelerate.num_processes=2"), None)
    assert doc["deploy"]["gpus"] == [0, 1] and "resume_from_checkpoint" not in doc["train"]
    p = build_plan(recipe("deploy.gpus=[2,3]", "accelerate.num_processes=2"), facts(), state(), UpOptions())
    a = steps(p)["train.create"].argv
    assert a[a.index("--gpus") + 1] == '"device=2,3"'


def test_parse_state_from_script_output():
    text = ("@@home\t/home/u\n@@container\t{\"Status\":\"exited\",\"ExitCode\":137,\"OOMKilled\":false,"
            "\"Error\":\"\",\"StartedAt\":\"a\",\"FinishedAt\":\"b\"}\n@@container_image\tx:1\n@@serve\t\n"
            "@@image\tsha256:1\n@@output_exists\tyes\n@@adapter\tno\n@@listing\ncheckpoint-5\n"
            + "".join(f"checkpoint-5/{f}\n" for f in FULL) + "trainer_log.jsonl\n@@end\n")
    s = parse_state(text)
    assert s.home == "/home/u" and s.container.exit_code == 137 and s.container.failed
    assert "killed (SIGKILL)" in s.container.describe()
    assert s.serve is None and s.image_id == "sha256:1" and s.output_exists and not s.adapter_present
    assert s.checkpoints[0].complete and s.top_level == ["checkpoint-5", "trainer_log.jsonl"]
    assert '"$c"' in STATE_SCRIPT and "$(" not in STATE_SCRIPT.split("\n", 2)[1]


def test_containers_run_as_the_connecting_user():
    p = build_plan(recipe(), facts(), state(user="1001:1002"), UpOptions())
    for sid in ("train.create", "convert.adapter", "serve.create"):
        a = steps(p)[sid].argv
        assert a[a.index("--user") + 1] == "1001:1002" and "HOME=/tmp" in a
    p = build_plan(recipe(), facts(), state(user="0:0"), UpOptions())
    a = steps(p)["train.create"].argv
    assert a[a.index("--user") + 1] == "0:0" and "HOME=/tmp" not in a
    assert parse_state("@@user\t1000:1000\n").user == "1000:1000"
    assert parse_state("@@user\t$(x):1\n").user == ""


def test_tune_runs_in_the_image_before_training_and_training_uses_its_choice():
    p = build_plan(recipe(), facts(), state(), UpOptions(host="gpu01", run_id="r1", tune=True, tune_budget_minutes=7))
    ids = [s.id for _, s in p.steps()]
    assert ids.index("tune.create") < ids.index("tune.run") < ids.index("tune.fetch") < ids.index("train.create")
    st = steps(p)
    tune = st["tune.create"].argv
    assert tune[-7:-4] == ("ktsft:avx512_bf16", "tune", "/ktdeploy-job/recipe.yaml")
    workdir = tune[tune.index("--workdir") + 1]
    assert workdir == f"/srv/ktdeploy/output/.ktdeploy-tune/{p.job}" and tune[-1] == "7"
    for flag in ("--ipc=host", "SYS_NICE"):           # trials run with the training container's flags
        assert flag in tune
    assert st["tune.run"].argv[:3] == ("docker", "start", "--attach")
    assert st["tune.run"].probe == ("test", "-s", f"{workdir}/tune.json")   # a second up reuses the record
    create = st["train.create"].argv
    assert create[-2:] == ("--tuned", f"{workdir}/tune.json")
    without = steps(build_plan(recipe(), facts(), state(), UpOptions(host="gpu01", run_id="r1")))
    assert "tune.run" not in without and "--tuned" not in without["train.create"].argv


def test_merge_true_adds_the_merge_step_and_serves_the_merged_model():
    from ktdeploy.core.facts.host import PathFacts
    from ktdeploy.core.plan.host_plan import MERGE_MIN_TIMEOUT_S, merge_timeout

    r = recipe("deploy.serve.merge=true")
    base = r.train["model_name_or_path"]
    out = r.train["output_dir"]
    f = facts()
    f.paths = [PathFacts(path=base, exists=True, checked=base, used_bytes=800 * 10**9)]
    p = build_plan(r, f, state(), UpOptions(run_id="r1"))
    s = steps(p)
    m = s["convert.merge"]
    assert m.argv[:3] == ("docker", "run", "--rm") and "--gpus" not in m.argv
    assert "type=bind,source=/srv/ktdeploy/models,target=/srv/ktdeploy/models,readonly" in m.argv
    assert m.argv[-8:] == ("merge", out, "--base", base, "--base-root", "/srv/ktdeploy/models", "-o", out + "-merged")
    assert m.probe == ("test", "-f", out + "-merged/ktdeploy_merge.json")
    assert m.timeout == 800e9 / 50e6 and merge_timeout(None) > merge_timeout(10**9) == MERGE_MIN_TIMEOUT_S
    assert "convert.adapter" in s                                   # the adapter is converted beside it
    create = s["serve.create"].argv
    assert create[-2:] == ("--merged", out + "-merged") and "--adapter" not in create
    assert any(n.endswith("(model=tiny-qwen3-moe)") for n in p.notes), p.notes
    # off by default: no merge step, the adapter is served
    s0 = steps(build_plan(recipe(), facts(), state(), UpOptions()))
    assert "convert.merge" not in s0 and s0["serve.create"].argv[-2] == "--adapter"


def test_merge_needs_the_base_inside_the_model_volume():
    import pytest

    from ktdeploy.core.errors import RecipeError

    r = recipe("deploy.serve.merge=true")
    r.train["model_name_or_path"] = "/elsewhere/model"
    with pytest.raises(RecipeError, match="deploy.volumes.model"):
        build_plan(r, facts(), state(), UpOptions())
