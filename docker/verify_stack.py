#!/usr/bin/env python3
"""Build-time verification: the image refuses to exist when its Python stack is wrong.

    python verify_stack.py --stack full|reduced --stage deps|agent --stack-file stack.toml --lock X.lock

Run inside the image (Dockerfile `deps` and `agent` stages) with the image's interpreter.
Fails (exit 1, every problem listed) when:
- `pip check` prints a line not waived in stack.toml, or a waived line no longer appears;
- an excluded upstream distribution (transformers, accelerate, peft, trl) is installed;
- an installed distribution differs from the lock, or one not in the lock is present;
- a version Python actually imports differs from stack.toml's table (cookbook §1.2), or an
  expected attribute (accelerate's KTransformersPlugin) is missing;
- stage agent: ktdeploy does not import, or its CLI does not start.
Only the standard library is used: this runs before ktdeploy is installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

# The venv's own installer: present in every venv, never in a lock.
VENV_TOOLS = {"pip"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    return {normalize(d.metadata["Name"]): d.version for d in md.distributions()}


def lock_pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9-]+)==(\S+)", lock.read_text(), flags=re.M))


def check_pip(waivers: dict[str, str]) -> tuple[list[str], list[str]]:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    if proc.returncode != 0 and not proc.stdout.strip():
        return [f"pip check failed to run: {proc.stderr.strip()}"], []
    return judge_pip_check(proc.stdout, waivers)


def judge_pip_check(output: str, waivers: dict[str, str]) -> tuple[list[str], list[str]]:
    """(errors, notes) for pip check's output: every line must be waived, every waiver must still apply."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and ln.strip() != "No broken requirements found."]
    errors, notes = [], []
    for line in lines:
        if line in waivers:
            notes.append(f"pip check (waived: {waivers[line]}): {line}")
        else:
            errors.append(f"pip check: {line}")
    for line in waivers:
        if line not in lines:
            errors.append(f"pip check: waived line no longer reported, drop the stale waiver: {line!r}")
    return errors, notes


def check_lock(pins: dict[str, str], have: dict[str, str], extra_allowed: set[str]) -> list[str]:
    errors = []
    for name, version in sorted(pins.items()):
        if name not in have:
            errors.append(f"lock: {name}=={version} is not installed")
        elif have[name] != version:
            errors.append(f"lock: {name} is {have[name]}, the lock says {version}")
    for name in sorted(set(have) - set(pins) - VENV_TOOLS - extra_allowed):
        errors.append(f"lock: {name}=={have[name]} is installed but not in the lock")
    return errors


def check_expectations(expect: dict, excluded: dict[str, str], have: dict[str, str]) -> tuple[list[str], list[str]]:
    errors, table = [], []
    for name, reason in excluded.items():
        if normalize(name) in have:
            errors.append(f"excluded distribution {name}=={have[normalize(name)]} is installed ({reason})")
    for dist, want in expect.get("dist", {}).items():
        got = have.get(normalize(dist))
        table.append(f"{dist:16s} {got or 'MISSING':14s} (distribution, want {want})")
        if got != want:
            errors.append(f"distribution {dist}: installed {got or 'nothing'}, want {want}")
    for module, want in expect.get("module", {}).items():
        try:
            got = str(getattr(importlib.import_module(module), "__version__", "unknown"))
        except Exception as exc:  # an import that crashes is exactly what this must report
            errors.append(f"import {module} failed: {type(exc).__name__}: {exc}")
            continue
        table.append(f"{module:16s} {got:14s} (import, want {want})")
        if got != want:
            errors.append(f"import {module}: __version__ is {got}, want {want}")
    for module, attr in expect.get("attr", {}).items():
        try:
            getattr(importlib.import_module(module), attr)
            table.append(f"{module}.{attr}: importable")
        except Exception as exc:
            errors.append(f"{module}.{attr} not importable: {type(exc).__name__}: {exc}")
    return errors, table


def check_agent() -> list[str]:
    errors = []
    try:
        import ktdeploy  # noqa: F401
        import ktdeploy.cli.image_entry  # noqa: F401
    except Exception as exc:
        return [f"import ktdeploy failed: {type(exc).__name__}: {exc}"]
    proc = subprocess.run([sys.executable, "-m", "ktdeploy", "--help"], capture_output=True, text=True)
    if proc.returncode != 0:
        errors.append(f"`ktdeploy --help` exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return errors


# What the content manifest covers: everything pip and the build put into the image.
MANIFEST_ROOTS = (Path("/opt/venv"), Path("/opt/ktdeploy"))


def manifest_lines(roots=MANIFEST_ROOTS, cache: Path | None = None) -> list[str]:
    """One line per file/link under roots: `sha256 mode path` (links: `link -> target`), sorted.
    Timestamps are left out: two builds of the same inputs must give the same lines.

    ``cache`` (a folder the build keeps per dependency-image ID) holds `size mtime_ns sha256 path` of the
    dependency image's files from the last run: a file whose size and mtime still match is not read again.
    The build lists the files the light stage brought in ``cache/fresh-paths.txt``: those are always hashed
    and never cached (light is built reproducibly: a changed file can keep its size and mtime, e.g. a
    wheel's RECORD or an unchecked-hash .pyc). A code-only rebuild then hashes ktdeploy's files instead of
    the ~10 GB stack (~70 s on fuse-overlayfs). The lines, and so the digest, are the same with or without."""
    import hashlib
    import os
    import stat

    known: dict[str, tuple[int, int, str]] = {}
    table = cache / "manifest-cache.tsv" if cache is not None else None
    fresh: set[str] = set()
    if table is not None and table.is_file():
        for row in table.read_text().splitlines():
            size, mtime, digest, path = row.split(" ", 3)
            known[path] = (int(size), int(mtime), digest)
    if cache is not None and (cache / "fresh-paths.txt").is_file():
        fresh = set((cache / "fresh-paths.txt").read_text().splitlines())
    seen: list[str] = []
    lines = []
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    lines.append(f"link {oct(st.st_mode & 0o7777)} {p} -> {os.readlink(p)}")
                elif stat.S_ISREG(st.st_mode):
                    hit = None if str(p) in fresh else known.get(str(p))
                    if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
                        digest = hit[2]
                    else:
                        h = hashlib.sha256()
                        with open(p, "rb") as f:
                            for chunk in iter(lambda: f.read(1 << 20), b""):
                                h.update(chunk)
                        digest = h.hexdigest()
                    if str(p) not in fresh and "\n" not in str(p):   # one row per line in the table
                        seen.append(f"{st.st_size} {st.st_mtime_ns} {digest} {p}")
                    lines.append(f"{digest} {oct(st.st_mode & 0o7777)} {p}")
    if table is not None:
        try:   # a cache that cannot be written only costs the next build its speed
            tmp = table.with_name(table.name + ".tmp")
            tmp.write_text("".join(row + "\n" for row in seen))
            tmp.replace(table)
        except OSError as err:
            print(f"verify_stack: manifest cache not written ({err})", file=sys.stderr)
    return sorted(lines)


def manifest_digest(lines: list[str]) -> str:
    import hashlib

    return hashlib.sha256("".join(ln + "\n" for ln in lines).encode()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", choices=["full", "reduced"], required=True)
    parser.add_argument("--stage", choices=["deps", "agent"], required=True)
    parser.add_argument("--stack-file", type=Path, required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--manifest", action="store_true",
                        help="first print the content manifest's digest (before anything runs)")
    parser.add_argument("--manifest-list", action="store_true", help="print every manifest line too")
    parser.add_argument("--manifest-cache", type=Path, default=None,
                        help="folder of the hash cache kept per dependency image (see manifest_lines)")
    args = parser.parse_args()

    if args.manifest or args.manifest_list:
        lines = manifest_lines(cache=args.manifest_cache)
        if args.manifest_list:
            for ln in lines:
                print("manifest: " + ln)
        print(f"verify_stack: manifest sha256={manifest_digest(lines)} files={len(lines)}", flush=True)

    cfg = tomllib.loads(args.stack_file.read_text())[args.stack]
    have = installed()
    # In the deps stage ktdeploy is not installed yet, so its requirements are not checked by pip:
    # `pip check` only covers what is installed, which is exactly the lock.
    errors, notes = check_pip(cfg.get("pip_check_waivers", {}))
    errors += check_lock(lock_pins(args.lock), have, extra_allowed={"ktdeploy"} if args.stage == "agent" else set())
    exp_errors, table = check_expectations(cfg.get("expect", {}), cfg.get("excluded", {}), have)
    errors += exp_errors
    if args.stage == "agent":
        errors += check_agent()

    print(f"verify_stack: stack={args.stack} stage={args.stage} python={sys.version.split()[0]} "
          f"distributions={len(have)}")
    for line in table + notes:
        print("  " + line)
    if errors:
        print(f"verify_stack: FAILED ({len(errors)} problem(s)):", file=sys.stderr)
        for err in errors:
            print("  - " + err, file=sys.stderr)
        return 1
    print("verify_stack: OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
