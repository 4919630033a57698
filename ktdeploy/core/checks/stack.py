"""The image's stack in the training container (pure): Python headers, torch, CUDA, one Triton kernel, and the
stack's own judgement of the recipe (``stack.judge``).

Judges ``StackFacts`` (``core/facts/stack_probe.py``). The driver-vs-CUDA check is ``gpu.driver`` on the container's
nvidia-smi facts (``resources.gpu_driver_check``), not repeated here. Without a GPU the CUDA and Triton checks
fail with that reason (waive them on a CPU-only box like ``gpu.present``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult, Status
from ktdeploy.core.facts.stack_probe import StackFacts

if TYPE_CHECKING:
    from ktdeploy.core.recipe.finding import Finding
    from ktdeploy.core.recipe.stack_judge_payload import JudgeResult

LAYER = "container"
REBUILD = "rebuild the image with `ktdeploy image build` (its base installs python3.11-dev)"


def _c(name: CheckName, status: Status, detail: str, fix: str = "", **data: Any) -> CheckResult:
    return CheckResult(name=name, status=status, detail=detail, fix=fix, layer=LAYER, data=data)


def probe_check(s: StackFacts) -> CheckResult:
    if s.ran:
        return _c(CheckName.STACK_PROBE, "pass", f"the stack probe ran in the image (Python {s.python}, {s.executable})")
    return _c(CheckName.STACK_PROBE, "fail", s.error or "the stack probe gave no report",
              "Check that the image runs `python3` (docker run --rm --entrypoint python3 IMAGE -V).")


def python_headers_check(s: StackFacts) -> CheckResult:
    name = CheckName.STACK_PYTHON_HEADERS
    if not s.ran:
        return _c(name, "skip", "skipped: the stack probe gave no report")
    ver = ".".join((s.python or "3").split(".")[:2])
    where = f"{s.include_dir}/Python.h" if s.include_dir else "Python.h"
    if s.python_h:
        return _c(name, "pass", f"{where} present for Python {s.python} (Triton can build its launcher)",
                  include_dir=s.include_dir)
    return _c(name, "fail",
              f"{where} is missing for Python {s.python}: Triton compiles its launcher (driver.c, which includes "
              f"Python.h) at the first kernel launch, so every Triton kernel (sglang's --lora-backend triton, "
              f"torch.compile) fails there",
              f"Install python{ver}-dev in the image, or {REBUILD}.", include_dir=s.include_dir)


def torch_check(s: StackFacts) -> CheckResult:
    name = CheckName.STACK_TORCH
    if not s.ran:
        return _c(name, "skip", "skipped: the stack probe gave no report")
    if s.torch.present:
        return _c(name, "pass", f"torch {s.torch.version} imports (built for CUDA {s.torch.cuda_version or 'none'})",
                  version=s.torch.version, cuda=s.torch.cuda_version)
    return _c(name, "fail", f"torch does not import in the image: {s.torch.error or 'not installed'}",
              "Use a ktsft image (`ktdeploy image build`): the training stack is torch + kt-kernel.")


def cuda_check(s: StackFacts) -> CheckResult:
    name = CheckName.STACK_CUDA
    if not s.ran or not s.torch.present:
        return _c(name, "skip", "skipped: " + ("the stack probe gave no report" if not s.ran else "no torch"))
    data: dict[str, Any] = {"asked": s.gpus_asked, "device_count": s.cuda.device_count, "cuda": s.torch.cuda_version}
    if not s.cuda.available:
        why = s.cuda.error or ("no GPU visible in the container" if not s.cuda.device_count else "is_available() False")
        fix = ("Run on a GPU host with the NVIDIA container runtime (docker.nvidia_runtime) and give the container "
               "GPUs (deploy.gpus); on a CPU-only box waive it (--waive stack.cuda).") if s.gpus_asked == 0 or \
            not s.cuda.device_count else "Check gpu.driver and the NVIDIA container toolkit on the host."
        return _c(name, "fail", f"CUDA did not initialise in torch ({s.gpus_asked} GPU(s) asked): {why}", fix, **data)
    if s.gpus_asked and s.cuda.device_count != s.gpus_asked:
        return _c(name, "fail", f"torch sees {s.cuda.device_count} GPU(s), the container was given {s.gpus_asked}",
                  "Check deploy.gpus against `nvidia-smi -L` on the host and the NVIDIA runtime's device mapping.",
                  **data)
    return _c(name, "pass", f"CUDA initialised: {s.cuda.device_count} GPU(s) ({s.cuda.device_name}), one kernel ran",
              **data)


def triton_check(s: StackFacts) -> CheckResult:
    name = CheckName.STACK_TRITON
    if not s.ran or not s.torch.present:
        return _c(name, "skip", "skipped: " + ("the stack probe gave no report" if not s.ran else "no torch"))
    if not s.triton.present:
        return _c(name, "fail", f"triton does not import in the image: {s.triton.error or 'not installed'}",
                  f"Use a ktsft image: {REBUILD}.")
    if not s.cuda.available:
        return _c(name, "fail", f"no Triton kernel run: CUDA is not available in the container (triton "
                                f"{s.triton.version})",
                  "Needs a GPU (see stack.cuda); on a CPU-only box waive it (--waive stack.triton).")
    if s.triton.ran:
        return _c(name, "pass", f"one Triton kernel compiled and ran (triton {s.triton.version})",
                  version=s.triton.version)
    err = s.triton.error or "unknown error"
    headers = "Python.h" in err or s.python_h is False
    return _c(name, "fail", f"the Triton kernel failed (triton {s.triton.version}): {err}",
              f"Install python{'.'.join((s.python or '3').split('.')[:2])}-dev in the image, or {REBUILD}."
              if headers else "Read the error above; `docker run` the image and run the kernel by hand.",
              version=s.triton.version)


def stack_checks(s: StackFacts) -> list[CheckResult]:
    return [probe_check(s), python_headers_check(s), torch_check(s), cuda_check(s), triton_check(s)]


JUDGE = CheckName.STACK_JUDGE


def judge_check(result: JudgeResult, findings: list[Finding]) -> CheckResult:
    """``stack.judge``: the stack's own verdict on the recipe (core/recipe/stack_judge_payload.py JudgeResult), with the
    findings (``core/recipe/stack_judge_payload.findings``) of a refusal in ``data["findings"]``: up and train refuse with
    exactly those (RecipeError), the same report as ``ktdeploy check --stack``."""
    data: dict[str, Any] = {"verdict": result.status, "stages": result.stages, "bypassed": result.bypassed,
                            "versions": result.versions, "seconds": result.seconds}
    lf, kt, acc = (result.versions.get(k, "?") for k in ("llamafactory-kt", "kt-kernel", "accelerate-kt"))
    if result.status == "accepted":
        secs = f" in {result.seconds:.0f} s" if result.seconds is not None else ""
        return _c(JUDGE, "pass", f"the stack accepts the recipe{secs}: accelerate-kt {acc} launch parsing and KT "
                  f"plugin, LlamaFactory-KT {lf} get_train_args, kt-kernel {kt} KTConfig and wrapper checks "
                  "(no weights loaded)", **data)
    if result.status == "refused":
        data["findings"] = [f.to_json() for f in findings]
        first = findings[0] if findings else None
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        return _c(JUDGE, "fail", f"the stack refuses the recipe: {first.path}: {first.message}{more}" if first else
                  "the stack refuses the recipe", "Fix the keys listed (`ktdeploy check RECIPE --stack` prints the "
                  "same report).", **data)
    if result.status == "absent" and any(m.startswith("ktdeploy") for m in result.missing):
        data["missing"] = result.missing
        return _c(JUDGE, "fail", f"the image has no ktdeploy stack judge (its ktdeploy is missing or older than the "
                  f"judge: {result.detail}); nothing judged the recipe", "Rebuild the image (`ktdeploy image build`); "
                  "on a test double: --waive stack.judge.", **data)
    if result.status == "absent":
        data["missing"] = result.missing
        return _c(JUDGE, "fail", f"the image has no LlamaFactory/kt-kernel stack to judge the recipe with (missing: "
                  f"{', '.join(result.missing) or '?'})", "Use a full image (`ktsft:<build>`, `ktdeploy image "
                  "build`); on a test double or reduced image: --waive stack.judge.", **data)
    return _c(JUDGE, "fail", f"the stack judge did not give a verdict: {result.detail}",
              "Run `ktdeploy check RECIPE --stack --image IMAGE` to see it; or --waive stack.judge.", **data)
