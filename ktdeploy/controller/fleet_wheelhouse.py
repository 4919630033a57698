"""The fleet's host wheelhouse (controller side, run once per play by ansible's preflight role).

    python -m ktdeploy.controller.fleet_wheelhouse LOCK WHEELS TARBALL [--python-version 3.11 --platform TAG]

1. puts the dependency wheels pinned in LOCK (docker/requirements/reduced.lock) into WHEELS, hash-checked
   (`pip download --require-hashes`, offline from WHEELS first, the index only for what is missing), and the
   pip wheel that bootstraps the host venv, pinned to this controller's pip version;
2. writes WHEELS/requirements.txt (every lock pin + the ktdeploy wheel's own sha256) and WHEELS/ktdeploy.txt;
3. packs exactly those files into TARBALL reproducibly (sorted, fixed mtime/owner) and writes TARBALL.sha256.

The host then installs with `pip install --no-index --find-links wheels --require-hashes --no-deps
-r wheels/requirements.txt`: nothing it installs is unpinned or unhashed. Exit 1 with the reason otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

from ktdeploy.controller.images.lockfile import Lock, read_lock
from ktdeploy.controller.images.wheelhouse import missing_wheels, pip_download
from ktdeploy.core.errors import ImageError
from ktdeploy.core.hashing import sha256_file
from ktdeploy.core.safeio import write_file, write_path

EPOCH = 315532800  # 1980-01-01, like SOURCE_DATE_EPOCH of the ktdeploy wheel


def ktdeploy_pin(wheel: Path) -> str:
    version = wheel.name.split("-")[1]
    return f"ktdeploy=={version} \\\n    --hash=sha256:{sha256_file(wheel)}  # {wheel.name}\n"


def requirements(lock: Lock, wheel: Path) -> str:
    body = "".join(f"{p.name}=={p.version} \\\n    --hash=sha256:{p.sha256}  # {p.filename}\n" for p in lock.pins)
    return f"# {lock.path.name} sha256 {lock.sha256} + the ktdeploy wheel\n" + body + ktdeploy_pin(wheel)


def newest(wheels: Path, pattern: str) -> Path:
    found = sorted(wheels.glob(pattern), key=lambda p: (p.stat().st_mtime, p.name))
    if not found:
        raise ImageError(f"no {pattern} in {wheels}", fix="Build it: pip wheel --no-deps -w WHEELS .")
    return found[-1]


def _download(wheels: Path, args: list[str], target: list[str], total: int = 1) -> None:
    base = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
            "--dest", str(wheels), "--find-links", str(wheels), *target, *args]
    if subprocess.run([*base, "--quiet", "--no-index"], capture_output=True).returncode == 0:
        return

    def tick(done: int, of: int, wheel: str) -> None:   # a line per wheel on stderr (ansible keeps it)
        print(f"wheel {done}/{of}: {wheel}", file=sys.stderr, flush=True)

    rc, output = pip_download([*base, "--progress-bar", "off"], total, tick)
    if rc != 0:
        raise ImageError(f"pip download {' '.join(args)} failed: {output.strip()[-600:]}",
                         fix="Make the package index reachable from the controller once, or fill the wheelhouse "
                             "folder with the lock's wheels (python docker/wheelhouse.py --stack reduced --dest DIR).")


def pip_version() -> str:
    return version("pip")


def pack(files: list[Path], root: Path, tarball: Path) -> str:
    """Reproducible tar of ``files`` (paths relative to root); returns its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for f in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
            info = tarfile.TarInfo(f.relative_to(root).as_posix())
            data = f.read_bytes()
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), EPOCH, 0o644, 0, 0
            t.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    if not (tarball.is_file() and sha256_file(tarball) == digest):  # unchanged: leave the file (and mtime) alone
        write_path(tarball, data, overwrite=True)  # atomic, never through a link
    write_path(tarball.with_name(tarball.name + ".sha256"), digest + "\n", overwrite=True)
    return digest


def build(lock_path: Path, wheels: Path, tarball: Path, target: list[str]) -> str:
    lock = read_lock(lock_path)
    wheels.mkdir(parents=True, exist_ok=True)
    if missing_wheels(lock, wheels, verify_hashes=True):
        _download(wheels, ["--require-hashes", "-r", str(lock_path)], target, total=len(lock.pins))
    bad = missing_wheels(lock, wheels, verify_hashes=True)
    if bad:
        raise ImageError(f"{wheels} lacks {len(bad)} wheel(s) of {lock_path.name}: {', '.join(bad[:5])}",
                         fix=f"pip download --no-deps --require-hashes -r {lock_path} --dest {wheels}")
    pip_pin = f"pip=={pip_version()}"
    if not list(wheels.glob(f"pip-{pip_version()}-*.whl")):
        _download(wheels, [pip_pin], [])
    pip_wheel = newest(wheels, f"pip-{pip_version()}-*.whl")
    write_file(wheels, "pip.name", pip_wheel.name, overwrite=True)   # the host runs pip from this wheel (ansible reads the name)
    wheel = newest(wheels, "ktdeploy-*.whl")
    write_file(wheels, "requirements.txt", requirements(lock, wheel), overwrite=True)
    write_file(wheels, "ktdeploy.txt", ktdeploy_pin(wheel), overwrite=True)
    files = [wheels / p.filename for p in lock.pins] + [wheel, pip_wheel,
                                                         wheels / "requirements.txt", wheels / "ktdeploy.txt"]
    return pack(files, wheels.parent, tarball)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ktdeploy.controller.fleet_wheelhouse", description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=Path)
    ap.add_argument("wheels", type=Path)
    ap.add_argument("tarball", type=Path)
    ap.add_argument("--python-version", default="", help="The hosts' Python when it differs from this one.")
    ap.add_argument("--platform", default="manylinux_2_34_x86_64")
    a = ap.parse_args(argv)
    target = (["--only-binary=:all:", "--implementation", "cp", "--python-version", a.python_version,
               "--platform", a.platform] if a.python_version else [])
    try:
        print(build(a.lock, a.wheels, a.tarball, target))
    except ImageError as e:
        print(f"error: {e}" + (f"\nfix: {e.fix}" if getattr(e, "fix", None) else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
