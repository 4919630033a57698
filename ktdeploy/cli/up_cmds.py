"""`ktdeploy up`, `status`, `logs`, `down`: parse, call ktdeploy.controller.api, render."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, print_json
from ktdeploy.core.markup import esc

HOST_HELP = "Target host: localhost (no SSH), host, user@host, ssh://user@host:port, docker://CONTAINER."


def _ssh(key, known_hosts, accept_new) -> dict:
    out: dict[str, str | bool] = {}
    if key:
        out["key"] = str(key)
    if known_hosts:
        out["known_hosts"] = str(known_hosts)
    if accept_new:
        out["accept_new_host_key"] = True
    return out


def _sigterm_raises() -> None:
    """SIGTERM (kill, systemd, a CI timeout) becomes core.errors.Terminated where `up` is: the run record says
    "stopped" or "detached" instead of staying "planned"; exit 143. Training on the host is never stopped by it."""
    import signal

    from ktdeploy.core.errors import Terminated

    def _raise(signum, frame):
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (an embedding caller): keep the default
        pass


@app.command()
def up(
    recipe: Optional[Path] = typer.Argument(None, help="Recipe YAML (default: the shipped tiny recipe)."),
    host: str = typer.Option("localhost", "--host", "-H", help=HOST_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (stages, exact docker commands, rendered "
                                                          "files) and change nothing."),
    resume: Optional[str] = typer.Option(None, "--resume", help="'auto' (newest complete checkpoint-*) or a checkpoint path."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start training and return; do not follow/convert/serve."),
    tune: bool = typer.Option(False, "--tune", help="Run `ktdeploy tune` in the image first (short real trials of the "
                                                    "CPU-expert settings) and train with its choice."),
    tune_budget: float = typer.Option(20.0, "--tune-budget-minutes", min=1, help="Time budget of --tune's trials."),
    waive: list[str] = typer.Option([], "--waive", help="Waive a failing doctor check by name (recorded, loudly "
                                                        "printed; e.g. gpu.present on CPU-only test hosts)."),
    image_tar: Optional[Path] = typer.Option(None, "--image-tar", help="Image tarball from `ktdeploy image save`, "
                                                                         "shipped when the host lacks the image."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe value: SECTION.KEY=VALUE."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", help="SSH private key."),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", help="known_hosts file (host keys are checked)."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key", help="Record a never-seen host key "
                                                                                   "(a changed key is always refused)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Plain progress lines instead of a progress bar."),
    facts: Optional[Path] = typer.Option(None, "--facts", help="With --dry-run: plan from recorded host facts "
                                                                "(`ktdeploy doctor --json` output or a facts.json) "
                                                                "without connecting, e.g. before the host exists."),
    slurm: Optional[str] = typer.Option(None, "--slurm", help="A Slurm login node (host, user@host, ssh://…): "
                                                              "training and conversion run as batch jobs there."),
) -> None:
    """Provision HOST and run the recipe there: doctor -> runtime -> image -> volumes -> train -> follow -> convert -> serve.

    Each stage is skipped when already satisfied; a second `up` of a running or finished job changes nothing.
    Ctrl-C stops following, never training."""
    from ktdeploy.controller import api
    from ktdeploy.controller.follow import ProgressView

    if slurm is not None:
        from ktdeploy.core.errors import UsageError

        if host != "localhost" or tune or image_tar or facts:
            raise UsageError("--slurm submits to a cluster: it takes no --host, --tune, --image-tar or --facts",
                             key="--slurm", fix="ktdeploy up --slurm LOGIN_HOST RECIPE")
        api.up_slurm(slurm, recipe, dry_run=dry_run, resume=resume, detach=detach, waive=waive, overrides=set_,
                     ssh=_ssh(ssh_key, known_hosts, accept_new_host_key),
                     say=lambda msg: console.print(msg, highlight=False),
                     print_plan=lambda text: console.print(text, highlight=False, markup=False, soft_wrap=True))
        return
    _sigterm_raises()   # (the slurm path above keeps the default: its record is the cluster's queue)
    factory = None
    if not no_progress and console.is_terminal:
        factory = lambda name: ProgressView(name, console=console)  # noqa: E731
    from ktdeploy.core.errors import EXIT_TERMINATED, Terminated

    try:
        api.up(host, recipe, dry_run=dry_run, resume=resume, detach=detach, waive=waive, tune=tune,
               tune_budget_minutes=tune_budget, facts_file=str(facts) if facts else None,
               image_tar=str(image_tar) if image_tar else None, overrides=set_,
               ssh=_ssh(ssh_key, known_hosts, accept_new_host_key), progress_factory=factory,
               say=lambda msg: console.print(msg, highlight=False),
               print_plan=lambda text: console.print(text, highlight=False, markup=False, soft_wrap=True))
    except Terminated:  # typer would turn it into Ctrl-C's 130; the record already says SIGTERM
        import sys

        sys.stderr.write("terminated\n")
        raise typer.Exit(EXIT_TERMINATED) from None


@app.command()
def status(
    host: Optional[str] = typer.Option(None, "--host", "-H", help="Only runs on this host (as given to up)."),
    run: Optional[str] = typer.Option(None, "--run", help="A run id (or unique prefix)."),
    all_: bool = typer.Option(False, "--all", help="List every recorded run."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key"),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts"),
) -> None:
    """The latest run's recorded state, plus the container's live state and training progress."""
    from ktdeploy.controller import api
    from ktdeploy.controller.follow import LogEntry, describe
    from ktdeploy.controller.runs import find_runs

    if all_:
        rows = [r.status() for r in find_runs(host)]
        if as_json:
            print_json(rows)
            return
        from rich.table import Column, Table

        # run ids (what --run takes) and container names are printed whole, never folded or cut: a table when
        # every cell fits the terminal, else one block per run with the id on its own line
        keys = ("id", "host", "recipe", "state", "container")
        widths = [max([len(str(s.get(k, ""))) for s in rows] + [len(k)]) for k in keys]
        if sum(widths) + 3 * len(keys) + 1 > console.width:
            for s in rows:
                console.print(s.get("id", ""), style="bold", markup=False, highlight=False, crop=False, overflow="ignore")
                for k in keys[1:]:
                    console.print(f"  {k:<9} {esc(s.get(k, ''))}", highlight=False, crop=False, overflow="ignore")
            return
        t = Table(*[Column("run" if k == "id" else k, no_wrap=True, overflow="ignore", min_width=w)
                    for k, w in zip(keys, widths, strict=False)])
        for s in rows:
            t.add_row(*[esc(s.get(k, "")) for k in keys])
        console.print(t)
        return
    st = api.status(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    if as_json:
        print_json(st)
        return
    live: dict = st.get("live") or {}
    console.print(f"[bold]{esc(st['id'])}[/]  host {esc(st['host'])}  recipe {esc(st['recipe'])}  recorded state [bold]{esc(st['state'])}[/]",
                  highlight=False)
    console.print(f"  container {esc(st['container'])}: ", end="", highlight=False)
    c = live.get("container")
    if live.get("error"):
        console.print(f"[red]host unreachable[/] ({esc(live['error'])})", highlight=False)
    elif c is None:
        console.print("absent", highlight=False)
    else:
        code = "" if c["status"] == "running" else f" exit {c['exit_code']}" + (" OOM-killed" if c["oom_killed"] else "")
        console.print(f"{esc(c['status'])}{esc(code)}", highlight=False)
    p = live.get("progress")
    if p:
        console.print("  " + describe(LogEntry(**p)), markup=False, highlight=False)
    serve = live.get("serve")
    if serve:
        console.print(f"  serving {esc(st['serve_container'])}: {esc(serve['status'])}", highlight=False)
    console.print(f"  record {esc(st['record'])}", highlight=False)


@app.command()
def logs(
    host: Optional[str] = typer.Option(None, "--host", "-H"),
    run: Optional[str] = typer.Option(None, "--run"),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the container exits (Ctrl-C stops)."),
    tail: int = typer.Option(100, "--tail", help="Lines from the end to start with."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key"),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts"),
) -> None:
    """The training container's log (docker logs) of the latest run."""
    from ktdeploy.controller import api

    api.logs(host, run, follow=follow, tail=tail, ssh=_ssh(ssh_key, known_hosts, False),
             write=lambda line: console.print(_log_text(line), highlight=False, markup=False, soft_wrap=True))


_SGR = re.compile(r"\x1b\[[0-9;]*m")   # a colour code: dropped (it only colours; any other escape is shown)


def _log_text(line: str) -> str:
    """A container's log line for the terminal: its colour codes dropped and a progress bar's carriage returns made
    line breaks; every other control character is shown as an escape by the console (SafeConsole)."""
    return _SGR.sub("", line).replace("\r\n", "\n").replace("\r", "\n")


@app.command()
def down(
    host: Optional[str] = typer.Option(None, "--host", "-H"),
    run: Optional[str] = typer.Option(None, "--run"),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key"),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts"),
) -> None:
    """Stop and remove the latest run's containers (training, serving). Output and checkpoints stay."""
    from ktdeploy.controller import api

    done = api.down(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    for name, what in done.items():
        console.print(f"{esc(name)}: {esc(what)}", highlight=False)
