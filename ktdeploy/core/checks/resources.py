"""Resource checks: GPUs, docker's nvidia runtime, host memory, /dev/shm, memlock, disk and paths.

With a recipe the figures are compared with ``recipe_requirements`` — the one place where the planner
(ktdeploy.core.sizing) plugs in. Until it offers an estimate, explicit thresholds are used, each stated in the
check's detail so nobody mistakes them for a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.errors import KtdeployError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.kt_weights import EPHEMERAL_ROOT
from ktdeploy.core.recipe.document import RecipeSections
from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.safeio import overlaps
from ktdeploy.core.sizing import plan_recipe
from ktdeploy.core.sizing.calibration import upper_edges
from ktdeploy.core.sizing.estimate import merges

GiB = 1024**3
MIN_SHM = 1 * GiB           # DataLoader workers + NCCL; docker's default is 64 MiB
MIN_GPU_MEM_MIB = 8 * 1024  # below this not even attention of a small MoE fits
WARN_GPU_MEM_MIB = 24 * 1024  # cookbook table: 27 GiB peak per GPU for Qwen3-235B BF16 LoRA on 2 GPUs


@dataclass
class Requirements:
    """What a recipe needs from a host. ``basis`` says where each figure comes from."""

    host_memory_bytes: int | None = None
    gpu_memory_mib: int | None = None
    output_disk_bytes: int | None = None
    shm_bytes: int | None = None
    basis: dict[str, str] = field(default_factory=dict)


def _keys(recipe: RecipeSections) -> TrainKeys:
    return TrainKeys(recipe.train)


def recipe_weight_format(recipe: RecipeSections) -> tuple[str, str]:
    """(expert weight format, kt_backend) from the training YAML."""
    kt = _keys(recipe).kt_config
    backend = str(kt.get("kt_backend") or "auto")
    fmt = expert_setup(kt)
    return ("amxint4" if fmt == "int4" else fmt), backend


def recipe_paths(recipe: RecipeSections) -> dict[str, str]:
    """Host paths a recipe uses: model, data, output (deploy.volumes) and the KT weight paths."""
    out: dict[str, str] = {}
    vol = getattr(getattr(recipe, "deploy", None), "volumes", None)
    if vol is not None:
        out.update(model=vol.model, data=vol.data, output=vol.output)
    t = _keys(recipe)
    for key, v in (("model_name_or_path", t.model_name_or_path), ("kt_weight_path", t.kt_weight_path),
                   ("kt_non_expert_weight_path", t.kt_non_expert_weight_path)):
        if key == "kt_weight_path" and isinstance(v, str) and EPHEMERAL_ROOT.fullmatch(v):
            continue   # staged in the container's /dev/shm by `train` just before the start: never on the host
        if isinstance(v, str) and v.startswith("/"):
            out[key] = v.rstrip("/") or "/"
    return out


def recipe_plan(recipe: RecipeSections) -> Any:   # (plan, arch, where), the KtdeployError, or None
    """The planner's one run for a doctor run (ktdeploy.core.sizing.plan_recipe, from the model's config.json):
    (ResourcePlan, MoEArchitecture, where), or the KtdeployError saying why there is none, or None when it failed
    otherwise. ``recipe_requirements`` and the plan.* checks both read this one answer."""
    gpus = len(getattr(getattr(recipe, "deploy", None), "gpus", None) or []) or None
    try:
        return plan_recipe(recipe, gpus=gpus)
    except KtdeployError as err:
        return err
    except (ValueError, KeyError, TypeError):
        return None


def recipe_requirements(recipe: RecipeSections, facts: HostFacts, planned: Any = ...) -> Requirements:
    """What the recipe needs. The planner (``recipe_plan``; ``planned``: its answer when already made) is the
    source; when it cannot run (no config.json known for the model) explicit thresholds are used."""
    if planned is ...:
        planned = recipe_plan(recipe)
    plan, where = (planned[0], planned[2]) if isinstance(planned, tuple) else (None, "")
    if plan is not None:
        edges = upper_edges(plan)   # the same upper edge doctor's plan.* gate uses: one policy
        src = f"planner ({where}), upper edge of its calibration band"
        req = Requirements(host_memory_bytes=int(edges["host"] * GiB),
                           gpu_memory_mib=int(edges["gpu"] * 1024),
                           output_disk_bytes=int(edges["disk"] * GiB),
                           basis={"host_memory": src, "gpu_memory": src, "output_disk": src})
        if _keys(recipe).kt_config.get("kt_weight_lifecycle") == "ephemeral":
            experts = sum(t.gib for t in plan.terms("host") if "/dev/shm" in t.name)
            if experts:
                req.shm_bytes = int(experts * GiB)
                req.basis["shm"] = "planner: ephemeral lifecycle stages the expert weights in /dev/shm"
        return req
    return threshold_requirements(recipe, facts)


def threshold_requirements(recipe: RecipeSections, facts: HostFacts) -> Requirements:
    """Explicit thresholds for when the planner has no model config: sized from the weights on disk."""
    t = _keys(recipe)
    paths = recipe_paths(recipe)
    weights_path = paths.get("kt_weight_path") or paths.get("model_name_or_path") or paths.get("model")
    pf = facts.path(weights_path) if weights_path else None
    size = pf.used_bytes if pf and pf.used_bytes else None
    full = str(t.finetuning_type) == "full"   # as written (the planner's is_full also takes "Full")
    req = Requirements()
    if size:
        # Threshold: LoRA keeps the experts resident once (+25%, cookbook: 545 GiB RSS for ~438 GiB of
        # Qwen3-235B BF16 weights) + 8 GiB; full fine-tuning adds grads + fp32 master + Adam: 4x.
        factor = 4.0 if full else 1.25
        req.host_memory_bytes = int(size * factor + 8 * GiB)
        req.basis["host_memory"] = f"threshold: {factor}x weights ({size / GiB:.1f} GiB at {weights_path}) + 8 GiB"
        req.output_disk_bytes = int(size * 3) if full else 20 * GiB
        req.basis["output_disk"] = "threshold: 3x weights (full checkpoints)" if full else "threshold: 20 GiB (LoRA)"
        if not full and merges(recipe):
            # the merged model is BF16: an FP8 base doubles
            merged = size * (2 if recipe_weight_format(recipe)[0] == "fp8" else 1)
            req.output_disk_bytes += int(merged)
            req.basis["output_disk"] += f" + the merged model ({merged / GiB:.1f} GiB, deploy.serve.merge)"
        if t.kt_config.get("kt_weight_lifecycle") == "ephemeral":
            req.shm_bytes = int(size)
            req.basis["shm"] = "threshold: ephemeral lifecycle stages the expert weights in /dev/shm"
    else:
        req.output_disk_bytes = 20 * GiB
        req.basis["output_disk"] = "threshold: 20 GiB"
    req.gpu_memory_mib = MIN_GPU_MEM_MIB
    req.basis["gpu_memory"] = f"threshold: {MIN_GPU_MEM_MIB // 1024} GiB per GPU minimum"
    return req


def _g(b: int | None) -> str:
    return f"{b / GiB:.1f} GiB" if isinstance(b, int) else str(b)


# -- GPUs --------------------------------------------------------------------------------------
def gpu_present_check(facts: HostFacts) -> CheckResult:
    g = facts.gpu
    if g.count:
        names = ", ".join(sorted({x.name for x in g.gpus}))
        return CheckResult(name=CheckName.GPU_PRESENT, status="pass", layer=facts.layer,
                           detail=f"{g.count} GPU(s): {names}; driver {g.gpus[0].driver_version}",
                           data={"count": g.count})
    if g.nvidia_smi == "missing":
        if g.device_nodes:
            detail = "/dev/nvidia* present but nvidia-smi is missing"
            fix = ("In a container: start it with --gpus all and the nvidia runtime (it injects nvidia-smi); "
                   "on a host: install the NVIDIA driver utilities.")
        elif facts.layer == "container":
            detail = "no GPU visible in this container (no nvidia-smi, no /dev/nvidia*)"
            fix = "Start the container with --gpus all (nvidia-container-toolkit on the host)."
        else:
            detail = "no NVIDIA GPU found: nvidia-smi is not installed and no /dev/nvidia* device exists"
            fix = "Train on a host with an NVIDIA GPU and its driver installed (nvidia-smi must list it)."
    elif g.nvidia_smi == "failed":
        detail = f"nvidia-smi failed: {g.error}"
        fix = "Fix the NVIDIA driver (driver/library version mismatch usually needs a reboot or driver reinstall)."
    else:
        detail = "nvidia-smi listed no GPU"
        fix = "Check the driver and that the GPUs are not hidden (CUDA_VISIBLE_DEVICES does not affect nvidia-smi)."
    return CheckResult(name=CheckName.GPU_PRESENT, status="fail", layer=facts.layer, detail=detail, fix=fix,
                       data={"nvidia_smi": g.nvidia_smi, "device_nodes": g.device_nodes})


# The image's torch/triton wheels are built for CUDA 12.8 (torch 2.9.1+cu128, nvidia-*-cu12 12.8.x).
# NVIDIA's CUDA 12.8 release notes: the toolkit's own driver is >= 570.26 (Linux); CUDA 12.x minor
# version compatibility runs 12.8 binaries on >= 525.60.13, but PTX built by 12.8 (JIT-compiled by the
# driver) and newer driver APIs need 570.26. Below 525.60.13 CUDA does not initialise at all.
IMAGE_CUDA = "12.8"
DRIVER_FULL = (570, 26)
DRIVER_MINOR_COMPAT = (525, 60, 13)


def _version_tuple(v: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in (v or "").strip().split(".")) or None
    except ValueError:
        return None


def gpu_driver_check(facts: HostFacts) -> CheckResult:
    """The NVIDIA driver is new enough for the image's CUDA 12.8 wheels (pure: nvidia-smi's driver_version)."""
    name = CheckName.GPU_DRIVER
    versions = sorted({g.driver_version for g in facts.gpu.gpus if g.driver_version})
    if not versions:
        return CheckResult(name=name, status="skip", layer=facts.layer,
                           detail="skipped: no GPU (no driver version from nvidia-smi)")
    v = _version_tuple(versions[0])
    data = {"driver": versions[0], "image_cuda": IMAGE_CUDA, "full": ".".join(map(str, DRIVER_FULL)),
            "minimum": ".".join(map(str, DRIVER_MINOR_COMPAT))}
    if v is None:
        return CheckResult(name=name, status="warn", layer=facts.layer, data=data,
                           detail=f"cannot read the driver version {versions[0]!r}",
                           fix="Check `nvidia-smi --query-gpu=driver_version --format=csv`.")
    if v < DRIVER_MINOR_COMPAT:
        return CheckResult(name=name, status="fail", layer=facts.layer, data=data,
                           detail=f"NVIDIA driver {versions[0]} is older than {data['minimum']}, the oldest that "
                                  f"runs CUDA {IMAGE_CUDA} binaries: CUDA will not initialise in the image",
                           fix=f"Install NVIDIA driver >= {data['full']} (the CUDA {IMAGE_CUDA} driver).")
    if v < DRIVER_FULL:
        return CheckResult(name=name, status="warn", layer=facts.layer, data=data,
                           detail=f"NVIDIA driver {versions[0]} runs CUDA {IMAGE_CUDA} only through minor-version "
                                  f"compatibility: PTX that CUDA {IMAGE_CUDA} generates cannot be JIT-compiled",
                           fix=f"Upgrade the NVIDIA driver to >= {data['full']}.")
    return CheckResult(name=name, status="pass", layer=facts.layer, data=data,
                       detail=f"NVIDIA driver {versions[0]} >= {data['full']} (CUDA {IMAGE_CUDA})")


def gpu_recipe_checks(facts: HostFacts, recipe: RecipeSections, req: Requirements) -> list[CheckResult]:
    out = []
    deploy = getattr(recipe, "deploy", None)
    wanted = list(getattr(deploy, "gpus", []) or [])
    have = {x.index: x for x in facts.gpu.gpus}
    missing = [i for i in wanted if i not in have]
    if missing:
        out.append(CheckResult(name=CheckName.GPU_COUNT_VS_RECIPE, status="fail", layer=facts.layer,
                               detail=f"deploy.gpus {wanted} but the host has {len(have)} GPU(s) "
                                      f"(indices {sorted(have)}); missing {missing}",
                               fix="List existing GPU indices in deploy.gpus and set accelerate.num_processes to "
                                   "their count.", data={"wanted": wanted, "have": sorted(have)}))
    else:
        out.append(CheckResult(name=CheckName.GPU_COUNT_VS_RECIPE, status="pass", layer=facts.layer,
                               detail=f"deploy.gpus {wanted} all present", data={"wanted": wanted}))
    need = req.gpu_memory_mib
    used = [have[i] for i in wanted if i in have]
    if not used or need is None:
        out.append(CheckResult(name=CheckName.GPU_MEMORY, status="skip", layer=facts.layer,
                               detail="no recipe GPU present to size"))
        return out
    small = [g for g in used if (g.memory_total_mib or 0) < need]
    busy = [g for g in used if g.memory_used_mib and g.memory_used_mib > 1024]
    data = {"need_mib": need, "basis": req.basis.get("gpu_memory"),
            "gpus": {g.index: [g.memory_total_mib, g.memory_used_mib] for g in used}}
    if small:
        out.append(CheckResult(name=CheckName.GPU_MEMORY, status="fail", layer=facts.layer, data=data,
                               detail=f"GPU(s) {[g.index for g in small]} have less than {need} MiB "
                                      f"({req.basis.get('gpu_memory')})",
                               fix="Use larger GPUs or reduce cutoff_len / batch (cookbook A.3.4)."))
    elif busy:
        out.append(CheckResult(name=CheckName.GPU_MEMORY, status="warn", layer=facts.layer, data=data,
                               detail=f"GPU(s) {[g.index for g in busy]} already have memory in use "
                                      f"({', '.join(f'{g.memory_used_mib} MiB' for g in busy)})",
                               fix="Stop other processes on these GPUs (nvidia-smi shows them)."))
    elif any((g.memory_total_mib or 0) < WARN_GPU_MEM_MIB for g in used):
        out.append(CheckResult(name=CheckName.GPU_MEMORY, status="warn", layer=facts.layer, data=data,
                               detail=f"some GPUs have < {WARN_GPU_MEM_MIB // 1024} GiB: big models may OOM",
                               fix="Keep per_device_train_batch_size 1 and a modest cutoff_len."))
    else:
        out.append(CheckResult(name=CheckName.GPU_MEMORY, status="pass", layer=facts.layer, data=data,
                               detail=f"{len(used)} GPU(s) with >= {need} MiB each"))
    return out


# -- docker --------------------------------------------------------------------------------------
def docker_checks(facts: HostFacts) -> list[CheckResult]:
    d = facts.docker
    if not d.reachable and facts.layer == "container":
        return [CheckResult(name=CheckName.DOCKER_PRESENT, status="skip", layer=facts.layer,
                            detail="inside a container without a docker daemon: none needed here"
                                   + (f" ({d.error})" if d.error else "")),
                CheckResult(name=CheckName.DOCKER_NVIDIA_RUNTIME, status="skip", layer=facts.layer, detail="no docker daemon")]
    if not d.present:
        if facts.layer == "container":
            return [CheckResult(name=CheckName.DOCKER_PRESENT, status="skip", layer=facts.layer,
                                detail="inside a container: no docker CLI needed here")]
        return [CheckResult(name=CheckName.DOCKER_PRESENT, status="fail", layer=facts.layer, detail="docker is not installed",
                            fix="Install docker (docker-ce or docker.io) and nvidia-container-toolkit."),
                CheckResult(name=CheckName.DOCKER_NVIDIA_RUNTIME, status="skip", layer=facts.layer, detail="no docker")]
    if not d.reachable:
        return [CheckResult(name=CheckName.DOCKER_PRESENT, status="fail", layer=facts.layer,
                            detail=f"docker daemon not reachable: {d.error}",
                            fix="Start docker (systemctl start docker) and add the SSH user to the docker group."),
                CheckResult(name=CheckName.DOCKER_NVIDIA_RUNTIME, status="skip", layer=facts.layer, detail="no docker daemon")]
    out = [CheckResult(name=CheckName.DOCKER_PRESENT, status="pass", layer=facts.layer,
                       detail=f"docker {d.server_version} ({d.storage_driver}, cgroup v{d.cgroup_version})")]
    if d.nvidia_runtime:
        out.append(CheckResult(name=CheckName.DOCKER_NVIDIA_RUNTIME, status="pass", layer=facts.layer,
                               detail=f"runtimes: {', '.join(d.runtimes)}"))
    else:
        out.append(CheckResult(name=CheckName.DOCKER_NVIDIA_RUNTIME, status="fail", layer=facts.layer,
                               detail=f"docker has no nvidia runtime (runtimes: {', '.join(d.runtimes) or 'none'}): "
                                      "containers would start with no GPU",
                               fix="Install nvidia-container-toolkit, run `sudo nvidia-ctk runtime configure "
                                   "--runtime=docker` and `sudo systemctl restart docker`.",
                               data={"runtimes": d.runtimes}))
    return out


# -- memory ---------------------------------------------------------------------------------------
def memory_checks(facts: HostFacts, req: Requirements | None = None) -> list[CheckResult]:
    m, lim, layer = facts.memory, facts.limits, facts.layer
    out = []
    total = m.total_bytes
    cg = lim.cgroup_memory_limit if isinstance(lim.cgroup_memory_limit, int) else None
    effective = min(x for x in (total, cg) if x) if (total or cg) else None
    need = req.host_memory_bytes if req else None
    data = {"total_bytes": total, "available_bytes": m.available_bytes, "cgroup_limit_bytes": cg,
            "need_bytes": need, "basis": (req.basis.get("host_memory") if req else None)}
    if effective is None:
        out.append(CheckResult(name=CheckName.MEMORY_HOST, status="skip", layer=layer, detail="/proc/meminfo unreadable"))
    elif need and effective < need:
        by = "the cgroup limit (docker --memory)" if cg and cg < (total or cg + 1) else "host memory"
        out.append(CheckResult(name=CheckName.MEMORY_HOST, status="fail", layer=layer, data=data,
                               detail=f"{by} is {_g(effective)}, the recipe needs ~{_g(need)} ({data['basis']})",
                               fix="Use a host with more memory, converted INT8/AMXINT4 weights, or a shorter "
                                   "cutoff_len / kt_max_cache_depth (cookbook A.3.3)"
                                   + ("; or raise/remove --memory" if by.startswith("the cgroup") else "") + "."))
    else:
        extra = f"; cgroup limit {_g(cg)}" if cg else ""
        needs = f"; recipe needs ~{_g(need)}" if need else ""
        out.append(CheckResult(name=CheckName.MEMORY_HOST, status="pass", layer=layer, data=data,
                               detail=f"{_g(total)} total, {_g(m.available_bytes)} available{extra}{needs}"))
    shm = lim.shm_total_bytes
    need_shm = max(MIN_SHM, (req.shm_bytes or 0) if req else 0)
    if shm is None:
        out.append(CheckResult(name=CheckName.MEMORY_SHM, status="skip", layer=layer, detail="/dev/shm not found"))
    elif shm < need_shm:
        out.append(CheckResult(name=CheckName.MEMORY_SHM, status="fail", layer=layer,
                               detail=f"/dev/shm is {shm / 1024**2:.0f} MiB, need >= {_g(need_shm)}"
                                      + (f" ({req.basis['shm']})" if req and req.shm_bytes else
                                         " for DataLoader workers and NCCL"),
                               fix="Start the container with --shm-size=16g (or --ipc=host).",
                               data={"shm_bytes": shm, "need_bytes": need_shm}))
    else:
        out.append(CheckResult(name=CheckName.MEMORY_SHM, status="pass", layer=layer, detail=f"/dev/shm {_g(shm)}",
                               data={"shm_bytes": shm}))
    soft = lim.memlock_soft
    if soft == "unlimited":
        out.append(CheckResult(name=CheckName.MEMORY_MEMLOCK, status="pass", layer=layer, detail="memlock unlimited"))
    elif soft is None:
        out.append(CheckResult(name=CheckName.MEMORY_MEMLOCK, status="skip", layer=layer, detail="memlock limit unknown"))
    else:
        out.append(CheckResult(name=CheckName.MEMORY_MEMLOCK, status="warn", layer=layer,
                               detail=f"memlock limited to {soft / 1024**2:.0f} MiB: pinned host buffers "
                                      "(CUDA, NCCL, RDMA) may fail or fall back to slow pageable copies",
                               fix="Start the container with --ulimit memlock=-1 (hosts: memlock unlimited in "
                                   "/etc/security/limits.conf).", data={"memlock_bytes": soft}))
    return out


# -- disk and paths ---------------------------------------------------------------------------------
def path_checks(facts: HostFacts, recipe: RecipeSections, req: Requirements) -> list[CheckResult]:
    out = []
    paths = recipe_paths(recipe)
    for role, exists in (("model", CheckName.PATH_MODEL_EXISTS), ("data", CheckName.PATH_DATA_EXISTS)):
        p = paths.get(role)
        pf = facts.path(p) if p else None
        if pf is None:
            continue
        if pf.exists and pf.is_dir:
            out.append(CheckResult(name=exists, status="pass", layer=facts.layer,
                                   detail=f"{p} exists" + (f" ({_g(pf.used_bytes)})" if pf.used_bytes else "")))
        else:
            out.append(CheckResult(name=exists, status="fail", layer=facts.layer,
                                   detail=f"deploy.volumes.{role} {p} " + ("is not a directory" if pf.exists else
                                                                            "does not exist on the host"),
                                   fix=f"Copy the {role} to {p} on the host, or fix deploy.volumes.{role}."))
    converted = recipe_weight_format(recipe)[0] in ("int8", "amxint4")   # weights.missing says it, with the command
    for key, check in (("kt_weight_path", CheckName.PATH_KT_WEIGHT_PATH),
                       ("kt_non_expert_weight_path", CheckName.PATH_KT_NON_EXPERT_WEIGHT_PATH)):
        p = paths.get(key)
        pf = facts.path(p) if p else None
        if pf is not None and not pf.exists and not (converted and key == "kt_weight_path"):
            out.append(CheckResult(name=check, status="fail", layer=facts.layer,
                                   detail=f"train.{key} {p} does not exist on the host",
                                   fix="Convert the weights there first (`ktdeploy prepare-weights --recipe RECIPE`, "
                                       "which `ktdeploy up` runs as its WEIGHTS stage) or fix the path."))
    op = paths.get("output")
    pf = facts.path(op) if op else None
    if pf is not None:
        need = req.output_disk_bytes or 0
        if not pf.writable:
            out.append(CheckResult(name=CheckName.DISK_OUTPUT, status="fail", layer=facts.layer,
                                   detail=f"{pf.checked} is not writable (for {op})",
                                   fix="Create the output directory writable by the SSH user, or change "
                                       "deploy.volumes.output."))
        elif pf.free_bytes is not None and pf.free_bytes < need:
            out.append(CheckResult(name=CheckName.DISK_OUTPUT, status="fail", layer=facts.layer,
                                   detail=f"{_g(pf.free_bytes)} free on {pf.mount} for {op}, need ~{_g(need)} "
                                          f"({req.basis.get('output_disk')})",
                                   fix="Free space or point deploy.volumes.output at a bigger disk."))
        else:
            out.append(CheckResult(name=CheckName.DISK_OUTPUT, status="pass", layer=facts.layer,
                                   detail=f"{_g(pf.free_bytes)} free on {pf.mount} for {op}"))
    mp = paths.get("model")
    pf = facts.path(mp) if mp else None
    opf = facts.path(op) if op else None
    if pf is not None and opf is not None and pf.real and opf.real and overlaps(pf.real, opf.real):
        # the recipe's spellings were apart (deploy.paths), but symlinks on the host join them
        out.append(CheckResult(name=CheckName.PATH_MODEL_READONLY, status="fail", layer=facts.layer,
                               detail=f"on the host the output volume {op} is {opf.real} and the read-only model "
                                      f"volume {mp} is {pf.real}: one lies inside the other (a symlink)",
                               fix="Point deploy.volumes.output and deploy.volumes.model at separate real "
                                   "directories (resolve the symlink)."))
    if pf is not None and pf.exists:
        out.append(CheckResult(name=CheckName.DISK_MODEL, status="pass", layer=facts.layer,
                               detail=f"{mp} on {pf.mount} ({_g(pf.free_bytes)} free); mounted read-only"))
    return out
