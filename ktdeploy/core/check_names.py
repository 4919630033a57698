"""Every check's name, in one place (pure): the stable dotted ids that doctor, `--waive`, `--cpu-only`, the run
record and the docs use. Code names a check by its constant here, never by a string literal;
tests/unit/core/test_check_names.py fails on a check name written elsewhere in ktdeploy/ or reported outside
CHECKS. The constants are plain strings (not an Enum), so JSON, YAML, argv and records carry them unchanged."""

from __future__ import annotations

from typing import Final


class CheckName:
    """A namespace of the check names (never instantiated)."""

    # the CPU: AMX really usable, the ISA kt-kernel's builds need (core/checks/amx.py, isa.py)
    CPU_AMX_CPUID: Final = "cpu.amx.cpuid"
    CPU_AMX_LISTED: Final = "cpu.amx.listed"
    CPU_AMX_PERMISSION: Final = "cpu.amx.permission"
    CPU_AMX_PALETTE: Final = "cpu.amx.palette"
    CPU_AMX_TILE_EXEC: Final = "cpu.amx.tile_exec"
    CPU_AMX_BF16_EXEC: Final = "cpu.amx.bf16_exec"
    CPU_ISA_AVX2: Final = "cpu.isa.avx2"
    CPU_ISA_AVX512: Final = "cpu.isa.avx512"
    CPU_VARIANT: Final = "cpu.variant"
    CPU_KT_KERNEL_VARIANT: Final = "cpu.kt_kernel_variant"
    KERNEL_VERSION: Final = "kernel.version"
    # the layers between the host and the training container (core/checks/layers.py, amx.py)
    LAYER_VM_CPU_MODEL: Final = "layer.vm_cpu_model"
    LAYER_CPU_FLAGS: Final = "layer.cpu_flags"
    LAYER_AMX: Final = "layer.amx"
    LAYER_GPUS: Final = "layer.gpus"
    # GPUs, docker, memory, NUMA, disk and paths (core/checks/resources.py, threads.py)
    GPU_PRESENT: Final = "gpu.present"
    GPU_DRIVER: Final = "gpu.driver"
    GPU_COUNT_VS_RECIPE: Final = "gpu.count_vs_recipe"
    GPU_MEMORY: Final = "gpu.memory"
    DOCKER_PRESENT: Final = "docker.present"
    DOCKER_NVIDIA_RUNTIME: Final = "docker.nvidia_runtime"
    DOCKER_MEMLOCK: Final = "docker.memlock"       # a waiver only: containers then start without --ulimit memlock=-1
    MEMORY_HOST: Final = "memory.host"
    MEMORY_SHM: Final = "memory.shm"
    MEMORY_MEMLOCK: Final = "memory.memlock"
    NUMA_THREADS: Final = "numa.threads"
    NUMA_MEMPOLICY: Final = "numa.mempolicy"
    DISK_MODEL: Final = "disk.model"
    DISK_OUTPUT: Final = "disk.output"
    PATH_MODEL_EXISTS: Final = "path.model_exists"
    PATH_DATA_EXISTS: Final = "path.data_exists"
    PATH_KT_WEIGHT_PATH: Final = "path.kt_weight_path"
    PATH_KT_NON_EXPERT_WEIGHT_PATH: Final = "path.kt_non_expert_weight_path"
    PATH_MODEL_READONLY: Final = "path.model_readonly"
    FACTS_READABLE: Final = "facts.readable"
    # the recipe's model, data and weights on the host (core/checks/model.py, data.py)
    MODEL_CONFIG: Final = "model.config"
    MODEL_WEIGHTS: Final = "model.weights"
    MODEL_TOKENIZER: Final = "model.tokenizer"
    MODEL_TEMPLATE_FAMILY: Final = "model.template_family"
    DATA_DATASET_INFO: Final = "data.dataset_info"
    DATA_DATASET_FILES: Final = "data.dataset_files"
    DATA_DATASET_PLACEHOLDER: Final = "data.dataset_placeholder"
    DATA_START_FILES: Final = "data.start_files"
    WEIGHTS_FORMAT: Final = "weights.format"
    WEIGHTS_CONVERTED: Final = "weights.converted"
    WEIGHTS_NON_EXPERT_SOURCE: Final = "weights.non_expert_source"
    # the planner's figures against the host (core/sizing/advice.py, checks.py)
    PLAN_HOST_MEMORY: Final = "plan.host_memory"
    PLAN_GPU_MEMORY: Final = "plan.gpu_memory"
    PLAN_DISK: Final = "plan.disk"
    # the recipe against this host and image (core/checks/isa.py, controller/doctor.py, cli doctor --variant)
    RECIPE_WEIGHT_FORMAT_VS_ISA: Final = "recipe.weight_format_vs_isa"
    RECIPE_IMAGE_VARIANT: Final = "recipe.image_variant"
    IMAGE_VARIANT: Final = "image.variant"
    IMAGE_RUN: Final = "image.run"
    # the stack inside the image (core/checks/stack.py)
    STACK_PROBE: Final = "stack.probe"
    STACK_PYTHON_HEADERS: Final = "stack.python_headers"
    STACK_TORCH: Final = "stack.torch"
    STACK_CUDA: Final = "stack.cuda"
    STACK_TRITON: Final = "stack.triton"
    STACK_JUDGE: Final = "stack.judge"
    # a Slurm cluster (core/sched/slurm.py)
    SLURM_FIT: Final = "slurm.fit"
    # the served model's evaluation against deploy.eval.fail_below (controller/eval_stage.py)
    EVAL_SCORE: Final = "eval.score"


CHECKS: frozenset[str] = frozenset(v for k, v in vars(CheckName).items() if k.isupper())
