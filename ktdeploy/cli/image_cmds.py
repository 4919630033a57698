"""`ktdeploy image build|save|load|layers`: the ktsft images, built offline, shipped without a registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ktdeploy.cli import app
from ktdeploy.cli.help import App
from ktdeploy.cli.output import console, err_console, print_json
from ktdeploy.core import variants as V
from ktdeploy.core.errors import KtdeployError, UsageError
from ktdeploy.core.terminal_text import esc

ISA_HELP = (f"A kt-kernel CPU build ({', '.join(V.NAMES)}; docs/cpu-builds.md says which CPU needs which) or all. "
            + " ".join(f"The old {a} names the {b} build." for a, b in V.ALIASES.items()))

image_app = App(help="Build, save and load the ktsft images (one per CPU ISA), offline.",
                        no_args_is_help=True)
app.add_typer(image_app, name="image")


def _tags(repo: str, isa: str) -> list[str]:
    from ktdeploy.controller.images.tags import expand_isa, image_tag

    return [image_tag(repo, v) for v in expand_isa(isa)]


@image_app.command("build")
def build_cmd(
    isa: str = typer.Option("all", "--isa", help=ISA_HELP),
    stack: str = typer.Option("full", "--stack", help="full: the KT stack; reduced: ktdeploy only (CI)."),
    repo: str = typer.Option(None, "--repo", help="Image repository (default ktsft, or ktsft-reduced)."),
    base_image: str = typer.Option("ktdeploy/base:bookworm", "--base-image",
                                   help="Python 3.11 base image (e.g. your CUDA base)."),
    wheelhouse: Path = typer.Option(None, "--wheelhouse", metavar="DIR", help="Wheel folder (default .wheelhouse/<stack>)."),
    port: int = typer.Option(None, "--wheelhouse-port",
                             help="Loopback port the wheelhouse is served on (default 38711 full, 38712 reduced)."),
    context: Path = typer.Option(None, "--context", metavar="DIR", help="Repo folder with the Dockerfile."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every layer."),
    method: str = typer.Option("auto", "--method",
                               help="How ktdeploy's layer joins the dependency image: layer (docker load of that "
                                    "one layer, no commit of the big tree), commit (docker commit per variant), "
                                    "auto (layer; commit where the engine refuses the archive)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the step lines of docker build."),
    as_json: bool = typer.Option(False, "--json", help="Print the build report as JSON."),
) -> None:
    """Build ktsft:<isa> from the Dockerfile and the hash-locked wheelhouse; fails if verification fails."""
    from dataclasses import asdict

    from ktdeploy.controller.images.build import BuildOptions, find_context
    from ktdeploy.controller.images.tags import expand_isa

    opts = BuildOptions(context=find_context(context), isas=expand_isa(isa), stack=stack, repo=repo,
                        base_image=base_image, wheelhouse=wheelhouse, port=port, no_cache=no_cache,
                        method=method)

    report = _build_with_progress(opts, quiet=quiet)
    if as_json:
        print_json(asdict(report))
        return
    for tag, image_id in report.images.items():
        console.print(f"[green]built[/green] {esc(tag)}  {esc(image_id[7:19])}  {report.sizes[tag] / 1e9:.2f} GB  "
                      f"{report.seconds[tag]:.0f}s", highlight=False)
    extra = {t: len(v) for t, v in report.extra_layers.items()}
    console.print(f"variants share {esc(report.shared_layers)} filesystem layers; extra layers per variant: "
                  f"{extra or 'n/a'}; lock sha256 {report.lock_sha256[:16]}…; added by {report.method}",
                  highlight=False)


TIMES = "image-build-times.json"   # in $KTDEPLOY_HOME: the last build's part-by-part seconds (core/build_clock.py)


def _build_with_progress(opts: Any, *, quiet: bool) -> Any:
    """The build, its lines on stderr (with --quiet: the stage and step lines only) and, on a terminal, a bar below
    them: stage i/N, docker's step n/M, the time so far and the ETA from the last build's timings (elsewhere the
    ETA ends each stage's line). A build that succeeds leaves its timings for the next one."""
    import time

    from ktdeploy.cli.progress import Ticker, hms
    from ktdeploy.controller.images.build import build
    from ktdeploy.controller.runs import home
    from ktdeploy.core.build_clock import STAGE, BuildClock
    from ktdeploy.core.safeio import load_json, write_file

    try:
        last = load_json(home() / TIMES, 1 << 20, "image build timings")
    except (KtdeployError, OSError):   # none yet, or unreadable: no ETA, never a failed build
        last = {}
    clock = BuildClock(last={k: float(v) for k, v in last.items() if isinstance(v, (int, float))}
                       if isinstance(last, dict) else {})
    with Ticker("image build", err_console, plain_ticks=False, rate_eta=False) as ticker:
        def show(line: str) -> None:
            now = time.monotonic()
            moved = clock.feed(line, now)
            left = clock.remaining(now) if moved else None
            eta = (f" (about {hms(left[0])}{'' if left[1] else ' or more'} left, by the last build)"
                   if left is not None else "")
            if STAGE.match(line):
                ticker.say(line + ("" if ticker.live else eta))
            elif not quiet or line.startswith(("Step ", "verify_stack", "Successfully")):
                ticker.say(line)
            if moved:
                ticker.tick(clock.stage_i, clock.stages, clock.where(), eta_s=left[0] if left else None)

        report = build(opts, on_line=show)
    clock.finish(time.monotonic())
    try:
        home().mkdir(parents=True, exist_ok=True)
        write_file(home(), TIMES, json.dumps(clock.timings(), indent=1) + "\n", overwrite=True)
    except (KtdeployError, OSError):   # the next build only lacks an ETA
        pass
    return report


@image_app.command("save")
def save_cmd(
    output: Path = typer.Option(..., "--output", "-o", help="Tarball to write (must not exist)."),
    isa: str = typer.Option("all", "--isa", help=ISA_HELP),
    repo: str = typer.Option(V.IMAGE_REPO, "--repo", help="Image repository."),
    fmt: str = typer.Option("docker", "--format", help="docker: a tarball for `ktdeploy image load` and rootless "
                                                       "podman; squashfs: one image for pyxis (enroot import, where "
                                                       "enroot exists); sif: one image for apptainer (apptainer build, "
                                                       "where apptainer exists). docs/scaling.md."),
) -> None:
    """Write the images to one tarball for hosts without a registry (shared layers stored once), or one image as
    a Slurm runtime reads it (--format squashfs | sif)."""
    from ktdeploy.controller.images.build import save

    if fmt not in ("docker", "squashfs", "sif"):
        raise UsageError(f"--format {fmt!r}: not a format", key="--format", fix="Use docker, squashfs or sif.")
    tags = _tags(repo, isa)
    if fmt != "docker":
        from ktdeploy.controller.images.runtime_files import save_for_runtime

        size = save_for_runtime(fmt, tags, output)
        console.print(f"saved {esc(tags[0])} -> {esc(output)} ({size / 1e9:.2f} GB, {fmt}); on a folder every node "
                      f"sees, set deploy.scheduler.image_file: {esc(output)}", highlight=False)
        return
    size = save(tags, output)
    console.print(f"saved {esc(', '.join(tags))} -> {esc(output)} ({size / 1e9:.2f} GB); on the target host: "
                  f"ktdeploy image load {esc(output.name)}; for rootless podman on a Slurm cluster put it on a folder "
                  "every node sees and set deploy.scheduler.image_file", highlight=False)


@image_app.command("load")
def load_cmd(archive: Path = typer.Argument(..., help="Tarball written by `ktdeploy image save`."),
             repo: str = typer.Option(V.IMAGE_REPO, "--repo", help="The images' repository: the archive may name only "
                                                              f"REPO:BUILD ({', '.join(V.NAMES)}).")
             ) -> None:
    """Load images from a tarball (docker load): only an archive whose every name ktdeploy asked for."""
    from ktdeploy.controller.images.build import load

    for ref in load(archive, repo):
        console.print(f"loaded {esc(ref)}", highlight=False)


@image_app.command("layers")
def layers_cmd(
    isa: str = typer.Option("all", "--isa", help=ISA_HELP),
    repo: str = typer.Option(V.IMAGE_REPO, "--repo", help="Image repository."),
    as_json: bool = typer.Option(False, "--json", help="Print the layers as JSON."),
) -> None:
    """Show which filesystem layers the variants share (they should differ in config only)."""
    from ktdeploy.controller.images import docker_cli

    data = {t: docker_cli.layers(t) for t in _tags(repo, isa)}
    if as_json:
        print_json(data)
        return
    first = next(iter(data.values()))
    for tag, ls in data.items():
        shared = sum(1 for layer in ls if layer in first)
        console.print(f"{esc(tag)}: {esc(len(ls))} layers, {esc(shared)} shared with {esc(next(iter(data)))}", highlight=False)
