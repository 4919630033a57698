#!/usr/bin/env python3
"""Download the wheels a lock names into a wheelhouse, verified against the lock's hashes.

    python docker/wheelhouse.py --stack full|reduced [--dest DIR]

The default DIR is .wheelhouse/<stack> (git-ignored). This is the air-gapped path too: run it
where PyPI is reachable, carry DIR (and the base image tarball) to the build host, and build with
`ktdeploy image build --wheelhouse DIR`; the image build itself never touches the network.
Wheels already present with the right hash are not downloaded again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lock import LOCK_DIR, ROOT, STACK_FILE, platform_args  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", choices=["full", "reduced"], required=True)
    parser.add_argument("--dest", type=Path, default=None)
    args = parser.parse_args()
    dest = args.dest or ROOT / ".wheelhouse" / args.stack
    dest.mkdir(parents=True, exist_ok=True)
    target = tomllib.loads(STACK_FILE.read_text())["target"]
    lock = LOCK_DIR / f"{args.stack}.lock"
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
        "--no-deps", "--require-hashes", "--dest", str(dest), *platform_args(target), "-r", str(lock),
    ]
    try:   # ktdeploy's progress (a bar on a terminal, a line per wheel elsewhere) where it is installed
        sys.path.insert(0, str(ROOT))
        from ktdeploy.cli.output import err_console
        from ktdeploy.cli.progress import Ticker
        from ktdeploy.controller.images.lockfile import read_lock
        from ktdeploy.controller.images.wheelhouse import pip_download
    except ImportError:
        return subprocess.call(cmd)
    with Ticker(f"wheels of {lock.name}", err_console, total=len(read_lock(lock).pins)) as ticker:
        rc, output = pip_download(cmd, ticker.total or 0, ticker.tick)
    if rc != 0:
        sys.stderr.write(output[-4000:])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
