"""Rules about what the trained result can be served with and which kt-kernel build can train it.

Registered with the same ``@rule`` decorator as rules.py (imported at its end), kept apart so the serving and
CPU-build rules read as one piece. Sources: ktdeploy/agent/convert.py (what it refuses after training),
core/variants.py and core/kt_methods.py (kt-kernel 0.7.2's builds and SFT methods).
"""

from __future__ import annotations

from ktdeploy.core import kt_methods
from ktdeploy.core import variants as V
from ktdeploy.core.recipe.rules_base import Ctx, RuleSet

rule = RuleSet()

# LlamaFactory LoraArguments that `ktdeploy convert` cannot turn into an adapter sglang-kt serves.
_UNSERVABLE = (
    ("use_rslora", "rsLoRA scales by alpha/sqrt(r); sglang-kt applies plain alpha/r, so the served adapter would "
                   "be scaled wrong (ktdeploy convert refuses it)", "set use_rslora: false (or remove it)"),
    ("use_dora", "DoRA adds a magnitude vector sglang-kt does not apply (ktdeploy convert refuses it)",
     "set use_dora: false (or remove it)"),
    ("additional_target", "additional_target trains whole modules (PEFT modules_to_save); sglang-kt serves LoRA A/B "
                          "only (ktdeploy convert refuses the extra tensors)",
     "remove additional_target; put those layers in lora_target instead"),
)


@rule("lora.servable")
def lora_servable(ctx: Ctx) -> None:
    """Fail before training what `ktdeploy convert` refuses after it: rsLoRA, DoRA, extra trained modules.

    Cookbook: §2.5 (the served form is one converted adapter).
    Code: ktdeploy/agent/convert.py (use_rslora/use_dora refusal; a non-LoRA tensor = modules_to_save refusal); sglang-kt server_args.py (composite adapter of LoRA A/B tensors); LF hparams/finetuning_args.py LoraArguments.
    """
    if not ctx.use_kt or ctx.t.get("finetuning_type", "lora") != "lora":
        return
    for key, why, fix in _UNSERVABLE:
        value = ctx.t.get(key)
        if value is True or (key == "additional_target" and isinstance(value, str) and value.strip()):
            ctx.error(f"train.{key}", why, fix)


@rule("deploy.image_build")
def image_build(ctx: Ctx) -> None:
    """deploy.image naming a kt-kernel build: it must be able to train this recipe; the old `avx512` name is the
    avx512_bf16 build.

    Cookbook: §1.1 (ISA per weight format).
    Code: kt-kernel _cpu_detect.py (the six builds); kt_kernel_ext.moe *_SFT_MOE present only in the amx and avx512_bf16 builds (tools/kt_builds.py -> docs/cpu-builds.md); sft/amx.py "AMX SFT backend not available".
    """
    d = ctx.recipe.deploy
    if d is None or not V.known(d.image):
        return
    build = V.get(d.image)
    if d.image in V.ALIASES:
        ctx.warn("deploy.image", f"deploy.image: {d.image} is the old name of kt-kernel's {build.name} build, which "
                 f"needs {' '.join(build.requires)}: Skylake/Cascade/Cooper/Ice Lake Xeons lack some of them",
                 f"use deploy.image: {V.AUTO} (doctor picks the build this CPU proves) or {build.name}")
    if not ctx.use_kt:
        return
    setup = ctx.recipe.weight_setup()
    e = kt_methods.lookup(setup)
    if not build.sft:
        ctx.error("deploy.image", f"kt-kernel's {build.name} build has no SFT kernels: it cannot train "
                  f"{setup} experts ({e.sft_method if e else setup}) nor serve a LoRA",
                  f"use deploy.image: {V.AUTO} on a CPU that proves {' or '.join(V.TRAINING)} (docs/cpu-builds.md)")
    elif e is not None and e.needs_amx and build.name != V.AMX:
        ctx.error("deploy.image", f"{setup} experts ({e.sft_method}) need kt-kernel's {V.AMX} build (cookbook §1.1), "
                  f"not {build.name}", f"use deploy.image: {V.AMX} (an AMX CPU) or a bf16/fp8/int8 setup")
