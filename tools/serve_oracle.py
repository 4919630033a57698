"""Serving oracle: the argv `ktdeploy serve` builds, judged by sglang-kt's and kt-kernel's own code.

For every shipped recipe and its serving shape (a LoRA on BF16, FP8, INT8, AMXINT4 experts; a BF16 full
fine-tune), plus the pre-fix full fine-tune method (AMXBF16) that must be refused:

- pure level (`python tools/serve_oracle.py`, the unit tier): the locked sglang-kt and kt-kernel wheels are
  opened into the git-ignored `.cache/serve-oracle/` (from `$KTDEPLOY_ORACLE_WHEELHOUSE`, `.wheelhouse/full`, or
  `pip download` checked against docker/requirements/full.lock). Their code is read with `ast` and the pieces that
  decide the method run as written, without importing the packages (torch, CUDA): sglang-kt
  `srt/layers/moe/kt_ep_wrapper.py` `_KT_SFT_METHOD_BY_INFERENCE_METHOD` + `_map_kt_method_to_sft_method` (what a
  LoRA's `--kt-method` becomes), kt-kernel `experts.py` `INFERENCE_METHODS`/`SFT_METHODS` + the mode/method
  validation at the top of `KTMoEWrapper.__new__`, and sglang-kt `ServerArgs._validate_kt_expert_lora_max_running_requests`.
- image level (`--in-image`, run inside a full ktsft image with this checkout at /src, see
  tests/integration/test_serve_oracle_image.py): sglang-kt's strict argparse (`ServerArgs.add_cli_args`), its LoRA
  and KT-LoRA path checks on a real converted adapter (`check_lora_server_args`: the composite split into
  `$SGLANG_KT_LORA_CACHE_DIR`, `_validate_kt_lora_serving_paths`, the max-running-requests check), and kt-kernel's
  `KTMoEWrapper` constructed in the mode sglang-kt uses, on the image's CPU build. `ServerArgs.__post_init__` is
  skipped: it needs a CUDA device (sgl_kernel loads libcuda), which is the one thing not checked here.

Exit 0 when every verdict is the expected one.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from locked_wheels import locked_wheel

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "serve-oracle"
WHEELS = {"sglang-kt": "sglang_kt-0.7.2-py3-none-manylinux_2_35_x86_64.whl",
          "kt-kernel": "kt_kernel-0.7.2-cp311-cp311-manylinux_2_35_x86_64.whl"}
FILES = {"sglang-kt": ("sglang/srt/layers/moe/kt_ep_wrapper.py", "sglang/srt/server_args.py"),
         "kt-kernel": ("kt_kernel/experts.py",)}
RECIPES = ("qwen35-397b-bf16-lora", "deepseek-v3-fp8-lora", "qwen3-235b-int8-lora", "qwen35-397b-amxint4-lora",
           "glm-4.5-air-bf16-full", "tiny-moe-lora")
MARK = "SERVE-ORACLE "
OLD_FULL_METHOD = "AMXBF16"   # what `ktdeploy serve` passed for a full fine-tune before core/kt_methods.py


# ---------------------------------------------------------------- the wheels' files

def _wheel(dist: str) -> Path:
    name = WHEELS[dist]
    dirs = [Path(os.environ["KTDEPLOY_ORACLE_WHEELHOUSE"])] if os.environ.get("KTDEPLOY_ORACLE_WHEELHOUSE") else []
    dirs += [ROOT / ".wheelhouse" / "full", ROOT / ".cache" / "stack-oracle"]
    return locked_wheel(dist, name, CACHE, [d / name for d in dirs])


def source(dist: str, path: str) -> str:
    """One file of the locked wheel, extracted once into the cache."""
    dst = CACHE / "src" / dist / path
    if not dst.is_file():
        with zipfile.ZipFile(_wheel(dist)) as z:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(z.read(path))
    return dst.read_text()


def _pieces(text: str, names: set[str]) -> dict[str, ast.stmt]:
    """Top-level assignments / functions / classes of a module, by name."""
    out: dict[str, ast.stmt] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            out[node.targets[0].id] = node
        elif isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            out[node.name] = node
    missing = names - set(out)
    if missing:
        raise SystemExit(f"not found in the wheel: {sorted(missing)} (the oracle targets sglang-kt/kt-kernel 0.7.2)")
    return out


def _run(nodes: list[ast.stmt], ns: dict[str, Any]) -> dict[str, Any]:
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "<wheel>", "exec"), ns)  # noqa: S102 - the wheel's own code
    return ns


@dataclass
class RealCode:
    kt_sft_map: dict[str, str]
    map_kt_method_to_sft_method: Any
    inference_methods: frozenset
    sft_methods: frozenset
    validate_mode_method: Any            # the checks at the top of KTMoEWrapper.__new__
    validate_max_running_requests: Any   # ServerArgs._validate_kt_expert_lora_max_running_requests


def real_code(from_installed: bool = False) -> RealCode:
    """The deciding pieces of the two wheels (or of the installed packages, inside the image)."""
    def text(dist: str, path: str) -> str:
        if from_installed:
            import importlib.util
            top = importlib.util.find_spec(path.split("/")[0])
            assert top is not None and top.submodule_search_locations
            return (Path(top.submodule_search_locations[0]).parent / path).read_text()
        return source(dist, path)

    wrap = _pieces(text("sglang-kt", FILES["sglang-kt"][0]),
                   {"_KT_SFT_METHOD_BY_INFERENCE_METHOD", "_map_kt_method_to_sft_method"})
    ns = _run([wrap["_KT_SFT_METHOD_BY_INFERENCE_METHOD"], wrap["_map_kt_method_to_sft_method"]], {})
    exp = _pieces(text("kt-kernel", FILES["kt-kernel"][0]), {"INFERENCE_METHODS", "SFT_METHODS", "KTMoEWrapper"})
    kns = _run([exp["INFERENCE_METHODS"], exp["SFT_METHODS"]], {})
    new = next(n for n in exp["KTMoEWrapper"].body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    checks = [n for n in new.body if isinstance(n, ast.If)][:2]   # "Validate mode", "Validate method matches mode"
    fn = ast.parse("def validate_mode_method(mode, method):\n    pass\n").body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.body = checks
    _run([ast.fix_missing_locations(fn)], kns)
    sa = _pieces(text("sglang-kt", FILES["sglang-kt"][1]), {"ServerArgs"})["ServerArgs"]
    assert isinstance(sa, ast.ClassDef)
    mrr = next(n for n in sa.body if isinstance(n, ast.FunctionDef) and n.name == "_validate_kt_expert_lora_max_running_requests")
    mns = _run([mrr], {})
    return RealCode(ns["_KT_SFT_METHOD_BY_INFERENCE_METHOD"], ns["_map_kt_method_to_sft_method"],
                    kns["INFERENCE_METHODS"], kns["SFT_METHODS"], kns["validate_mode_method"],
                    mns["_validate_kt_expert_lora_max_running_requests"])


# ---------------------------------------------------------------- ktdeploy's argv

@dataclass
class Case:
    name: str
    recipe: str
    lora: bool
    argv: list[str]
    env: dict[str, str]
    expect_ok: bool = True
    verdicts: dict[str, str] = field(default_factory=dict)
    ok: bool | None = None


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def cases(adapter: str = "/srv/out/run-sglang", weights: str = "/srv/out/run", uid: int = 4242) -> list[Case]:
    """Every shipped recipe in its serving shape, built exactly as `ktdeploy serve` (in the container) builds it."""
    sys.path.insert(0, str(ROOT))
    from ktdeploy.agent.serve import build_serve_command
    from ktdeploy.core.recipe import builtin_recipe, load_recipe
    from ktdeploy.core.served import Served

    out = []
    for name in RECIPES:
        r = load_recipe(builtin_recipe(name))
        full = r.train.get("finetuning_type") == "full"
        cmd = build_serve_command(r, Served("weights", weights) if full else Served("adapter", adapter), cpuinfer=4,
                                  threadpools=1, environ={"HOME": "/tmp"}, uid=uid)
        out.append(Case(f"{name}: {'full fine-tune' if full else 'LoRA'}", name, not full, cmd.argv, cmd.env))
        if full:
            old = list(cmd.argv)
            old[old.index("--kt-method") + 1] = OLD_FULL_METHOD
            out.append(Case(f"{name}: full fine-tune with the pre-fix --kt-method {OLD_FULL_METHOD}", name, False,
                            old, cmd.env, expect_ok=False))
    return out


def pure_verdict(c: Case, code: RealCode) -> Case:
    method = _flag(c.argv, "--kt-method") or ""
    try:
        if c.lora:
            sft = code.map_kt_method_to_sft_method(method)
            c.verdicts["sglang-kt method map"] = f"{method} -> {sft}"
            code.validate_mode_method("sft", sft)
            c.verdicts["kt-kernel KTMoEWrapper(mode=sft)"] = f"{sft} accepted"
            code.validate_max_running_requests(SimpleNamespace(
                kt_lora_path=None, kt_expert_lora_path="(split)",
                max_running_requests=int(_flag(c.argv, "--max-running-requests") or 0)))
            c.verdicts["sglang-kt max-running-requests"] = "accepted"
        else:
            code.validate_mode_method("inference", method)
            c.verdicts["kt-kernel KTMoEWrapper(mode=inference)"] = f"{method} accepted"
        c.ok = True
    except ValueError as err:
        c.verdicts["refused"] = str(err).splitlines()[0][:240]
        c.ok = False
    return c


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--in-image"]:
        from serve_oracle_image import run_in_image  # tools/serve_oracle_image.py: imports sglang, torch

        results = run_in_image(cases, real_code(from_installed=True), args[1:])
    else:
        code = real_code()
        results = [pure_verdict(c, code) for c in cases()]
    # One marked line: kt-kernel's C++ side prints to the same stdout in the image.
    print(MARK + json.dumps([asdict(c) | {"argv": c.argv[3:]} for c in results]))
    bad = [c.name for c in results if c.ok is not c.expect_ok]
    if bad:
        print("unexpected verdicts: " + "; ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
