from ktdeploy.controller.executor import exit_advice
from ktdeploy.core.facts.host import HostFacts, MemoryFacts
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.recipe import builtin_recipe, load_recipe


def test_advice_by_how_the_container_stopped():
    assert "out of memory" in exit_advice(ContainerState("exited", 137, oom_killed=True))
    assert "SIGKILL" in exit_advice(ContainerState("exited", 137))
    assert "Illegal instruction" in exit_advice(ContainerState("exited", 132))
    for code in (1, 132, 137, 139):
        assert "--resume auto" in exit_advice(ContainerState("exited", code))


def test_oom_advice_uses_the_planner_when_the_model_is_known():
    r = load_recipe(builtin_recipe("qwen35-397b-bf16-lora"))
    small = HostFacts(memory=MemoryFacts(total_bytes=600 * 2**30))
    text = exit_advice(ContainerState("exited", 137, oom_killed=True), r, small)
    assert text.startswith("the container ran out of memory")
    assert "The planner says these fit this host" in text and "GiB" in text


def test_a_training_crash_on_a_host_without_a_gpu_says_the_cpu_only_path_ends_there():
    """`up --cpu-only` with the real image stops in TRAIN (the trainer: "Your setup doesn't support bf16/gpu"); the
    fix said "fix the cause, then run the same `ktdeploy up` with --resume auto" — a loop with no way out on that
    host. It says where the path ends and where training goes on instead."""
    from ktdeploy.core.facts.host import GpuFacts

    no_gpu = HostFacts(gpu=GpuFacts(nvidia_smi="missing"))
    gpu_error = "ValueError: Your setup doesn't support bf16/gpu. You need to assign use_cpu (training_args.py:1794)"
    text = exit_advice(ContainerState("exited", 1), None, no_gpu, trainer_error=gpu_error)
    assert "no GPU" in text and "walkthrough.md" in text and "--resume auto" not in text, text
    assert "<" not in text and "HOST" not in text, text            # no placeholder to fill in
    unknown = exit_advice(ContainerState("exited", 1), None, HostFacts(), trainer_error=gpu_error)  # no facts
    assert "--resume auto" in unknown
    other = exit_advice(ContainerState("exited", 1), None, no_gpu, trainer_error="RuntimeError: fake crash at step 7")
    assert "--resume auto" in other and "walkthrough" not in other   # any other crash there: the restart story
