"""Survival across layers: the facts gathered on the host and inside the container must agree.

A flag or GPU the host has and the container lacks was hidden by the container layer; the check names
that layer and the fix. (The VM layer shows in the host's own facts: hypervisor flag + missing flags.)
"""

from __future__ import annotations

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.isa import AMX_FLAGS, AVX2_FLAGS, FP8_FLAGS, amx_usable, has
from ktdeploy.core.facts.host import HostFacts

WATCHED_FLAGS = tuple(dict.fromkeys(AMX_FLAGS + AVX2_FLAGS + FP8_FLAGS + (
    "avx512bw", "avx512dq", "avx512vl", "avx512_fp16", "avx_vnni")))


def layer_checks(host: HostFacts, ctr: HostFacts) -> list[CheckResult]:
    out = []
    hidden = [f for f in WATCHED_FLAGS if has(host, f) and not has(ctr, f)]
    data = {"hidden": hidden, "host_layer": host.layer, "container_layer": ctr.layer}
    if hidden:
        out.append(CheckResult(name=CheckName.LAYER_CPU_FLAGS, status="fail", layer="container", data=data,
                               detail=f"the container hides CPU flags the host has: {' '.join(hidden)} "
                                      "(its /proc/cpuinfo is overridden: a bind mount or lxcfs)",
                               fix="Do not mount over /proc/cpuinfo in the training container (remove the "
                                   "-v ...:/proc/cpuinfo or lxcfs cpuinfo mount); containers share the host CPU."))
    else:
        out.append(CheckResult(name=CheckName.LAYER_CPU_FLAGS, status="pass", layer="container", data=data,
                               detail="the container sees every host CPU flag that matters "
                                      f"({sum(has(host, f) for f in WATCHED_FLAGS)} checked)"))
    if amx_usable(host) and amx_usable(ctr) is False:
        out.append(CheckResult(name=CheckName.LAYER_AMX, status="fail", layer="container",
                               detail="AMX tiles work on the host but not in the container",
                               fix="Run the container without a seccomp/arch_prctl restriction "
                                   "(a custom seccomp profile blocking arch_prctl), same kernel as the host."))
    hg, cg = host.gpu.count, ctr.gpu.count
    gdata = {"host_gpus": hg, "container_gpus": cg, "container_nvidia_smi": ctr.gpu.nvidia_smi,
             "host_nvidia_runtime": host.docker.nvidia_runtime}
    if hg and cg < hg:
        if ctr.gpu.device_nodes and ctr.gpu.nvidia_smi != "ok":
            why, fix = ("the container has /dev/nvidia* nodes but nvidia-smi does not work (driver libraries not "
                        "injected)", "Start it with the nvidia runtime: --runtime nvidia or --gpus all with "
                                     "nvidia-container-toolkit configured.")
        elif not host.docker.nvidia_runtime:
            why, fix = ("docker on the host has no nvidia runtime", "Install nvidia-container-toolkit, run "
                        "`nvidia-ctk runtime configure --runtime=docker` and restart docker; start with --gpus all.")
        else:
            why, fix = ("the container was started without GPUs", "Start the container with --gpus all (or "
                        "--gpus '\"device=0,1\"' for deploy.gpus).")
        out.append(CheckResult(name=CheckName.LAYER_GPUS, status="fail", layer="container", data=gdata,
                               detail=f"host has {hg} GPU(s), the container sees {cg}: {why}", fix=fix))
    elif hg:
        out.append(CheckResult(name=CheckName.LAYER_GPUS, status="pass", layer="container", data=gdata,
                               detail=f"the container sees all {hg} host GPU(s)"))
    else:
        out.append(CheckResult(name=CheckName.LAYER_GPUS, status="skip", layer="container", data=gdata,
                               detail="the host has no GPU to pass through"))
    return out
