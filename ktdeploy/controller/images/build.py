"""Build, save and load the ktsft images.

build(): checks the base image and the wheelhouse, serves the wheelhouse on loopback, then runs the
classic builder once per ISA target. The first target builds base -> deps -> agent; later targets
reuse those layers from the cache and only add their ENV/LABEL stage, so the variants share every
filesystem layer (build() verifies that and reports it).
"""

from __future__ import annotations

import os

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ktdeploy
from ktdeploy.core.errors import ImageError, UsageError
from ktdeploy.controller.images import docker_cli
from ktdeploy.controller.images.lockfile import Lock, read_lock
from ktdeploy.controller.images.variants import DEFAULT_REPO, LABELLED_DISTRIBUTIONS, STACKS, image_tag
from ktdeploy.controller.images.wheelhouse import DEFAULT_PORTS, check_wheelhouse, serve

DEFAULT_BASE_IMAGE = "ktdeploy/base:bookworm"


@dataclass
class BuildOptions:
    context: Path
    isas: list[str]
    stack: str = "full"
    repo: str | None = None
    base_image: str = DEFAULT_BASE_IMAGE
    wheelhouse: Path | None = None
    port: int | None = None   # default: DEFAULT_PORTS[stack]
    no_cache: bool = False

    @property
    def image_repo(self) -> str:
        return self.repo or DEFAULT_REPO[self.stack]

    @property
    def lock_path(self) -> Path:
        return self.context / "docker" / "requirements" / f"{self.stack}.lock"

    @property
    def wheelhouse_dir(self) -> Path:
        return self.wheelhouse or self.context / ".wheelhouse" / self.stack


@dataclass
class BuildReport:
    stack: str
    lock_sha256: str
    images: dict[str, str] = field(default_factory=dict)      # tag -> image id
    seconds: dict[str, float] = field(default_factory=dict)   # tag -> wall seconds of its `docker build`
    sizes: dict[str, int] = field(default_factory=dict)       # tag -> bytes
    shared_layers: int = 0                                    # filesystem layers common to every variant
    extra_layers: dict[str, list[str]] = field(default_factory=dict)  # tag -> layers the first tag lacks


def find_context(explicit: Path | None = None) -> Path:
    """The repo folder holding the Dockerfile: explicit, else the checkout ktdeploy runs from, else cwd."""
    candidates = [explicit] if explicit else [Path(ktdeploy.__file__).resolve().parent.parent, Path.cwd()]
    for c in candidates:
        if c and (c / "Dockerfile").is_file() and (c / "docker" / "stack.toml").is_file():
            return c
    raise UsageError("no ktdeploy build context found (a folder with Dockerfile and docker/stack.toml)",
                     key="--context", fix="Run from a ktdeploy checkout or pass --context PATH.")


def build_argv(opts: BuildOptions, isa: str, lock: Lock, wheelhouse_url: str, *, no_cache: bool | None = None) -> list[str]:
    """The exact `docker build` arguments for one variant (pure; tests read it)."""
    argv = [
        # --force-rm: a failed step (a verification that refuses the stack) leaves no container behind.
        "build", "--network", "host", "--force-rm",
        "--file", str(opts.context / "Dockerfile"),
        "--target", isa,
        "--tag", image_tag(opts.image_repo, isa),
        "--build-arg", f"BASE_IMAGE={opts.base_image}",
        "--build-arg", f"STACK={opts.stack}",
        "--build-arg", f"WHEELHOUSE_URL={wheelhouse_url}",
        "--build-arg", f"LOCK_SHA256={lock.sha256}",
        "--build-arg", f"STACK_VERSIONS={lock.versions_label(LABELLED_DISTRIBUTIONS)}",
        "--build-arg", f"KTDEPLOY_VERSION={ktdeploy.__version__}",
    ]
    if opts.no_cache if no_cache is None else no_cache:
        argv.append("--no-cache")
    argv.append(str(opts.context))
    return argv


def preflight(opts: BuildOptions) -> Lock:
    if opts.stack not in STACKS:
        raise UsageError(f"unknown stack {opts.stack!r}", key="--stack", fix="Use full or reduced.")
    docker_cli.require_engine()
    if docker_cli.inspect_image(opts.base_image) is None:
        raise ImageError(f"base image {opts.base_image} is not present (this engine cannot pull)",
                         key="--base-image",
                         fix="Create it offline: docker/base/build-base.sh (debootstrap -> docker import), "
                             "or `ktdeploy image load` a saved one, or pass --base-image with your own "
                             "Python 3.11 image.")
    lock = read_lock(opts.lock_path)
    check_wheelhouse(lock, opts.wheelhouse_dir, opts.stack)
    return lock


# What the Dockerfile COPYs (keep in step with .dockerignore, which guards plain `docker build .`).
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "recipes", "ktdeploy",
                 "docker/stack.toml", "docker/verify_stack.py", "docker/requirements")


def snapshot_context(src: Path, dest: Path) -> Path:
    """Copy the files the image needs into ``dest``: every variant of one build then sees the same
    sources (a tree edited mid-build would otherwise give each variant its own agent layer)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in CONTEXT_FILES:
        s, d = src / rel, dest / rel
        if s.is_dir():
            shutil.copytree(s, d, symlinks=True, ignore=ignore)
        elif s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
    return dest


def build(opts: BuildOptions, on_line=None) -> BuildReport:
    lock = preflight(opts)
    report = BuildReport(stack=opts.stack, lock_sha256=lock.sha256)
    port = opts.port or DEFAULT_PORTS[opts.stack]
    with tempfile.TemporaryDirectory(prefix="ktsft-context-") as tmp, serve(opts.wheelhouse_dir, port) as url:
        snap = BuildOptions(**{**opts.__dict__, "context": snapshot_context(opts.context, Path(tmp))})
        for i, isa in enumerate(opts.isas):
            tag = image_tag(opts.image_repo, isa)
            t0 = time.monotonic()
            # --no-cache applies to the first variant only: the others must reuse its layers.
            argv = build_argv(snap, isa, lock, url, no_cache=opts.no_cache and i == 0)
            proc = docker_cli.run(argv, env=docker_cli.CLASSIC_BUILD_ENV,
                                  on_line=on_line or (lambda _line: None))
            report.seconds[tag] = round(time.monotonic() - t0, 1)
            if proc.returncode != 0:
                tail = "\n".join(proc.stdout.splitlines()[-25:])
                raise ImageError(f"docker build of {tag} failed (exit {proc.returncode}); last lines:\n{tail}",
                                 fix="Read the step that failed above. `verify_stack: FAILED` lists what is "
                                     "wrong with the installed stack; fix docker/stack.toml and rerun "
                                     "`python docker/lock.py`.")
            info = docker_cli.inspect_image(tag) or {}
            report.images[tag] = info.get("Id", "")
            report.sizes[tag] = int(info.get("Size", 0))
    _compare_layers(report)
    return report


def _compare_layers(report: BuildReport) -> None:
    tags = list(report.images)
    if not tags:
        return
    layer_sets = {t: docker_cli.layers(t) for t in tags}
    first = layer_sets[tags[0]]
    common = set(first).intersection(*map(set, layer_sets.values()))
    report.shared_layers = len(common)
    report.extra_layers = {t: [ly for ly in ls if ly not in first] for t, ls in layer_sets.items() if t != tags[0]}


def save(tags: list[str], output: Path) -> int:
    """`docker save` the tags into one tarball (shared layers stored once). Returns its size."""
    if os.path.lexists(output):  # a dangling symlink too: docker save would write through it
        raise UsageError(f"{output} already exists", key="--output", fix="Choose a new file name or remove it.")
    for t in tags:
        if docker_cli.inspect_image(t) is None:
            raise ImageError(f"image {t} does not exist", fix=f"Build it first: ktdeploy image build --isa {t.split(':')[-1]}")
    output.parent.mkdir(parents=True, exist_ok=True)
    proc = docker_cli.run(["save", "--output", str(output), *tags])
    if proc.returncode != 0:
        output.unlink(missing_ok=True)
        raise ImageError(f"docker save failed: {proc.stderr.strip()[-400:]}", fix="Check free disk space.")
    return output.stat().st_size


def load(archive: Path) -> list[str]:
    """`docker load` a tarball made by save(); returns the image references it loaded."""
    if not archive.is_file():
        raise UsageError(f"{archive} does not exist", key="ARCHIVE", fix="Pass the file `ktdeploy image save` wrote.")
    proc = docker_cli.run(["load", "--input", str(archive)])
    if proc.returncode != 0:
        raise ImageError(f"docker load failed: {proc.stderr.strip()[-400:]}",
                         fix="Is the file complete? Compare its size or sha256 with the source host's.")
    return [ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines() if ln.startswith("Loaded image")]
