"""`ktdeploy doctor`: gather host facts (locally, over SSH or in a container) and run every check."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, print_doctor, print_json
from ktdeploy.core import variants as V
from ktdeploy.core.checks.gate import profile_hint
from ktdeploy.core.command_requests import DoctorRequest, SshOptions
from ktdeploy.core.errors import UsageError
from ktdeploy.core.terminal_text import esc

if TYPE_CHECKING:   # the CLI imports the controller lazily (a fast --help)
    from ktdeploy.controller.doctor import DoctorReport


def _summary_line(report: DoctorReport) -> str:
    f = report.facts
    cpu = f.cpu
    gpus = f"{f.gpu.count} GPU" if f.gpu.count else "no GPU"
    head = (f"{f.host} [{f.layer}]: {cpu.model_name or 'unknown CPU'}, {cpu.physical_cores} cores, "
            f"{(f.memory.total_bytes or 0) / 2**30:.0f} GiB, {gpus}, kernel {f.kernel.release}")
    best = next(((c.data or {}).get("best") for c in report.checks
                 if c.name == "cpu.variant" and c.status == "pass"), None)
    tag = (f"\nimage for this CPU: {V.image(best)} (cpu.variant; deploy.image: auto picks it)"
           if isinstance(best, str) and best else "")
    return head + "\n" + report.summary_text() + tag


@app.command("doctor")
def doctor_cmd(
    host: str = typer.Option("localhost", "--host", "-H",
                             help="Where to look: localhost, user@host, ssh://user@host:port or docker://CONTAINER."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="Also check the host against this recipe."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Override a recipe value: SECTION.KEY=VALUE (with --recipe), "
                                                     f"repeatable; e.g. --set deploy.image={V.AVX2}."),
    image: Optional[str] = typer.Option(None, "--image", help="Container readiness: run this image (e.g. ktsft:amx) "
                                                              "on the host with the training container's flags and "
                                                              "check inside it (layer checks + stack.*: Python.h, "
                                                              "torch, CUDA, one Triton kernel). A bare kt-kernel "
                                                              "build name means --variant (kept for compatibility)."),
    variant: Optional[str] = typer.Option(None, "--variant", help="Also check that this image variant (a kt-kernel "
                                                                  f"build: {', '.join(V.NAMES)}) runs here "
                                                                  "(image.variant); ansible's ktsft_isa."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="With --image: the GPUs the container gets, e.g. 0,1 "
                                                            "(default: the recipe's deploy.gpus, else every GPU)."),
    stack: bool = typer.Option(False, "--stack", help="Also run the stack probe where doctor runs (stack.*: Python.h, "
                                                       "torch, CUDA vs the GPUs, one Triton kernel; with --recipe the "
                                                       "stack's own judgement of it, stack.judge): inside an image "
                                                       "on a host without ktdeploy (ansible preflight, image mode); "
                                                       "--image runs it in the container for you."),
    container: Optional[str] = typer.Option(None, "--container",
                                            help="A running container on that host to compare with it (layer.* checks)."),
    as_json: bool = typer.Option(False, "--json", help="Print {schema_version, facts, checks, ...} as JSON."),
    waive: list[str] = typer.Option([], "--waive", metavar="CHECK",
                                    help="Accept this failing check (repeatable); shown, never silent."),
    cpu_only: bool = typer.Option(False, "--cpu-only", help="Test profile for a host without a GPU: waive exactly the "
                                                            "GPU checks."),
    every: bool = typer.Option(False, "--all", help="One line per check, passes included, in doctor's order."),
    only: list[str] = typer.Option([], "--only", metavar="GROUP",
                                   help="Judge only the checks of this group (repeatable): a name or a dotted prefix, "
                                        "e.g. --only cpu --only image.variant (a Kubernetes init container's proof "
                                        "that the node runs the image's CPU build)."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", help="Private key for SSH (default: agent / ~/.ssh)."),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key",
                                             help="Accept and record an unknown SSH host key (never a changed one)."),
) -> None:
    """Check that a host can run KT fine-tuning; exit 1 if any check fails.

    AMX/AVX512 really usable (a tile multiply is executed) through the VM and container layers, GPUs, NUMA
    threads, memory, /dev/shm, disk; with --recipe also the model, data and the planner's figures."""
    from ktdeploy.controller.doctor_host import doctor

    ssh = SshOptions(key=str(ssh_key) if ssh_key else None, known_hosts=str(known_hosts) if known_hosts else None,
                     accept_new_host_key=accept_new_host_key or None)
    from ktdeploy.cli.output import err_console
    from ktdeploy.cli.progress import waiting
    from ktdeploy.core.host_target import parse_host

    try:
        shown = parse_host(host).redacted   # never a password on the screen
    except UsageError:
        shown = "the host"                  # doctor itself says what is wrong with it
    what = f"doctor: proving {shown}'s CPU and reading its facts" + (f", then checking {image} in a container"
                                                                     if image else "")
    with waiting(err_console, what, plain=False):   # seconds (the AMX probe), 20 s and more with --image
        report = doctor(DoctorRequest(host=host, recipe=recipe, overrides=tuple(set_), image=image, variant=variant,
                                      gpus=gpus, stack=stack, container=container, waive=tuple(waive),
                                      cpu_only=cpu_only, ssh=ssh))
    if only:
        report = dataclasses.replace(report, checks=[c for c in report.checks
                                                     if any(c.name == g or c.name.startswith(g + ".") for g in only)])
    if as_json:
        print_json(report.to_json())
    else:
        console.print(_summary_line(report), markup=False, highlight=False)
        print_doctor(report, every=every)
        if every:
            for c in report.waived_failures:
                console.print(f"[bold yellow]WAIVED[/] {esc(c.name)}: {esc(c.detail)}", highlight=False)
        if report.failed:
            names = [c.name + (f" ({c.layer})" if [d.name for d in report.failed].count(c.name) > 1 else "")
                     for c in report.failed]
            console.print(f"[red]{esc(report.summary()['fail'])} check(s) failed:[/] " + ", ".join(names), highlight=False)
            hint = profile_hint(report.failed, report.facts.gpu.count)
            if hint:
                console.print(hint.strip(), markup=False, highlight=False)
    if report.failed:
        raise typer.Exit(1)
