"""Every check's name, in one place (pure): the stable dotted ids that doctor, `--waive`, `--cpu-only`, the run
record and the docs use. ``CheckName`` is a StrEnum: a member is the plain string (JSON, argv, records and
`--json` carry it unchanged), and a check is named by its member — ``CheckResult.name`` is a CheckName, so mypy
refuses a string where a check name goes and pydantic refuses a name outside the registry."""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class CheckName(StrEnum):
    """The check names, each once."""

    # the CPU: AMX really usable, the ISA kt-kernel's builds need (core/checks/amx.py, isa.py)
    CPU_AMX_CPUID = "cpu.amx.cpuid"
    CPU_AMX_LISTED = "cpu.amx.listed"
    CPU_AMX_PERMISSION = "cpu.amx.permission"
    CPU_AMX_PALETTE = "cpu.amx.palette"
    CPU_AMX_TILE_EXEC = "cpu.amx.tile_exec"
    CPU_AMX_BF16_EXEC = "cpu.amx.bf16_exec"
    CPU_ISA_AVX2 = "cpu.isa.avx2"
    CPU_ISA_AVX512 = "cpu.isa.avx512"
    CPU_VARIANT = "cpu.variant"
    CPU_KT_KERNEL_VARIANT = "cpu.kt_kernel_variant"
    KERNEL_VERSION = "kernel.version"
    # the layers between the host and the training container (core/checks/layers.py, amx.py)
    LAYER_VM_CPU_MODEL = "layer.vm_cpu_model"
    LAYER_CPU_FLAGS = "layer.cpu_flags"
    LAYER_AMX = "layer.amx"
    LAYER_GPUS = "layer.gpus"
    # GPUs, docker, memory, NUMA, disk and paths (core/checks/resources.py, threads.py)
    GPU_PRESENT = "gpu.present"
    GPU_DRIVER = "gpu.driver"
    GPU_COUNT_VS_RECIPE = "gpu.count_vs_recipe"
    GPU_MEMORY = "gpu.memory"
    DOCKER_PRESENT = "docker.present"
    DOCKER_NVIDIA_RUNTIME = "docker.nvidia_runtime"
    DOCKER_MEMLOCK = "docker.memlock"       # a waiver only: containers then start without --ulimit memlock=-1
    MEMORY_HOST = "memory.host"
    MEMORY_SHM = "memory.shm"
    MEMORY_MEMLOCK = "memory.memlock"
    NUMA_THREADS = "numa.threads"
    NUMA_MEMPOLICY = "numa.mempolicy"
    DISK_MODEL = "disk.model"
    DISK_OUTPUT = "disk.output"
    PATH_MODEL_EXISTS = "path.model_exists"
    PATH_DATA_EXISTS = "path.data_exists"
    PATH_KT_WEIGHT_PATH = "path.kt_weight_path"
    PATH_KT_NON_EXPERT_WEIGHT_PATH = "path.kt_non_expert_weight_path"
    PATH_MODEL_READONLY = "path.model_readonly"
    FACTS_READABLE = "facts.readable"
    # the recipe's model, data and weights on the host (core/checks/model.py, data.py)
    MODEL_CONFIG = "model.config"
    MODEL_WEIGHTS = "model.weights"
    MODEL_TOKENIZER = "model.tokenizer"
    MODEL_TEMPLATE_FAMILY = "model.template_family"
    DATA_DATASET_INFO = "data.dataset_info"
    DATA_DATASET_FILES = "data.dataset_files"
    DATA_DATASET_PLACEHOLDER = "data.dataset_placeholder"
    DATA_START_FILES = "data.start_files"
    WEIGHTS_FORMAT = "weights.format"
    WEIGHTS_CONVERTED = "weights.converted"
    # kt_weight_path of an INT8/AMXINT4 recipe does not exist yet: `up`'s WEIGHTS stage makes it (prepare-weights)
    WEIGHTS_MISSING = "weights.missing"
    WEIGHTS_NON_EXPERT_SOURCE = "weights.non_expert_source"
    # the planner's figures against the host (core/sizing/advice.py, checks.py)
    PLAN_HOST_MEMORY = "plan.host_memory"
    PLAN_GPU_MEMORY = "plan.gpu_memory"
    PLAN_DISK = "plan.disk"
    # the recipe against this host and image (core/checks/isa.py, controller/doctor.py, cli doctor --variant)
    RECIPE_WEIGHT_FORMAT_VS_ISA = "recipe.weight_format_vs_isa"
    RECIPE_IMAGE_VARIANT = "recipe.image_variant"
    IMAGE_VARIANT = "image.variant"
    IMAGE_RUN = "image.run"
    # the stack inside the image (core/checks/stack.py)
    STACK_PROBE = "stack.probe"
    STACK_PYTHON_HEADERS = "stack.python_headers"
    STACK_TORCH = "stack.torch"
    STACK_CUDA = "stack.cuda"
    STACK_TRITON = "stack.triton"
    STACK_JUDGE = "stack.judge"
    # a Slurm cluster (core/sched/slurm.py)
    SLURM_FIT = "slurm.fit"
    SLURM_RUNTIME = "slurm.runtime"   # the container runtime the job starts the image with (core/sched/cluster.py)
    SLURM_CGROUP = "slurm.cgroup"     # the job's cgroup fences its cores, memory and GPUs (core/sched/cluster.py)
    # the served model's evaluation against deploy.eval.fail_below (controller/eval_stage.py)
    EVAL_SCORE = "eval.score"


CHECKS: frozenset[str] = frozenset(CheckName)
