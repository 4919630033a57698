"""Build, save and load the ktsft images.

build(): checks the base image and the wheelhouse, serves the wheelhouse on loopback, then
1. `docker build --target deps` (base -> deps-cuda -> deps: the dependency layers; no ktdeploy file
   or version reaches them, so a code change or a version bump hits the cache);
2. `docker build --target light` (ktdeploy + probes + verifier staged under /stage, built on the base);
3. writes light's /stage as one layer tar and `docker load`s deps + that layer as an untagged image
   (layer_load: the archive names deps' layers without carrying them, so the engine only untars the new one);
4. runs the stack verification and the content manifest in a container of that image
   (docker/verify_stack.py): a failure leaves no tag;
5. `docker load`s every ISA variant at once: the same layers, the variant's ENV/LABEL/USER/ENTRYPOINT
   (image_config), then drops the untagged image.
No commit of the big tree: on this engine (fuse-overlayfs diffs the whole tree at each commit) a code-only
rebuild costs light's build, the verification and two small loads. An engine that refuses such an archive gets
the older way (``method="commit"``): a container of deps with the layer copied in, verified, committed per ISA.
The variants' filesystem layers are identical either way (build() verifies that and reports it).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ktdeploy
from ktdeploy.controller.images import docker_cli
from ktdeploy.controller.images.identity import write_sidecar
from ktdeploy.controller.images.image_config import commit_changes, history_entries, image_config, variant_settings
from ktdeploy.controller.images.layer_load import (
    LayerFile,
    LayerLoadUnsupported,
    history_rows,
    load_archive,
    write_archive,
    write_layer,
)
from ktdeploy.controller.images.lockfile import Lock, read_lock
from ktdeploy.controller.images.tags import DEFAULT_REPO, LABELLED_DISTRIBUTIONS, STACKS, image_tag, image_tags
from ktdeploy.controller.images.wheelhouse import DEFAULT_PORTS, check_wheelhouse, serve
from ktdeploy.core import variants as V
from ktdeploy.core.build_clock import stage_line
from ktdeploy.core.errors import ImageError, UsageError
from ktdeploy.core.safeio import write_file, writing

DEFAULT_BASE_IMAGE = "ktdeploy/base:bookworm"
STAGES = ("deps", "light", "layer", "verify", "images")   # what `image build` says as [stage i/N] (core/build_clock)


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
    method: str = "auto"      # auto: load the light layer (commit when the engine refuses); layer; commit
    version: str = ktdeploy.__version__   # recorded as a label only; never a build argument

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
    seconds: dict[str, float] = field(default_factory=dict)   # tag -> wall seconds of the build that made it
    sizes: dict[str, int] = field(default_factory=dict)       # tag -> bytes
    shared_layers: int = 0                                    # filesystem layers common to every variant
    extra_layers: dict[str, list[str]] = field(default_factory=dict)  # tag -> layers the first tag lacks
    stage_ids: dict[str, str] = field(default_factory=dict)   # deps/light -> image id
    manifest_sha256: str = ""
    labels: dict[str, str] = field(default_factory=dict)      # identity labels (without the ISA's)
    method: str = ""                                          # how light's layer was added: layer or commit
    verified_image: str = ""                                  # layer: the untagged image verified (then removed)
    phases: dict[str, float] = field(default_factory=dict)    # wall seconds per phase (stages, layer, verify, images)


def find_context(explicit: Path | None = None) -> Path:
    """The repo folder holding the Dockerfile: explicit, else the checkout ktdeploy runs from, else cwd."""
    candidates = [explicit] if explicit else [Path(ktdeploy.__file__).resolve().parent.parent, Path.cwd()]
    for c in candidates:
        if c and (c / "Dockerfile").is_file() and (c / "docker" / "stack.toml").is_file():
            return c
    raise UsageError("no ktdeploy build context found (a folder with Dockerfile and docker/stack.toml)",
                     key="--context", fix="Run from a ktdeploy checkout or pass --context PATH.")


def stage_argv(opts: BuildOptions, target: str, lock: Lock, wheelhouse_url: str, iidfile: Path, *,
               no_cache: bool = False) -> list[str]:
    """The exact `docker build` arguments for one stage (deps or light) (pure; tests read it).
    Nothing here changes with ktdeploy's version or sources except light's COPY of the sources."""
    argv = [
        # --force-rm: a failed step leaves no container behind.
        "build", "--network", "host", "--force-rm",
        "--file", str(opts.context / "Dockerfile"),
        "--target", target,
        "--iidfile", str(iidfile),
        "--build-arg", f"BASE_IMAGE={opts.base_image}",
        "--build-arg", f"STACK={opts.stack}",
        "--build-arg", f"WHEELHOUSE_URL={wheelhouse_url}",
        "--build-arg", f"LOCK_SHA256={lock.sha256}",
    ]
    if no_cache:
        argv.append("--no-cache")
    argv.append(str(opts.context))
    return argv


def identity_labels(opts: BuildOptions, lock: Lock, base_id: str, manifest: str, *, revision: str,
                    source: str, created: str) -> dict[str, str]:
    """The labels a fleet rolls out by (pure)."""
    return {
        "org.opencontainers.image.title": V.IMAGE_REPO,
        "org.opencontainers.image.description":
            "KTransformers + LlamaFactory fine-tuning image; entrypoint: the ktdeploy agent",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": opts.version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.base.name": opts.base_image,
        "org.opencontainers.image.base.digest": base_id,
        "io.ktdeploy.stack": opts.stack,
        "io.ktdeploy.lock.sha256": lock.sha256,
        "io.ktdeploy.stack.versions": lock.versions_label(LABELLED_DISTRIBUTIONS),
        "io.ktdeploy.content.manifest.sha256": manifest,
    }


def _git(context: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(context), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def source_identity(context: Path) -> tuple[str, str]:
    """(revision, source) of the checkout: the commit (+ "-dirty" when the tree has changes) and
    the origin remote, or "unknown"/"local" outside git."""
    rev = _git(context, "rev-parse", "HEAD")
    if rev and _git(context, "status", "--porcelain", "--untracked-files=no"):
        rev += "-dirty"
    return rev or "unknown", _git(context, "remote", "get-url", "origin") or "local"


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
                 "docker/stack.toml", "docker/verify_stack.py", "docker/lockpart.py", "docker/requirements")


def snapshot_context(src: Path, dest: Path) -> Path:
    """Copy the files the image needs into ``dest``: every variant of one build then sees the same
    sources (a tree edited mid-build would otherwise give each variant its own agent layer)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in CONTEXT_FILES:
        s, d = src / rel, dest / rel
        if s.is_dir():  # dest is a temp folder this build just created: nothing in it to follow
            shutil.copytree(s, d, symlinks=True, ignore=ignore)
        elif s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
    return dest


def _fail(what: str, proc: subprocess.CompletedProcess[Any]) -> ImageError:
    out = "\n".join((proc.stdout + "\n" + (proc.stderr or "")).strip().splitlines()[-25:])
    return ImageError(f"{what} failed (exit {proc.returncode}); last lines:\n{out}",
                      fix="Read the step that failed above. `verify_stack: FAILED` lists what is "
                          "wrong with the installed stack; fix docker/stack.toml and rerun "
                          "`python docker/lock.py`.")


def _copy_layer(layer: LayerFile, container: str) -> None:
    """Copy the layer tar's files to / of a container (the commit way)."""
    with open(layer.path, "rb") as f:
        proc = subprocess.run([docker_cli.docker_bin(), "cp", "-", f"{container}:/"], stdin=f, capture_output=True,
                              text=True)
    if proc.returncode != 0:
        raise ImageError(f"copying the light stage into the image failed: {proc.stderr.strip()[-400:]}",
                         fix="Check free disk space and `docker info`.")


def manifest_cache_dir(deps_id: str) -> Path | None:
    """The content manifest's hash cache for one dependency image (its ID names the folder: an image ID is
    its content, so the cached hashes of its files stay true); caches of other dependency images are
    dropped. None when the cache folder cannot be made (the build then hashes everything, as before)."""
    digest = deps_id.split(":")[-1]
    if not re.fullmatch(r"[0-9a-f]{12,64}", digest):
        return None
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ktdeploy" / "image-manifest"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for old in root.iterdir():
            if old.name != digest and old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
        (root / digest).mkdir(exist_ok=True)
    except OSError:
        return None
    return root / digest


def _verify_argv(opts: BuildOptions, cache: Path | None) -> tuple[list[str], list[str]]:
    """(docker create options, python argv) of the stack verification (python -B: it writes no .pyc into the
    tree it checks); the manifest's hash cache is bind-mounted on the image's empty /mnt (nothing of it enters
    an image)."""
    verify = ["-B", "/opt/ktdeploy/verify/verify_stack.py", "--stack", opts.stack, "--stage", "agent",
              "--stack-file", "/opt/ktdeploy/verify/stack.toml", "--lock", "/opt/ktdeploy/requirements.lock",
              "--manifest"]
    if cache is None:
        return [], verify
    return ["-v", f"{cache}:/mnt"], [*verify, "--manifest-cache", "/mnt"]


def _run_verification(ctr: str, line: Callable[[str], None]) -> str:
    """Start the verification container; returns the content manifest's sha256."""
    proc = docker_cli.run(["start", "--attach", ctr])
    line(proc.stdout.rstrip())
    if proc.returncode != 0:
        raise _fail("the stack verification (docker/verify_stack.py)", proc)
    m = re.search(r"manifest sha256=([0-9a-f]{64})", proc.stdout)
    return m.group(1) if m else ""


def _create(image: str, mounts: list[str], verify: list[str]) -> str:
    created = docker_cli.run(["create", "--network", "none", *mounts, "--entrypoint", "/opt/venv/bin/python",
                              image, *verify])
    ctr = created.stdout.strip()
    if created.returncode != 0 or not ctr:
        raise _fail(f"docker create of {image}", created)
    return ctr


def _record_image(report: BuildReport, tag: str) -> None:
    """The tagged image's ID and size into the report (both ways of adding light's layer end here)."""
    info = docker_cli.inspect_image(tag) or {}
    report.images[tag] = info.get("Id", "")
    report.sizes[tag] = int(info.get("Size", 0))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(opts: BuildOptions, on_line: Callable[[str], None] | None = None) -> BuildReport:
    if opts.method not in ("auto", "layer", "commit"):
        raise UsageError(f"unknown build method {opts.method!r}", key="--method", fix="Use auto, layer or commit.")
    lock = preflight(opts)
    report = BuildReport(stack=opts.stack, lock_sha256=lock.sha256)
    port = opts.port or DEFAULT_PORTS[opts.stack]
    line = on_line or (lambda _line: None)
    revision, source = source_identity(opts.context)
    base_id = (docker_cli.inspect_image(opts.base_image) or {}).get("Id", "")
    with tempfile.TemporaryDirectory(prefix="ktsft-context-") as tmp, serve(opts.wheelhouse_dir, port) as url:
        snap = BuildOptions(**{**opts.__dict__, "context": snapshot_context(opts.context, Path(tmp) / "ctx")})
        t0 = time.monotonic()
        for i, target in enumerate(("deps", "light"), 1):
            line(stage_line(i, len(STAGES), target, f"docker build --target {target}"))
            iid = Path(tmp) / f"{target}.iid"
            proc = docker_cli.run(stage_argv(snap, target, lock, url, iid, no_cache=opts.no_cache),
                                  env=docker_cli.CLASSIC_BUILD_ENV, on_line=line)
            if proc.returncode != 0:
                raise _fail(f"docker build --target {target}", proc)
            report.stage_ids[target] = iid.read_text().strip()
        report.phases["stages"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        line(stage_line(3, len(STAGES), "layer", "ktdeploy's own layer, written once for every build"))
        layer = write_layer(report.stage_ids["light"], Path(tmp) / "light-layer.tar")
        report.phases["layer"] = round(time.monotonic() - t1, 1)
        cache = None if opts.no_cache else manifest_cache_dir(report.stage_ids["deps"])
        if cache is not None:   # light's files are hashed every time (see verify_stack.manifest_lines)
            write_file(cache, "fresh-paths.txt", "".join(p + "\n" for p in layer.paths if "\n" not in p),
                       overwrite=True)

        def labels(manifest: str, created: str) -> dict[str, str]:
            report.manifest_sha256 = manifest
            report.labels = identity_labels(opts, lock, base_id, manifest, revision=revision, source=source,
                                            created=created)
            return report.labels

        method = opts.method
        if method in ("auto", "layer"):
            try:
                _images_by_load(opts, report, layer, cache, Path(tmp), labels, line)
                method = "layer"
            except LayerLoadUnsupported as err:
                if method == "layer":
                    raise
                line(f"{err.message} -> one docker commit per variant instead")
                method = "commit"
        if method == "commit":
            _images_by_commit(opts, report, layer, cache, labels, line)
        report.method = method
        report.seconds = dict.fromkeys(report.images, round(time.monotonic() - t0, 1))
    _compare_layers(report)
    return report


def _images_by_load(opts: BuildOptions, report: BuildReport, layer: LayerFile, cache: Path | None, tmp: Path,
                    labels: Callable[[str, str], dict[str, str]], line: Callable[[str], None]) -> None:
    deps = docker_cli.inspect_image(report.stage_ids["deps"])
    if deps is None:
        raise ImageError("the dependency image vanished during the build", fix="Run the build again.")
    history = history_entries(history_rows(report.stage_ids["deps"]), len(deps["RootFS"]["Layers"]))
    created = _now()
    t = time.monotonic()
    # 1. deps + light's layer, untagged: the image the verification runs in (the same layer the variants get)
    (provisional,) = write_archive(tmp / "verify.tar", layer, [(image_config(deps, history, layer.diff_id, created), [])])
    load_archive(tmp / "verify.tar")
    report.verified_image = provisional
    report.phases["load_verify_image"] = round(time.monotonic() - t, 1)
    try:
        t = time.monotonic()
        line(stage_line(4, len(STAGES), "verify", "verify_stack in the image: every installed file against the lock"))
        mounts, verify = _verify_argv(opts, cache)
        ctr = _create(provisional, mounts, verify)
        try:
            manifest = _run_verification(ctr, line)
        finally:
            docker_cli.run(["rm", "-f", ctr])
        report.phases["verify"] = round(time.monotonic() - t, 1)
        # 2. every variant in one archive: same layers, the variant's config
        t = time.monotonic()
        line(stage_line(5, len(STAGES), "images", f"the {len(opts.isas)} build(s) tagged, one archive loaded"))
        lab = labels(manifest, created)
        tags = [image_tags(opts.image_repo, isa) for isa in opts.isas]
        images = [(image_config(deps, history, layer.diff_id, created, variant_settings(isa, lab)), names)
                  for isa, names in zip(opts.isas, tags, strict=True)]
        write_archive(tmp / "variants.tar", layer, images)
        load_archive(tmp / "variants.tar")
        report.phases["load_variants"] = round(time.monotonic() - t, 1)
        for names in tags:
            for tag in names:
                _record_image(report, tag)
    finally:
        if provisional not in report.images.values():
            docker_cli.run(["rmi", provisional])


def _images_by_commit(opts: BuildOptions, report: BuildReport, layer: LayerFile, cache: Path | None,
                      labels: Callable[[str, str], dict[str, str]], line: Callable[[str], None]) -> None:
    mounts, verify = _verify_argv(opts, cache)
    ctr = _create(report.stage_ids["deps"], mounts, verify)
    try:
        _copy_layer(layer, ctr)
        t = time.monotonic()
        line(stage_line(4, len(STAGES), "verify", "verify_stack in the image: every installed file against the lock"))
        lab = labels(_run_verification(ctr, line), _now())
        report.phases["verify"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        line(stage_line(5, len(STAGES), "images", f"the {len(opts.isas)} build(s) committed and tagged"))
        for isa in opts.isas:
            tag = image_tag(opts.image_repo, isa)
            argv = ["commit", "--pause=false"]
            for change in commit_changes(isa, lab):
                argv += ["--change", change]
            proc = docker_cli.run([*argv, ctr, tag])
            if proc.returncode != 0:
                raise _fail(f"docker commit of {tag}", proc)
            _record_image(report, tag)
            for alias in image_tags(opts.image_repo, isa)[1:]:
                proc = docker_cli.run(["tag", tag, alias])
                if proc.returncode != 0:
                    raise _fail(f"docker tag {alias}", proc)
                _record_image(report, alias)
        report.phases["commit"] = round(time.monotonic() - t, 1)
    finally:
        docker_cli.run(["rm", "-f", ctr])


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
    """`docker save` the tags into one tarball (shared layers stored once). Returns its size. docker writes to
    our stdout and the safe writer makes the file: new, atomic, never through a link at OUT or OUT.images.json."""
    from ktdeploy.controller.images.identity import sidecar

    for p in (output, sidecar(output)):
        if os.path.lexists(p):  # a dangling symlink too
            raise UsageError(f"{p} already exists", key="--output", fix="Choose a new file name or remove it.")
    for t in tags:
        if docker_cli.inspect_image(t) is None:
            raise ImageError(f"image {t} does not exist", fix=f"Build it first: ktdeploy image build --isa {t.split(':')[-1]}")
    with writing(output.parent, output.name) as f:
        proc = subprocess.run([docker_cli.docker_bin(), "save", *tags], stdout=f, stderr=subprocess.PIPE, text=False)
        if proc.returncode != 0:  # the temp file goes with the exception; OUT never appears
            raise ImageError(f"docker save failed: {proc.stderr.decode(errors='replace').strip()[-400:]}",
                             fix="Check free disk space.")

    ids: dict[str, str] = {}
    for t in tags:
        info = docker_cli.inspect_image(t)
        if info is None:  # removed between the save and now
            raise ImageError(f"{t} is no longer in docker after the save", fix="Run `ktdeploy image save` again.")
        ids[t] = info["Id"]
    write_sidecar(output, ids)  # the fleet rolls out by these IDs
    return output.stat().st_size


def load(archive: Path, repo: str = DEFAULT_REPO["full"]) -> list[str]:
    """`docker load` a tarball made by save(); returns the image references it loaded. Only an archive whose every
    name is one of ktdeploy's images (``repo``:<variant>) is loaded; the .images.json beside it is not asked (it
    comes with the archive, from the same hands)."""
    from ktdeploy.controller.images.archive import normalise, require_only
    from ktdeploy.controller.images.tags import ISA_VARIANTS

    if not archive.is_file():
        raise UsageError(f"{archive} does not exist", key="ARCHIVE", fix="Pass the file `ktdeploy image save` wrote.")
    allowed = {image_tag(repo, v) for v in ISA_VARIANTS}
    require_only(archive, allowed, f"{repo}:<{'|'.join(ISA_VARIANTS)}>")
    proc = docker_cli.run(["load", "--input", str(archive)])
    if proc.returncode != 0:
        raise ImageError(f"docker load failed: {proc.stderr.strip()[-400:]}",
                         fix="Is the file complete? Compare its size or sha256 with the source host's.")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("Loaded image")]
    loaded = [ln.split(":", 1)[1].strip() for ln in lines]   # "Loaded image: NAME", "Loaded image ID: sha256:…"
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Loaded image:")]
    other = sorted(n for n in names if normalise(n) not in {normalise(a) for a in allowed})
    if other:   # the reading above and the engine's disagreed after all: say so loudly, never "loaded" quietly
        raise ImageError(f"docker load applied {', '.join(other[:10])}, which the archive's check did not find",
                         fix=f"Re-tag or remove {other[0]} (docker tag / docker rmi) and report the archive as a bug.")
    return loaded
