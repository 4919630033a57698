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
