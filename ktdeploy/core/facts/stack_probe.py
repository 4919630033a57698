"""The image's ML stack as the training container sees it (pure): the stack probe's source, run by the image's
own ``python3`` inside a container started with the training flags, and the parser of what it prints.

The probe is stdlib-only (torch and triton are imported when present; a test image may have neither); it prints
one line ``KTDEPLOY_STACK {json}``. ``parse_stack_output`` turns that (or its absence) into ``StackFacts``;
``ktdeploy/core/checks/stack.py`` judges them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ktdeploy.core.safeio import parse_json

MARKER = "KTDEPLOY_STACK "
TRITON_TIMEOUT_S = 240      # one Triton kernel: compile (gcc on driver.c, ptxas) and run

TRITON_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)
"""
"""The one Triton kernel the stack probe compiles and runs (also bench/gpu/triton_headers.py's)."""

# argv[1]: the number of GPUs the container was given; argv[2]: seconds the Triton step may take.
_PROBE = r'''
import json, os, signal, sys, sysconfig
MARK = "KTDEPLOY_STACK "
KERNEL = __KERNEL__
out = {"python": sys.version.split()[0], "executable": sys.executable, "gpus_asked": int(sys.argv[1])}
def err(e):
    return (type(e).__name__ + ": " + str(e)).strip()[:600]
try:
    paths = sysconfig.get_paths()
    inc = paths.get("include") or ""
    out["include_dir"] = inc
    out["python_h"] = os.path.isfile(os.path.join(inc, "Python.h"))
except Exception as e:
    out["include_error"] = err(e)
t = out["torch"] = {"present": False}
c = out["cuda"] = {"available": False, "device_count": 0}
tr = out["triton"] = {"present": False, "ran": False}
try:
    import torch
    t.update(present=True, version=torch.__version__, cuda_version=getattr(torch.version, "cuda", None))
except Exception as e:
    t["error"] = err(e)
if t["present"]:
    try:
        c["device_count"] = torch.cuda.device_count()
        torch.cuda.init()
        c["available"] = bool(torch.cuda.is_available())
        if c["available"]:
            c["device_name"] = torch.cuda.get_device_name(0)
            (torch.ones(4, device="cuda") * 2).sum().item()
    except Exception as e:
        c["available"] = False
        c["error"] = err(e)
    import shutil, tempfile
    d = tempfile.mkdtemp(prefix="ktdeploy-stack-")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "cache")   # a fresh cache: Triton really compiles
    try:
        import triton
        tr.update(present=True, version=triton.__version__)
    except Exception as e:
        tr["error"] = err(e)
    if tr["present"] and c["available"]:
        def _alarm(signum, frame):
            raise TimeoutError("the Triton kernel did not compile and run within %s s" % sys.argv[2])
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(int(float(sys.argv[2])))
        try:
            # @triton.jit reads its function's source: the kernel lives in a file (not `python -c`); compiling it
            # builds Triton's launcher (driver.c, which includes Python.h)
            import importlib.util
            src = os.path.join(d, "ktdeploy_stack_kernel.py")
            with open(src, "w") as f:  # in the folder mkdtemp just made for this probe
                f.write(KERNEL)
            spec = importlib.util.spec_from_file_location("ktdeploy_stack_kernel", src)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            x = torch.arange(1000, device="cuda", dtype=torch.float32)
            o = torch.empty_like(x)
            mod.add[(4,)](x, x, o, 1000, BLOCK=256)
            torch.cuda.synchronize()
            tr["ran"] = bool(torch.equal(o, x * 2))
            if not tr["ran"]:
                tr["error"] = "the kernel ran but gave wrong results"
        except BaseException as e:
            tr["error"] = err(e)
        finally:
            signal.alarm(0)
    shutil.rmtree(d, ignore_errors=True)
print(MARK + json.dumps(out, sort_keys=True), flush=True)
'''
STACK_PROBE = _PROBE.replace("__KERNEL__", repr(TRITON_KERNEL), 1)


class TorchFacts(BaseModel):
    present: bool = False
    version: str | None = None
    cuda_version: str | None = Field(None, description="torch.version.cuda: the CUDA the wheels were built for.")
    error: str | None = None


class CudaFacts(BaseModel):
    available: bool = False
    device_count: int = 0
    device_name: str | None = None
    error: str | None = None


class TritonFacts(BaseModel):
    present: bool = False
    version: str | None = None
    ran: bool = Field(False, description="one kernel compiled, ran and gave the right result")
    error: str | None = None


class StackFacts(BaseModel):
    ran: bool = Field(False, description="the probe printed its report")
    error: str | None = Field(None, description="why there is no report (python3 missing, timeout, crash)")
    python: str | None = None
    executable: str | None = None
    include_dir: str | None = None
    python_h: bool | None = None
    gpus_asked: int = 0
    torch: TorchFacts = Field(default_factory=TorchFacts)
    cuda: CudaFacts = Field(default_factory=CudaFacts)
    triton: TritonFacts = Field(default_factory=TritonFacts)


def probe_argv(gpus_asked: int, python: str = "python3", triton_timeout: float = TRITON_TIMEOUT_S) -> list[str]:
    return [python, "-c", STACK_PROBE, str(gpus_asked), f"{triton_timeout:g}"]


def parse_stack_output(stdout: str, rc: int | None = 0, stderr: str = "") -> StackFacts:
    """Pure: the probe's output -> StackFacts. No marker line: ``ran`` False with the reason (exit code and the
    last line of stderr: python3 missing, a crash, a timeout)."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(MARKER):
            try:  # the image's text: a number where a version goes is "unreadable", never a crash
                raw = parse_json(line[len(MARKER):])
                if not isinstance(raw, dict):
                    raise ValueError("not an object")
                return StackFacts.model_validate({**raw, "ran": True})
            except ValueError as e:  # pydantic's ValidationError is one
                return StackFacts(error=f"unreadable stack probe report: {str(e).splitlines()[0][:200]}")
    tail = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()]
    why = tail[-1][:300] if tail else "no output"
    if rc == 127:
        why = f"python3 is not in the image ({why})"
    return StackFacts(error=f"the stack probe gave no report (exit {rc}): {why}")
