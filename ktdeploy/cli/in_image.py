"""The fix for an in-image command started on the controller, where the ML stack is missing: the same command as
a `docker run` to paste, with the image this machine's CPU takes and the folders it names mounted."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

from ktdeploy.core import variants as V
from ktdeploy.core.errors import UsageError


def local_image() -> str:
    """The ktsft image this machine's CPU takes (kt-kernel's own detection from /proc/cpuinfo), else the AVX2 one."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        flags = []
    return V.image(V.detect(flags).name)


def in_image_fix(command: str, *folders: Path, args: str = "") -> str:
    """``folders``: what the command reads or writes, mounted at the same paths; ``args``: its arguments."""
    mounts = " ".join(f"-v {shlex.quote(str(d))}:{shlex.quote(str(d))}" for d in dict.fromkeys(f.resolve() for f in folders))
    return (f"run it inside the image (the image must be on this machine: `ktdeploy image build`, or `ktdeploy image "
            f"load` of a saved tarball): docker run --rm --user $(id -u):$(id -g) {mounts} {local_image()} {command} "
            f"{args}".rstrip())


def require_module(module: str, command: str, what: str, *folders: Path, args: str = "") -> None:
    """A usage error naming the fix when ``module`` (part of the image's stack) is not installed here."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{command} needs {what}, which is installed only in the ktsft image",
                         fix=in_image_fix(command, *(f if f.is_dir() else f.parent for f in folders), args=args))
