"""The image half of tools/serve_oracle.py: runs inside a full ktsft image (sglang-kt, kt-kernel, torch on CPU).

    docker run --rm --network none --user 4242:4242 -v "$PWD":/src:ro -w /tmp -e PYTHONPATH=/src:/src/tools \
        --entrypoint python3 ktsft:<build> /src/tools/serve_oracle.py --in-image

Per case: sglang-kt's strict argparse; a ServerArgs built from it without `__post_init__` (that step needs a CUDA
device); sglang-kt's own LoRA checks on a real converted adapter (the tiny model's layout, written by
tests/fakes/kt_layout.py and converted by `ktdeploy convert`); kt-kernel's KTMoEWrapper in the mode sglang-kt uses.
"""

from __future__ import annotations

import argparse
import getpass
import os
import pwd
import tempfile
import traceback
from pathlib import Path

TINY_DIMS = {"layer_idx": 0, "num_experts": 16, "num_experts_per_tok": 4, "hidden_size": 512,
             "moe_intermediate_size": 256, "cpuinfer_threads": 1, "threadpool_count": 1, "chunked_prefill_size": 64}


def _adapter(tmp: Path) -> str:
    """A converted KT adapter of the tiny model: what `up` serves (agent/convert.py over kt-kernel's layout)."""
    from ktdeploy.agent.convert import convert
    from tests.fakes.kt_layout import write_lora_adapter

    raw = tmp / "run"
    raw.mkdir()
    write_lora_adapter(str(raw), base="/srv/models/tiny")
    convert(raw, tmp / "run-sglang", base_model="/srv/models/tiny")
    return str(tmp / "run-sglang")


def _server_args(argv: list[str]):
    """sglang-kt's own parser, strict; then its ServerArgs from the parsed flags with __post_init__ skipped."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)          # an unknown or malformed flag exits 2 here
    post = ServerArgs.__post_init__
    ServerArgs.__post_init__ = lambda self: None   # type: ignore[method-assign]
    try:
        return ServerArgs.from_cli_args(ns)
    finally:
        ServerArgs.__post_init__ = post   # type: ignore[method-assign]


def _wrapper(mode: str, method: str, weight_path: str):
    import torch
    from kt_kernel import KTMoEWrapper

    kw: dict = dict(TINY_DIMS, gpu_experts_mask=torch.zeros(TINY_DIMS["num_experts"], dtype=torch.bool),
              weight_path=weight_path, method=method, mode=mode)
    if mode == "sft":
        kw.update(num_gpu_experts=0, lora_rank=8, lora_alpha=16.0)
    return KTMoEWrapper(**kw)


def _one(c, code, env_overrides: dict[str, str]) -> None:
    saved = dict(os.environ)
    os.environ.update(env_overrides)
    try:
        sa = _server_args(c.argv[3:])
        c.verdicts["sglang-kt argparse"] = "accepted"
        if c.lora:
            sa._normalize_deprecated_kt_lora_path()
            sa.check_lora_server_args()                      # the composite split + KT LoRA path checks
            sa._validate_kt_expert_lora_max_running_requests()
            c.verdicts["sglang-kt LoRA checks"] = f"accepted; expert part {sa.kt_expert_lora_path}"
            sft = code.map_kt_method_to_sft_method(sa.kt_method)
            w = _wrapper("sft", sft, sa.kt_weight_path)
            c.verdicts["kt-kernel KTMoEWrapper(mode=sft)"] = f"{sa.kt_method} -> {sft}: {type(w).__name__} built"
        else:
            try:
                _wrapper("inference", sa.kt_method, sa.kt_weight_path)
                c.verdicts["kt-kernel KTMoEWrapper(mode=inference)"] = f"{sa.kt_method}: built"
            except ValueError:
                raise
            except Exception as err:  # noqa: BLE001 - past kt-kernel's validation, the CPU-only container stops
                c.verdicts["kt-kernel KTMoEWrapper(mode=inference)"] = (
                    f"{sa.kt_method}: accepted; construction then needs a GPU ({type(err).__name__})")
        c.ok = True
    except SystemExit as err:
        c.verdicts["refused"] = f"argparse exit {err.code}"
        c.ok = False
    except Exception as err:  # noqa: BLE001 - every refusal is a verdict, with its message
        c.verdicts["refused"] = f"{type(err).__name__}: {str(err).splitlines()[0][:240] if str(err) else ''}"
        c.verdicts["where"] = traceback.format_exc().strip().splitlines()[-3][:200]
        c.ok = False
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _uid_in_passwd() -> bool:
    try:
        pwd.getpwuid(os.getuid())
        return True
    except KeyError:
        return False


def run_in_image(cases, code, args: list[str]):
    import dataclasses

    import kt_kernel

    from ktdeploy.core import variants as V

    build = str(kt_kernel.__cpu_variant__)

    tmp = Path(tempfile.mkdtemp(prefix="serve-oracle-"))
    adapter = _adapter(tmp)
    results = []
    for c in cases(adapter=adapter, weights="/srv/models/tiny", uid=os.getuid()):
        c.verdicts["kt-kernel build"] = build
        if c.lora and not V.get(build).sft:
            c.expect_ok = False   # a LoRA is served through kt-kernel's SFT wrapper, which this build lacks
        _one(c, code, c.env)
        results.append(c)
    # sglang-kt's LoRA cache without the environment ktdeploy gives it: getpass.getuser() decides the folder name,
    # and raises for a uid absent from passwd (what `docker run --user UID:GID` of an SSH user gives).
    lora = next(c for c in results if c.lora)
    bare = {k: v for k, v in lora.env.items() if k not in ("SGLANG_KT_LORA_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    known = _uid_in_passwd()
    # a case of serve_oracle's own type, made from the LoRA case (this half never imports the other)
    old = dataclasses.replace(lora, name=f"{lora.recipe}: LoRA without SGLANG_KT_LORA_CACHE_DIR (pre-fix env), uid "
                                         f"{os.getuid()} {'in' if known else 'absent from'} passwd",
                              env=bare, expect_ok=known and V.get(build).sft, verdicts={}, ok=None)
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME", "SGLANG_KT_LORA_CACHE_DIR"):
        os.environ.pop(var, None)
    try:
        getpass.getuser()
    except KeyError:
        pass
    _one(old, code, bare)
    results.append(old)
    return results
