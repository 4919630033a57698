#!/usr/bin/env python3
"""Fetch the matched KT SFT wheel set for the GPU machine and slim it to fit one device call.

The GPU machine (Python 3.12, torch 2.11, no internet) gets the exact versions that
``ktransformers[sft]`` pins, as cp312 manylinux x86_64 wheels, downloaded here with pip.
transformers-kt, accelerate-kt and kt-kernel each carry a slice of an sglang GPU kernel
payload (~90 MB) that fine-tuning never imports; we re-pack those wheels keeping only the
import packages named in their ``top_level.txt`` (plus ``<pkg>.libs`` and the dist-info) and
rewrite RECORD so pip installs them cleanly. No wheel is committed: the output folder is
git-ignored and travels with the device call's ``carry``.

Versions come from the full image's lock (``docker/requirements/full.lock``, ``name==version``
lines) for every package it names, else from the pins below (ktransformers[sft]==0.7.2).

    python bench/gpu/fetch_wheels.py            # -> bench/gpu/.carry/wheels/
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench/gpu/.carry/wheels"

# The matched SFT set (what ktransformers[sft]==0.7.2 pins) and the small runtime deps the GPU
# machine's image lacks. Packages the image already has (numpy, pyarrow, pandas, psutil, rich,
# typer, safetensors, huggingface-hub, ...) are not carried.
PINS: dict[str, str] = {
    "llamafactory-kt": "==0.9.6.dev0",
    "transformers-kt": "==5.6.0.post6",
    "accelerate-kt": "==1.14.0.post4",
    "peft-kt": "==0.18.1",
    "trl-kt": "==0.24.0",
    "kt-kernel": "==0.7.2",
    "datasets": "==4.0.0",
    "fsspec": "==2025.3.0",
    "dill": "==0.3.8",            # datasets 4.0.0: dill<0.3.9
    "multiprocess": "==0.70.16",  # datasets 4.0.0: multiprocess<0.70.17
    "fire": "==0.7.1",
    "termcolor": ">=2,<4",        # fire
    "omegaconf": "==2.4.0",
    "tyro": "==0.8.14",           # llamafactory: tyro<0.9
    "docstring-parser": ">=0.16",  # tyro
    "shtab": ">=1.5.6",           # tyro
    "gguf": "==0.19.0",
    "tokenizers": "==0.22.2",     # transformers-kt: >=0.22.0,<=0.23.0 (the image has 0.23.2)
    # ktdeploy's own light deps missing from the image (pyinfra is only needed for SSH hosts).
    "pydantic": "==2.12.5",
    "pydantic-core": "==2.41.5",
    "annotated-types": ">=0.6",
    "typing-inspection": ">=0.4.2",
    "ruamel.yaml": "==0.18.16",
}

# `--eval` (bench/gpu/eval_proof.py): LlamaFactory's own api server (fastapi, uvicorn, sse-starlette), the eval
# client (httpx) and LlamaFactory's metric libraries (nltk, rouge-chinese; jieba has no wheel on PyPI and is built
# here from its sdist, slimmed to what jieba.cut reads). Versions from the full lock where it names them.
EVAL_PINS: dict[str, str] = {
    "fastapi": "==0.163.2", "starlette": ">=0.40", "uvicorn": "==0.55.0", "sse-starlette": "==3.7.1",
    "h11": ">=0.16", "anyio": ">=4", "httpx": "==0.29.0", "httpcore": ">=1.0.9", "nltk": ">=3.9",
    "rouge-chinese": "==1.0.3", "joblib": ">=1.4",
    "opentelemetry-api": "==1.45.2", "annotated-doc": ">=0.0.2", "click": ">=7",   # fastapi 0.163 and uvicorn need them at start (the GPU run found opentelemetry missing)
}
JIEBA = "jieba==0.42.1"
# jieba.cut (what LlamaFactory's metric calls) reads jieba/dict.txt and jieba/finalseg; the keyword extraction
# (analyse: idf.txt) and part-of-speech (posseg) data are never imported by it
JIEBA_DROP = ("jieba/analyse/", "jieba/posseg/", "jieba/lac_small/")

# Tools the benches use but the trainer never imports: downloaded into .carry/tools/, which setup() does not install
# (bench/gpu/overhead.py installs py-spy there for its Q runs).
TOOLS = {"py-spy": "==0.4.3"}

# Wheels whose non-import payload we strip.
SLIM = {"transformers-kt", "accelerate-kt", "kt-kernel"}

PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_lock() -> Path | None:
    for pattern in ("docker/requirements/full.lock", "docker/*.lock", "docker/**/*.lock"):
        hits = sorted(ROOT.glob(pattern))
        if hits:
            return hits[0]
    return None


def lock_versions(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements-style lock (hashes, comments, markers ignored)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip().rstrip("\\").strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s,]+)", line)
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def resolve_pins(lock: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    specs, source = [], {}
    for name, spec in PINS.items():
        v = lock.get(_norm(name))
        if v:
            specs.append(f"{name}=={v}")
            source[name] = "lock"
        else:
            specs.append(f"{name}{spec}")
            source[name] = "pin"
    return specs, source


def download(specs: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim_wheel(src: Path, dest: Path) -> tuple[int, int]:
    """Re-pack ``src`` keeping its import packages, ``<pkg>.libs`` and dist-info; rewrite RECORD."""
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        top = zin.read(f"{dist_info}/top_level.txt").decode().split()
        keep_roots = {dist_info, *top, *(f"{t}.libs" for t in top)}
        kept = [n for n in names if n.split("/")[0] in keep_roots and not n.endswith("/")
                and n != f"{dist_info}/RECORD"]
        rows = []
        tmp = dest.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for n in kept:
                data = zin.read(n)
                info = zin.getinfo(n)
                zi = zipfile.ZipInfo(n, date_time=info.date_time)
                zi.external_attr = info.external_attr
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data, compresslevel=9)
                rows.append(f"{n},{_record_hash(data)},{len(data)}")
            rows.append(f"{dist_info}/RECORD,,")
            zout.writestr(f"{dist_info}/RECORD", "\n".join(rows) + "\n")
        tmp.replace(dest)
        return len(names), len(kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--lock", type=Path, default=None, help="requirements-style lock to take versions from")
    ap.add_argument("--eval", action="store_true", help="also the wheels of bench/gpu/eval_proof.py (EVAL_PINS, jieba)")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache/gpu-wheels-raw",
                    help="where the unmodified downloads are kept")
    args = ap.parse_args(argv)

    lock_path = args.lock or find_lock()
    lock = lock_versions(lock_path) if lock_path else {}
    if args.eval:
        PINS.update(EVAL_PINS)
    specs, source = resolve_pins(lock)
    print(f"versions from: {lock_path or 'built-in pins'}")
    for s in specs:
        print(f"  {s:40s} [{source[re.split(r'[=<>]', s, maxsplit=1)[0]]}]")

    if args.cache.exists():  # start clean so no stale version is picked up
        for old in args.cache.glob("*.whl"):
            old.unlink()
    download(specs, args.cache)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    wanted = {_norm(re.split(r"[=<>]", s, maxsplit=1)[0]) for s in specs}
    total = 0
    for whl in sorted(args.cache.glob("*.whl")):
        dist = _norm(whl.name.split("-")[0])
        if dist not in wanted:
            continue
        target = args.out / whl.name
        if dist in {_norm(n) for n in SLIM}:
            before, after = slim_wheel(whl, target)
            note = f"slimmed {before} -> {after} entries"
        else:
            target.write_bytes(whl.read_bytes())
            note = "as published"
        total += target.stat().st_size
        print(f"{target.stat().st_size / 2**20:7.1f} MiB  {whl.name}  ({note})")
    if args.eval:
        total += jieba_wheel(args.cache, args.out)
    print(f"{total / 2**20:7.1f} MiB in {args.out}")
    tools = args.out.parent / "tools"
    for old in tools.glob("*.whl"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64", "-d", str(tools),
                    *[n + v for n, v in TOOLS.items()]], check=True)
    print(f"tools: {sorted(p.name for p in tools.glob('*.whl'))}")
    return 0


def jieba_wheel(cache: Path, out: Path) -> int:
    """jieba's wheel built from its sdist (pure Python), without the data jieba.cut never reads; its size."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(cache), JIEBA], check=True)
    src = next(cache.glob("jieba-*.whl"))
    target = out / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        records = []
        for item in zin.infolist():
            if item.filename.startswith(JIEBA_DROP) and not item.filename.endswith("__init__.py"):
                continue
            if item.filename.endswith(".dist-info/RECORD"):
                record_name = item.filename
                continue
            data = zin.read(item)
            zout.writestr(item, data)
            records.append(f"{item.filename},{_record_hash(data)},{len(data)}")
        zout.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    print(f"{target.stat().st_size / 2**20:7.1f} MiB  {target.name}  (built from the sdist, slimmed)")
    return target.stat().st_size


if __name__ == "__main__":
    sys.exit(main())
