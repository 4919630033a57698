"""`ktdeploy image save --format squashfs|sif`: one image as a Slurm container runtime reads it (docs/scaling.md).

    squashfs   enroot's own import from this machine's docker store (``enroot import -o OUT dockerd://IMAGE``): the
               file pyxis's ``--container-image`` takes
    sif        apptainer's own build from this machine's docker store (``apptainer build OUT docker-daemon://IMAGE``)

The runtime's own tool converts (never a converter of ktdeploy's); where it is missing the command says so, naming
where to run it. The file is written beside OUT first and renamed into place, so OUT never holds half an image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ktdeploy.controller.images import docker_cli
from ktdeploy.core.errors import ImageError, UsageError

TOOLS = {"squashfs": ("enroot", "pyxis's image: run it where enroot is installed (a Slurm login or compute node "
                                "with pyxis), or give the job a registry reference instead"),
         "sif": ("apptainer", "apptainer's image: run it where apptainer is installed, or give the job a registry "
                              "reference (docker://) instead")}


def convert_argv(fmt: str, tool: str, image: str, out: Path) -> list[str]:
    if fmt == "squashfs":
        return [tool, "import", "--output", str(out), f"dockerd://{image}"]
    return [tool, "build", str(out), f"docker-daemon:{image}"]


def save_for_runtime(fmt: str, tags: list[str], output: Path) -> int:
    """Write ``output`` (must not exist) from the one image in ``tags``; returns its size."""
    if len(tags) != 1:
        raise UsageError(f"--format {fmt} writes one image, not {len(tags)}", key="--isa",
                         fix="Name one build: --isa amx (one file per build the nodes run).")
    if os.path.lexists(output):
        raise UsageError(f"{output} already exists", key="--output", fix="Choose a new file name or remove it.")
    tool, where = TOOLS[fmt]
    path = shutil.which(tool)
    if path is None:
        raise ImageError(f"{tool} is not installed here: it writes {where.split(':')[0]}", fix=f"Write {where}.")
    if docker_cli.inspect_image(tags[0]) is None:
        raise ImageError(f"image {tags[0]} does not exist", fix=f"Build it first: ktdeploy image build --isa "
                                                                f"{tags[0].split(':')[-1]}")
    part = output.with_name(f".{output.name}.partial")
    if os.path.lexists(part):
        part.unlink()
    proc = subprocess.run(convert_argv(fmt, path, tags[0], part), capture_output=True, text=True)
    if proc.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise ImageError(f"{tool} failed: {(proc.stderr or proc.stdout).strip()[-400:]}", fix="See its message above.")
    os.link(part, output)      # never over a file that appeared meanwhile
    part.unlink()
    return output.stat().st_size
