"""ktdeploy train: refusal to overwrite, explicit resume, derived threads, the rendered launch (no launch here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.agent import train as T
from ktdeploy.core.errors import RunRecordError, UsageError

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes/tiny-moe-lora.yaml"


def _recipe_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny recipe with its volumes moved under tmp_path (so output_dir checks touch only tmp)."""
    text = RECIPE.read_text().replace("/srv/ktdeploy", str(tmp_path / "srv"))
    p = tmp_path / "tiny.yaml"
    p.write_text(text)
    out = tmp_path / "srv/output/tiny-moe-lora"
    return p, out


def fake_doctor(recipe, skip):
    return {"kt_config.kt_num_threads": 12, "kt_config.kt_threadpool_count": 1}, {"ok": True}, []


def test_plan_renders_entry_and_derived_threads(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    plan = T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    assert plan.argv[1:4] == ["-m", "accelerate.commands.launch", "--main_process_port"]
    assert plan.argv[-3:-1] == ["-m", "ktdeploy.agent.lf_entry"]
    assert "kt_num_threads: 12" in plan.train_yaml and "kt_threadpool_count: 1" in plan.train_yaml
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert Path(plan.run_dir).parent == out.parent / ".ktdeploy-runs" / out.name
    assert not Path(plan.run_dir).exists()  # planning writes nothing


def test_recipe_values_win_over_derived(tmp_path):
    recipe, _ = _recipe_copy(tmp_path)
    plan = T.plan_train(str(recipe), ["train.kt_config.kt_num_threads=6"], host=T.ThisHost(doctor=fake_doctor))
    assert "kt_num_threads: 6" in plan.train_yaml and "kt_num_threads: 12" not in plan.train_yaml


def test_finished_output_is_never_overwritten(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    out.mkdir(parents=True)
    (out / "train_results.json").write_text("{}")
    with pytest.raises(RunRecordError, match="finished run"):
        T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    with pytest.raises(RunRecordError, match="finished run"):
        T.plan_train(str(recipe), resume="auto", host=T.ThisHost(doctor=fake_doctor))


def test_checkpoints_need_explicit_resume(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    for n in (5, 40, 10):
        _checkpoint(out / f"checkpoint-{n}")
    with pytest.raises(RunRecordError, match="checkpoint-40") as ei:
        T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    assert "--resume auto" in ei.value.fix and ei.value.key == "train.output_dir"
    plan = T.plan_train(str(recipe), resume="auto", host=T.ThisHost(doctor=fake_doctor))
    assert plan.resume_from.endswith("checkpoint-40")
    assert f"resume_from_checkpoint: {out}/checkpoint-40" in plan.train_yaml
    plan = T.plan_train(str(recipe), resume=str(out / "checkpoint-10"), host=T.ThisHost(doctor=fake_doctor))
    assert plan.resume_from.endswith("checkpoint-10")
    with pytest.raises(UsageError):
        T.plan_train(str(recipe), resume=str(out), host=T.ThisHost(doctor=fake_doctor))


def _checkpoint(d, ranks=1, skip=()):
    """A checkpoint folder with the files HF Trainer writes (rng_state.pth, or rng_state_<rank>.pth per process)."""
    d.mkdir(parents=True)
    names = ["trainer_state.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt"]
    names += ["rng_state.pth"] if ranks == 1 else [f"rng_state_{r}.pth" for r in range(ranks)]
    for n in names:
        if n not in skip:
            (d / n).write_text("{}")


def test_auto_resume_skips_a_checkpoint_cut_off_mid_save(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    _checkpoint(out / "checkpoint-10")
    _checkpoint(out / "checkpoint-20", skip=("trainer_state.json",))   # killed while saving
    plan = T.plan_train(str(recipe), resume="auto", host=T.ThisHost(doctor=fake_doctor))
    assert plan.resume_from.endswith("checkpoint-10")


def test_resume_refuses_another_world_size_before_loading(tmp_path):
    """Issue 9 on CPUs: a checkpoint saved by 2 processes cannot resume on 1 GPU; the refusal names the fix."""
    recipe, out = _recipe_copy(tmp_path)
    _checkpoint(out / "checkpoint-50", ranks=2)
    with pytest.raises(RunRecordError, match="saved by 2 process") as ei:
        T.plan_train(str(recipe), resume="auto", host=T.ThisHost(doctor=fake_doctor))
    assert ei.value.key == "accelerate.num_processes" and "num_processes: 2" in ei.value.fix
    plan = T.plan_train(str(recipe), ["accelerate.num_processes=2", "deploy.gpus=[0,1]"], resume="auto",
                        host=T.ThisHost(doctor=fake_doctor))
    assert plan.resume_from.endswith("checkpoint-50")
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_incomplete_checkpoint_refused(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    (out / "checkpoint-3").mkdir(parents=True)
    with pytest.raises(RunRecordError, match="incomplete"):
        T.plan_train(str(recipe), resume=str(out / "checkpoint-3"), host=T.ThisHost(doctor=fake_doctor))


def test_execute_records_a_failed_run(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    plan = T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    plan.argv = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    from ktdeploy.core.errors import StepError

    with pytest.raises(StepError) as ei:
        T.execute(plan, echo=None)
    assert ei.value.rc == 3
    d = Path(plan.run_dir)
    assert (d / "rc").read_text().strip() == "3" and (d / "status").read_text().strip() == "failed"
    assert "boom" in (d / "stdout.log").read_text()
    assert json.loads((d / "command.json").read_text())["derived"]["kt_config.kt_num_threads"] == 12
    assert (d / "train.yaml").read_text() == plan.train_yaml


def test_execute_success_summary(tmp_path):
    recipe, out = _recipe_copy(tmp_path)
    plan = T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    metrics = Path(plan.run_dir) / "metrics.jsonl"
    script = (f"import json,pathlib; p=pathlib.Path({str(metrics)!r}); o=pathlib.Path({str(out)!r}); "
              "o.mkdir(parents=True); f=p.open('a')\n"
              "for s in range(1,5): f.write(json.dumps({'step':s,'time':s,'step_s':0.5,'tokens_seen':100*s,"
              "'peak_gpu_mem_bytes':2**30,'peak_gpu_reserved_bytes':3*2**29})+'\\n'); f.write(json.dumps({'step':s,'loss':5.0-s})+'\\n')\n"
              "(o/'train_results.json').write_text('{\"train_runtime\": 2.0}')")
    plan.argv = [sys.executable, "-c", script]
    s = T.execute(plan, echo=None)
    assert s["rc"] == 0 and s["loss_first"] == 4.0 and s["loss_last"] == 1.0
    assert s["steady_tokens_per_s"] == 200.0 and s["peak_gpu_mem_gib"] == 1.0 and s["peak_gpu_reserved_gib"] == 1.5
    assert (Path(plan.run_dir) / "status").read_text().strip() == "succeeded"


def test_cli_dry_run_json(tmp_path):
    recipe, _ = _recipe_copy(tmp_path)
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "train", str(recipe), "--dry-run", "--skip-doctor", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["argv"][-2:] == ["ktdeploy.agent.lf_entry", plan["run_dir"] + "/train.yaml"]
    assert "doctor skipped" in p.stderr
    # skipping the checks keeps the threads derived from this host's topology (kt-kernel's default ran the
    # GPU machine's medium tiny MoE 5x slower); the value is this machine's own: cores minus the reserve
    from ktdeploy.controller.local_host import local_facts
    from ktdeploy.core.checks.threads import derive_threads

    threads, pools = derive_threads(local_facts(probes=False), 2)
    assert plan["derived"] == {"kt_config.kt_num_threads": threads, "kt_config.kt_threadpool_count": pools}
    assert f"kt_num_threads: {threads}" in plan["train_yaml"]


def test_skip_doctor_still_derives_threads_from_the_topology(tmp_path):
    from ktdeploy.core.facts.host import CpuFacts, HostFacts, MemoryFacts, NumaNode

    facts = HostFacts(cpu=CpuFacts(logical_cpus=32, physical_cores=16,
                                   numa_nodes=[NumaNode(id=0, cpus=list(range(16)))]),
                      memory=MemoryFacts(total_bytes=128 << 30, available_bytes=120 << 30))
    recipe, _ = _recipe_copy(tmp_path)
    seen = []
    plan = T.plan_train(str(recipe), skip_doctor=True,
                        host=T.ThisHost(topology=lambda: seen.append(1) or facts))
    assert seen == [1] and plan.doctor is None
    assert plan.derived == {"kt_config.kt_num_threads": 14, "kt_config.kt_threadpool_count": 1}
    assert "kt_num_threads: 14" in plan.train_yaml
    assert not any("left to kt-kernel's default" in w for w in plan.warnings)
    # the recipe's own value still wins, and then the topology is not even read
    seen.clear()
    plan = T.plan_train(str(recipe), ["train.kt_config.kt_num_threads=6", "train.kt_config.kt_threadpool_count=2"],
                        skip_doctor=True,
                        host=T.ThisHost(topology=lambda: seen.append(1) or facts))
    assert seen == [] and plan.derived == {} and "kt_num_threads: 6" in plan.train_yaml
    # without a topology (a caller that cannot read the host) the warning says what happens
    plan = T.plan_train(str(recipe), skip_doctor=True)
    assert plan.derived == {} and any("left to kt-kernel's default" in w for w in plan.warnings)


def test_cli_bad_recipe_is_one_screen(tmp_path):
    recipe, _ = _recipe_copy(tmp_path)
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "train", str(recipe), "--skip-doctor",
                        "--set", "train.use_kt=false"], capture_output=True, text=True, cwd=ROOT,
                       env={**__import__("os").environ, "COLUMNS": "200"})
    assert p.returncode == 2 and "Traceback" not in p.stderr and "kt_config" in p.stderr


def test_the_trainer_gets_expandable_segments_unless_the_environment_chooses(tmp_path, monkeypatch):
    """Issue 32: the planner's GPU figures assume PyTorch's expandable segments; a user's setting is kept."""
    recipe, _ = _recipe_copy(tmp_path)
    plan = T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor))
    assert plan.env_defaults == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}"' in plan.launch_sh
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert T.trainer_env(plan)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert T.trainer_env(plan)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    for env, want in (({}, "expandable_segments:True"), ({"PYTORCH_CUDA_ALLOC_CONF": ""}, "")):
        got = subprocess.run(["sh", "-c", plan.launch_sh.split("\n")[-3] + '; printf %s "$PYTORCH_CUDA_ALLOC_CONF"'],
                             env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True).stdout
        assert got == want


def _judge(answer: dict, seen: list):
    """A stand-in for the stack (the real one runs in tests/integration/test_stack_judge.py): records what train
    hands it and answers as ktdeploy.agent.stack_judge does."""
    from ktdeploy.core.recipe.stack_judge_payload import MARKER, parse_output

    def judge(rendered):
        seen.append(rendered)
        return parse_output(MARKER + json.dumps({"schema": 1, **answer}), 0)
    return judge


def test_train_lets_the_stack_judge_exactly_what_it_launches(tmp_path):
    recipe, _ = _recipe_copy(tmp_path)
    seen: list = []
    plan = T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor),
                        judge=_judge({"status": "accepted", "versions": {"kt-kernel": "0.7.2"}}, seen))
    assert seen and seen[0].train_yaml == plan.train_yaml and "kt_num_threads: 12" in seen[0].train_yaml
    (check,) = [c for c in plan.doctor["checks"] if c["name"] == "stack.judge"]
    assert check["status"] == "pass" and "accepts" in check["detail"] and "0.7.2" in check["detail"]


def test_a_stack_refusal_stops_train_with_the_stacks_findings(tmp_path):
    from ktdeploy.core.errors import RecipeError

    recipe, _ = _recipe_copy(tmp_path)
    refusal = {"stage": "kt-kernel", "error_type": "ValueError",
               "message": "kt_max_cache_depth must be at least the number of in-flight micro-batches"}
    with pytest.raises(RecipeError) as e:
        T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor), judge=_judge({"status": "refused", "refusals": [refusal]}, []))
    assert e.value.exit_code == 2 and e.value.key == "stack.judge"
    (f,) = e.value.findings
    assert f.path == "train.kt_config.kt_max_cache_depth" and f.rule == "stack.kt-kernel" and f.file == str(recipe)
    assert f.line and "kt-kernel refuses it: ValueError: kt_max_cache_depth" in f.message


def test_no_stack_to_judge_with_is_a_failed_check_and_skip_doctor_skips_the_judge(tmp_path):
    from ktdeploy.core.errors import CheckFailed

    recipe, _ = _recipe_copy(tmp_path)
    absent = _judge({"status": "absent", "missing": ["torch", "llamafactory"]}, [])
    with pytest.raises(CheckFailed) as e:
        T.plan_train(str(recipe), host=T.ThisHost(doctor=fake_doctor), judge=absent)
    assert e.value.results[0].name == "stack.judge" and "torch, llamafactory" in e.value.message
    seen: list = []
    T.plan_train(str(recipe), skip_doctor=True, host=T.ThisHost(doctor=fake_doctor), judge=_judge({"status": "absent"}, seen))
    assert seen == []
