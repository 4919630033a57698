"""`ktdeploy prepare-weights` in the full image: kt-kernel's own quantizer, loader and validator decide.

This checkout's ktdeploy runs inside a full ktsft image (kt-kernel 0.7.2, transformers-kt, torch): the tiny model
is built as BF16 and as block FP8, its experts are converted to INT8 and AMXINT4, and each tree must pass
kt-kernel's own `validate_persistent_int8_weights` (INT8) and load through kt-kernel's SFT wrapper with a forward
pass within the stated tolerance of BF16. An interrupted conversion resumes, keeping only re-hashed layers; a
finished one is recognised; a planted staging folder, an existing foreign output and the model folder itself are
refused. Skips without a full image (CI builds only the reduced ones).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ktdeploy.agent.prepare_weights import cpu_runs_sft_kernels
from tests.integration.full_image import full_image_or_skip, why_this_cpu_cannot_run

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
CANDIDATES = ("ktsft:amx", "ktsft:avx512_bf16")
QUIET = "import logging; logging.disable(logging.WARNING)"
_HAS_AMX = cpu_runs_sft_kernels()


@pytest.fixture(scope="module")
def image() -> str:
    return full_image_or_skip(CANDIDATES)


@pytest.fixture(scope="module")
def kernels(image) -> str:
    """The image, for tests that run kt-kernel's own CPU code (its quantizer): they skip where this CPU cannot run
    the image's build (an AVX2-only host, an amx image), as the image's entry point would refuse to start there."""
    why = why_this_cpu_cannot_run(image, but_amx=True)     # without AMX the quantizer runs, the forward check skips
    if why:
        pytest.skip(why)
    return image


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prep")
    os.chmod(d, 0o755)
    return d


def run(image: str, work: Path, *args: str, timeout: float = 600, detach: str | None = None
        ) -> subprocess.CompletedProcess:
    argv = ["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{REPO}:/src:ro", "-v", f"{work}:{work}",
            "-e", "PYTHONPATH=/src", "-w", "/src", "--entrypoint", "python3"]
    if detach:
        argv += ["--name", detach]
    return subprocess.run([*argv, image, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def models(image, work) -> dict[str, Path]:
    out = {}
    for fmt in ("bf16", "fp8"):
        m = work / f"tiny-{fmt}"
        p = run(image, work, "tiny-model", str(m), "--data-dir", str(work / f"data-{fmt}"), "--format", fmt)
        assert p.returncode == 0, p.stderr[-3000:]
        out[fmt] = m
    return out


def _summary(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout)


def test_fp8_tiny_model_is_the_block_fp8_layout_real_checkpoints_use(image, models):
    cfg = json.loads((models["fp8"] / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128] and "lm_head" in q[
        "modules_to_not_convert"]
    code = (f"{QUIET}\nimport torch, json\nfrom safetensors import safe_open\n"
            f"from kt_kernel.sft.weights import load_block_fp8_experts_from_checkpoint_files\n"
            f"from kt_kernel.sft.arch import get_moe_arch_config\nfrom transformers import AutoConfig\n"
            f"c = AutoConfig.from_pretrained('{models['fp8']}')\nmoe = get_moe_arch_config(c)\n"
            f"w = load_block_fp8_experts_from_checkpoint_files(['{models['fp8']}/model.safetensors'], None, "
            f"'model.layers', moe, 1, c.hidden_size)\n"
            f"print(json.dumps({{'n': len(w.gate_proj), 'dtype': str(w.gate_proj[0].dtype), "
            f"'scale': list(w.gate_scale[0].shape)}}))")
    p = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "65534", "-v", f"{models['fp8'].parent}:"
                        f"{models['fp8'].parent}:ro", "--entrypoint", "python3", image, "-c", code],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"n": cfg["num_local_experts"], "dtype": "torch.float8_e4m3fn", "scale": [256 // 128, 512 // 128]}


@pytest.mark.parametrize("fmt, src, pools", [("int8", "bf16", 1), ("amxint4", "bf16", 1), ("int8", "fp8", 2)])
def test_conversion_passes_kt_kernels_own_checks(kernels, work, models, fmt, src, pools):
    image = kernels
    out = work / f"{src}-{fmt}-{pools}"
    s = _summary(run(image, work, "prepare-weights", str(models[src]), "--format", fmt, "-o", str(out),
                     "--threadpools", str(pools), "--threads", "2", "--json"))
    fwd = s["verify"]["forward"]
    if _HAS_AMX:
        assert fwd["ok"] and fwd["rel_l2"] <= fwd["tolerance"] and fwd["loader"].endswith(
            "INT8_SFT" if fmt == "int8" else "AMXINT4_SFT")
    else:   # kt-kernel's SFT kernels are AMX code (SIGILL elsewhere): the check says it did not run, and why
        assert fwd["ok"] is None and "has no AMX" in fwd["skipped"], fwd
    assert s["layers"] == 4 and s["pools"] == pools and s["files"] == 4 * pools * 3 * 16 * 2
    if fmt == "int8":
        assert s["verify"]["kt_kernel"]["validator"].endswith("validate_persistent_int8_weights")
        assert s["verify"]["kt_kernel"]["files"] == s["files"]
    assert not list(work.glob(f".{out.name}.ktdeploy-weights"))     # the staging folder was published whole
    assert (out.stat().st_mode & 0o777) == 0o755
    again = _summary(run(image, work, "prepare-weights", str(models[src]), "--format", fmt, "-o", str(out),
                         "--threadpools", str(pools), "--threads", "2", "--json"))
    assert again["verify"]["already_prepared"] and again["kept_layers"] == 4


def _journaled_layers(stage: Path) -> dict:
    try:     # the journal is replaced atomically; before its first write there is none
        return json.loads((stage / ".ktdeploy-weights-journal.json").read_text())["layers"]
    except (OSError, ValueError, KeyError):
        return {}


def test_an_interrupted_conversion_resumes_with_only_verified_layers(kernels, work, models):
    image = kernels
    out = work / "resumed-INT8"
    name = f"ktd-prep-kill-{uuid.uuid4().hex[:6]}"
    log = work / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(["docker", "run", "--rm", "--network", "none", "--name", name, "--user",
                                 f"{os.getuid()}:{os.getgid()}", "-v", f"{REPO}:/src:ro", "-v", f"{work}:{work}",
                                 "-e", "PYTHONPATH=/src", "-w", "/src", "--entrypoint", "python3", image, "-m",
                                 "ktdeploy", "prepare-weights", str(models["bf16"]), "--format", "int8", "-o", str(out),
                                 "--threads", "1", "--no-verify"], stdout=sink, stderr=subprocess.STDOUT)
    stage = work / f".{out.name}.ktdeploy-weights"
    # SIGKILL straight to the converter (the container's first process, our uid) the moment a layer is journaled:
    # `docker kill` goes through the daemon, and in its latency the tiny model's last layers could finish and publish
    pid, deadline = 0, time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if not pid:
            q = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", name], capture_output=True, text=True)
            pid = int(q.stdout.strip() or 0) if q.returncode == 0 else 0
        if pid and _journaled_layers(stage):
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    subprocess.run(["docker", "kill", name], capture_output=True, timeout=60)
    proc.wait(60)
    said = log.read_text(errors="replace")[-3000:]
    assert stage.is_dir() and not out.exists(), f"nothing is published by an interrupted run:\n{said}"
    kept = sorted(_journaled_layers(stage))
    assert kept, f"the kill came after at least one journaled layer:\n{said}"
    first = kept[0]
    victim = sorted((stage / f"_layer_{first}" / "_numa_0").iterdir())[0]
    victim.write_bytes(b"\0" * victim.stat().st_size)      # same size, other bytes: only the hash tells
    s = _summary(run(image, work, "prepare-weights", str(models["bf16"]), "--format", "int8", "-o", str(out),
                     "--threads", "2", "--json"))
    assert s["kept_layers"] == len(kept) - 1, (kept, s)    # the damaged layer was redone, the others kept
    assert s["verify"]["kt_kernel"]["files"] == 384


def test_refusals_name_the_fix_and_write_nothing(image, work, models):
    p = run(image, work, "prepare-weights", str(models["bf16"]), "--format", "int8", "-o", str(models["bf16"] / "x"))
    assert p.returncode == 2 and "never writes into a model folder" in " ".join(p.stderr.split())
    foreign = work / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    p = run(image, work, "prepare-weights", str(models["bf16"]), "--format", "int8", "-o", str(foreign))
    assert p.returncode == 6 and "never overwrites an output" in " ".join(p.stderr.split())   # README: exit 6
    assert (foreign / "keep.txt").read_text() == "mine"
    planted = work / ".planted.ktdeploy-weights"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    p = run(image, work, "prepare-weights", str(models["bf16"]), "--format", "int8", "-o", str(work / "planted"))
    assert p.returncode == 2 and "open to others" in " ".join(p.stderr.split()), p.stderr
    assert "Traceback" not in p.stderr
