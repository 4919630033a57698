"""Plans (pure): stages PREFLIGHT, RUNTIME, IMAGE, VOLUMES, TRAIN, FOLLOW, CONVERT, SERVE; each step an argv plus
a probe that says it is already satisfied. ``build_plan(recipe, facts, state, options)`` builds one."""

from ktdeploy.core.plan.host_plan import UpOptions, build_plan, job_name, output_dir_of, resolve_image, shipped_recipe
from ktdeploy.core.plan.state import STATE_SCRIPT, ContainerState, JobState, parse_state
from ktdeploy.core.plan.steps import Plan, Stage, Step
from ktdeploy.core.plan.text import plan_text

__all__ = ["STATE_SCRIPT", "ContainerState", "JobState", "Plan", "Stage", "Step", "UpOptions", "build_plan",
           "job_name", "output_dir_of", "parse_state", "plan_text", "resolve_image", "shipped_recipe"]
