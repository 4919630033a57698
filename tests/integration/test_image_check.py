"""`ktdeploy doctor --image IMAGE`: the container readiness check against real images on this machine.

The Python.h check is proven for real: the base image (python3.11-dev installed) passes, an image derived from it
with /usr/include/python3.11/Python.h deleted fails with the fix. No GPU here: the GPU checks fail with their
reason (gpu.present in the container); CUDA / one Triton kernel need a GPU host (bench/results/gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.hosts import BASE_IMAGE, image_exists, machine_cpu_flags

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
NOHEADERS = f"ktimgchk-noheaders:{os.getpid()}"
# this machine's docker may refuse --ulimit memlock=-1 (rootless, no CAP_SYS_RESOURCE): waived like up's test hosts
MEMLOCK = ("--waive", "docker.memlock")


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def by_layer(rep: dict, layer: str = "container") -> dict:
    """The container's checks (the host's own come first; on a host that is itself a container both are
    'container': the later one is the image's)."""
    out: dict = {}
    for c in rep["checks"]:
        if c["layer"] == layer:
            out[c["name"]] = c
    return out


@pytest.fixture(scope="module")
def base_image():
    if not image_exists(BASE_IMAGE):
        subprocess.run([str(REPO / "docker" / "base" / "build-base.sh"), BASE_IMAGE], check=True)
    return BASE_IMAGE


@pytest.fixture(scope="module")
def noheaders_image(base_image):
    p = subprocess.run(["docker", "build", "-q", "-t", NOHEADERS, "-"], capture_output=True, text=True, timeout=600,
                       input=f"FROM {base_image}\nRUN rm /usr/include/python3.11/Python.h\n")
    assert p.returncode == 0, p.stderr
    yield NOHEADERS
    subprocess.run(["docker", "image", "rm", "--force", NOHEADERS], capture_output=True)


def test_image_with_headers_passes_the_header_check(base_image):
    r = cli("doctor", "--image", base_image, "--json", *MEMLOCK)
    assert r.returncode == 1, r.stderr     # no GPU, no torch here
    rep = json.loads(r.stdout)
    c = by_layer(rep)
    assert c["image.run"]["status"] == "pass" and "--ipc=host" in c["image.run"]["data"]["argv"]
    assert c["stack.probe"]["status"] == "pass"
    assert c["stack.python_headers"]["status"] == "pass"
    assert "/usr/include/python3.11/Python.h" in c["stack.python_headers"]["detail"]
    assert c["stack.torch"]["status"] == "fail" and "No module named 'torch'" in c["stack.torch"]["detail"]
    assert c["stack.cuda"]["status"] == "skip" and c["stack.triton"]["status"] == "skip"
    # the layer checks doctor runs in a container, as the training container sees the machine
    assert c["gpu.present"]["status"] == "fail" and c["gpu.driver"]["status"] == "skip"
    assert c["cpu.isa.avx2"]["status"] == "pass"
    amx = "pass" if "amx_tile" in machine_cpu_flags() else "skip"
    assert c["cpu.amx.tile_exec"]["status"] == amx
    assert c["layer.cpu_flags"]["status"] == "pass"
    assert c["memory.shm"]["status"] == "pass"          # --ipc=host: the host's /dev/shm, not docker's 64 MiB
    assert c["numa.mempolicy"]["status"] in ("pass", "warn")   # SYS_NICE given
    assert set(rep["failed"]) >= {"gpu.present", "stack.torch"} and "stack.python_headers" not in rep["failed"]
    # nothing left behind: this run's container (its name is in the argv the report records; any other
    # image-check container on the engine belongs to another run, e.g. a concurrent `up`)
    argv = c["image.run"]["data"]["argv"]
    name = argv[argv.index("--name") + 1]
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{name}$", "--filter",
                           "label=ktdeploy.role=image-check"], capture_output=True, text=True).stdout.split()
    assert not left


def test_image_without_headers_fails_with_the_dev_package_fix(noheaders_image):
    r = cli("doctor", "--image", noheaders_image, *MEMLOCK, "--waive", "gpu.present", "--waive", "stack.torch",
            "--waive", "docker.nvidia_runtime")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stack.python_headers" in r.stdout and "python3.11-dev" in r.stdout
    rep = json.loads(cli("doctor", "--image", noheaders_image, "--json", *MEMLOCK, "--waive", "gpu.present",
                         "--waive", "stack.torch", "--waive", "docker.nvidia_runtime").stdout)
    c = by_layer(rep)
    assert c["stack.python_headers"]["status"] == "fail"
    assert "ktdeploy image build" in c["stack.python_headers"]["fix"]
    assert rep["failed"] == ["stack.python_headers"]


def test_waivers_make_a_cpu_only_box_pass(base_image):
    r = cli("doctor", "--image", base_image, *MEMLOCK, "--waive", "gpu.present", "--waive", "stack.torch",
            "--waive", "docker.nvidia_runtime")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WAIVED" in r.stdout and "stack.torch" in r.stdout


def test_missing_image_is_a_failed_check_not_a_traceback():
    r = cli("doctor", "--image", "ktimgchk-absent:nope", "--json", *MEMLOCK)
    assert r.returncode == 1, r.stderr
    c = by_layer(json.loads(r.stdout))
    assert c["image.run"]["status"] == "fail" and "ktimgchk-absent:nope" in c["image.run"]["detail"]
    assert "stack.python_headers" not in c


def test_bare_variant_still_means_the_variant_check():
    for args in (("--image", "avx2"), ("--variant", "avx2")):
        rep = json.loads(cli("doctor", "--json", *args).stdout)
        names = {c["name"] for c in rep["checks"]}
        assert "image.variant" in names and "image.run" not in names
