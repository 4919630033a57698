"""`ktdeploy up`, `up-slurm`, `status`, `logs`, `down`: parse argv into one request, call the controller
(controller/up_host.py, up_slurm.py, run_queries.py), render."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Optional, TypeVar

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, err_console, print_json, wrap_words
from ktdeploy.core.command_requests import NativePair, SlurmUpRequest, SshOptions, UpRequest
from ktdeploy.core.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, StepError, Terminated, UsageError
from ktdeploy.core.run_record import LiveStatus, RunStatus
from ktdeploy.core.terminal_text import esc

T = TypeVar("T")
RUN_HELP = "A run id (or a unique prefix of one) or a run's --name; default: the latest run."
SSH_KEY_HELP = "SSH private key (default: the agent, ~/.ssh)."
KNOWN_HOSTS_HELP = "known_hosts file to check host keys against (default: ~/.ssh/known_hosts)."
RECIPE_PANEL, CHECKS_PANEL, DATA_PANEL, TUNE_PANEL, SSH_PANEL = "Recipe", "Checks", "Data", "Tuning", "SSH"


def _ssh(key: Optional[Path], known_hosts: Optional[Path], accept_new: bool) -> SshOptions:
    return SshOptions(key=str(key) if key else None, known_hosts=str(known_hosts) if known_hosts else None,
                      accept_new_host_key=True if accept_new else None)


def _sigterm_raises() -> None:
    """SIGTERM (kill, systemd, a CI timeout) becomes core.errors.Terminated where `up` is: the run record says
    "stopped" or "detached" instead of staying "planned"; exit 143. Training on the host is never stopped by it."""
    import signal

    def _raise(signum: int, frame: FrameType | None) -> NoReturn:
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (an embedding caller): keep the default
        pass


# the options `up` and `up-slurm` share, made once (each command gets its own instance)
def _recipe_argument() -> Any:
    return typer.Argument(None, metavar="RECIPE", show_default=False,
                          help="Recipe YAML (default: the shipped tiny recipe).")


def _resume_option() -> Any:
    return typer.Option(None, "--resume", metavar="auto|DIR", help="Newest complete checkpoint, or this one.")


def _set_option() -> Any:
    return typer.Option([], "--set", metavar="KEY=VALUE", rich_help_panel=RECIPE_PANEL,
                        help="Override a recipe value (repeatable).")


def _waive_option() -> Any:
    return typer.Option([], "--waive", metavar="CHECK", rich_help_panel=CHECKS_PANEL,
                        help="Let this failing check pass (recorded).")


def _ssh_key_option() -> Any:
    return typer.Option(None, "--ssh-key", metavar="FILE", rich_help_panel=SSH_PANEL, help="SSH private key.")


def _known_hosts_option() -> Any:
    return typer.Option(None, "--known-hosts", metavar="FILE", rich_help_panel=SSH_PANEL,
                        help="known_hosts to check host keys against.")


def _accept_new_host_key_option() -> Any:
    return typer.Option(False, "--accept-new-host-key", rich_help_panel=SSH_PANEL, help="Record an unknown host key.")


UP_HELP = ("Provision HOST and run the recipe there, stage by stage.\n\n"
           "PREFLIGHT (doctor) -> RUNTIME -> IMAGE -> VOLUMES -> TRAIN -> FOLLOW -> CONVERT -> SERVE; a stage that "
           "is already satisfied is skipped, so the same command again changes nothing. Ctrl-C stops following, "
           "never training. Exit codes: README, \"Exit codes\".")


@app.command(help=UP_HELP)
def up(
    ctx: typer.Context,
    recipe: Optional[Path] = _recipe_argument(),
    host: str = typer.Option("localhost", "--host", "-H", metavar="HOST", show_default=False,
                             help="localhost (default), host, user@host:port, ssh://…, docker://NAME."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="Name for --run of status/logs/down."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; change nothing."),
    facts: Optional[Path] = typer.Option(None, "--facts", metavar="FILE",
                                         help="--dry-run from `doctor --json` output."),
    resume: Optional[str] = _resume_option(),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start training, then return."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Progress lines, not a bar."),
    set_: list[str] = _set_option(),
    train: Optional[Path] = typer.Option(None, "--train", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                         help="LlamaFactory training YAML (not RECIPE)."),
    accelerate: Optional[Path] = typer.Option(None, "--accelerate", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                              help="Accelerate YAML, with --train."),
    deploy: Optional[Path] = typer.Option(None, "--deploy", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                          help="deploy: YAML for the pair (else derived)."),
    cpu_only: bool = typer.Option(False, "--cpu-only", rich_help_panel=CHECKS_PANEL,
                                  help="No-GPU test host: waive the GPU checks."),
    waive: list[str] = _waive_option(),
    sync_model: Optional[Path] = typer.Option(None, "--sync-model", metavar="DIR", rich_help_panel=DATA_PANEL,
                                              help="Upload DIR to train.model_name_or_path."),
    sync_data: Optional[Path] = typer.Option(None, "--sync-data", metavar="DIR", rich_help_panel=DATA_PANEL,
                                             help="Upload DIR to train.dataset_dir."),
    image_tar: Optional[Path] = typer.Option(None, "--image-tar", metavar="FILE", rich_help_panel=DATA_PANEL,
                                             help="`ktdeploy image save` tarball to ship."),
    tune: bool = typer.Option(False, "--tune", rich_help_panel=TUNE_PANEL,
                              help="Measure CPU-expert settings first."),
    tune_budget: float = typer.Option(20.0, "--tune-budget-minutes", min=1, metavar="MIN", show_default=False,
                                      rich_help_panel=TUNE_PANEL, help="Budget of --tune (default 20)."),
    ssh_key: Optional[Path] = _ssh_key_option(),
    known_hosts: Optional[Path] = _known_hosts_option(),
    accept_new_host_key: bool = _accept_new_host_key_option(),
    slurm: Optional[str] = typer.Option(None, "--slurm", metavar="LOGIN", hidden=True,
                                        help="Deprecated: `ktdeploy up-slurm LOGIN RECIPE`."),
) -> None:
    if slurm is not None:   # the former spelling of up-slurm: its options still work, the others are refused
        _up_slurm_alias(ctx, SlurmUpRequest(login=slurm, recipe=recipe, overrides=tuple(set_), dry_run=dry_run,
                                            resume=resume, detach=detach, waive=tuple(waive),
                                            ssh=_ssh(ssh_key, known_hosts, accept_new_host_key)))
        return
    request = UpRequest(host=host, recipe=recipe, overrides=tuple(set_), native=native_pair(recipe, train, accelerate,
                                                                                              deploy),
                        name=name, dry_run=dry_run, facts_file=str(facts) if facts else None, resume=resume,
                        detach=detach, waive=tuple(waive), cpu_only=cpu_only,
                        sync_model=str(sync_model) if sync_model else None,
                        sync_data=str(sync_data) if sync_data else None,
                        image_tar=str(image_tar) if image_tar else None, tune=tune, tune_budget_minutes=tune_budget,
                        ssh=_ssh(ssh_key, known_hosts, accept_new_host_key))
    from ktdeploy.cli.events_view import EventView
    from ktdeploy.controller.up_host import up as run_up

    view = EventView(console, bar=not no_progress and console.is_terminal, again=this_command())
    res = _until_sigterm(lambda: run_up(request, on_event=view))
    if res.interrupted:   # Ctrl-C: the record says "detached" and training keeps running; exit 130 as every Ctrl-C
        raise typer.Exit(EXIT_INTERRUPTED)
    if res.stops_at:   # a dry run whose plan stops: the code the real run would end with (a step fails: 4)
        raise typer.Exit(StepError.exit_code)


def this_command() -> str:
    """This process's command line as a user pastes it again (`ktdeploy` and its arguments, quoted); no secret is
    ever an argument (docs/security.md)."""
    import shlex
    import sys

    return shlex.join(["ktdeploy", *sys.argv[1:]])


def _until_sigterm(run: Callable[[], T]) -> T:
    """SIGTERM where `up` or `up-slurm` runs: the record says so (the jobs an `up-slurm` submitted are cancelled);
    exit 143 — typer would turn Terminated into Ctrl-C's 130."""
    _sigterm_raises()
    try:
        return run()
    except Terminated:
        import sys

        sys.stderr.write("terminated\n")
        raise typer.Exit(EXIT_TERMINATED) from None


# up's options that `up --slurm` (the former spelling of up-slurm) takes; any other one given is refused
_SLURM_ALIAS_TAKES = {"recipe", "slurm", "dry_run", "resume", "detach", "set_", "waive", "no_progress", "ssh_key",
                      "known_hosts", "accept_new_host_key"}


def _up_slurm_alias(ctx: typer.Context, request: SlurmUpRequest) -> None:
    given = [p.opts[0] for p in ctx.command.params if p.name not in _SLURM_ALIAS_TAKES   # typer's own click: by name
             and getattr(ctx.get_parameter_source(p.name or ""), "name", None) == "COMMANDLINE"]
    if given:
        raise UsageError(f"up --slurm submits to a cluster: it takes no {', '.join(given)}", key="--slurm",
                         fix="ktdeploy up-slurm LOGIN_HOST RECIPE (`up --slurm` is its former spelling)")
    err_console.print("note: `ktdeploy up --slurm LOGIN` is now `ktdeploy up-slurm LOGIN RECIPE`", markup=False,
                      highlight=False)
    _run_up_slurm(request)


def _run_up_slurm(request: SlurmUpRequest) -> None:
    from ktdeploy.cli.events_view import EventView
    from ktdeploy.controller.up_slurm import up_slurm as run_up_slurm

    res = _until_sigterm(lambda: run_up_slurm(request, on_event=EventView(console, again=this_command())))
    if res.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


UP_SLURM_HELP = ("Submit the recipe to the Slurm cluster behind LOGIN: the same record and stages as `up`, TRAIN "
                 "and CONVERT as batch jobs.\n\nNothing is queued when no node can ever run the job (slurm.fit). "
                 "Exit codes: README, \"Exit codes\".")


@app.command("up-slurm", help=UP_SLURM_HELP)
def up_slurm(
    login: str = typer.Argument(..., metavar="LOGIN", show_default=False,
                                help="The login node: host, user@host:port or ssh://…"),
    recipe: Optional[Path] = _recipe_argument(),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the batch scripts' place; submit nothing."),
    resume: Optional[str] = _resume_option(),
    detach: bool = typer.Option(False, "--detach", "-d", help="Submit, then return."),
    set_: list[str] = _set_option(),
    waive: list[str] = _waive_option(),
    ssh_key: Optional[Path] = _ssh_key_option(),
    known_hosts: Optional[Path] = _known_hosts_option(),
    accept_new_host_key: bool = _accept_new_host_key_option(),
) -> None:
    _run_up_slurm(SlurmUpRequest(login=login, recipe=recipe, overrides=tuple(set_), dry_run=dry_run, resume=resume,
                                 detach=detach, waive=tuple(waive),
                                 ssh=_ssh(ssh_key, known_hosts, accept_new_host_key)))


def native_pair(recipe: Optional[Path], train: Optional[Path], accelerate: Optional[Path],
                deploy: Optional[Path]) -> NativePair | None:
    """--train/--accelerate[/--deploy] instead of a RECIPE (as `check` and `render` take them)."""
    if train is None and accelerate is None:
        if deploy is not None:
            raise UsageError("--deploy goes with --train and --accelerate", key="--deploy",
                             fix="ktdeploy up --train T.yaml --accelerate A.yaml --deploy D.yaml")
        return None
    if recipe is not None:
        raise UsageError("give either a RECIPE or --train/--accelerate, not both", key="RECIPE",
                         fix="ktdeploy up --host HOST --train T.yaml --accelerate A.yaml")
    if train is None or accelerate is None:
        raise UsageError("--train and --accelerate go together", key="--train" if train is None else "--accelerate",
                         fix="ktdeploy up --host HOST --train T.yaml --accelerate A.yaml")
    return NativePair(str(train), str(accelerate), str(deploy) if deploy else None)


@app.command()
def status(
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="Only runs on this host (as up had it)."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    all_: bool = typer.Option(False, "--all", help="Every recorded run: target, stage, state, age, reason."),
    as_json: bool = typer.Option(False, "--json", help="Print the record and the live state as JSON."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
    plot: bool = typer.Option(False, "--plot", help="Draw the run's loss curve in the terminal (plotext: the plot "
                                                    "extra)."),
) -> None:
    """The latest run: how it ended (a failure's stage, error and fix), its containers and progress now, its
    evaluation and loss curve."""
    from ktdeploy.cli.status_table import no_runs_line, print_all
    from ktdeploy.controller.run_queries import host_filter
    from ktdeploy.controller.run_queries import status as run_status
    from ktdeploy.controller.runs import find_runs, runs_dir

    if all_:
        rows = [r.status() for r in find_runs(host_filter(host))]
        if as_json:
            print_json(rows)
            return
        print_all(rows, str(runs_dir()), host)
        return
    if run is None and not as_json and not find_runs(host_filter(host)):   # nothing run yet: not an error
        console.print(esc(no_runs_line(str(runs_dir()), host)), highlight=False, soft_wrap=True)
        return
    st = run_status(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    if as_json:
        print_json(st)
        return
    _print_status(st)
    from ktdeploy.cli.status_extra import print_eval_and_curve

    print_eval_and_curve(st, _line, plot=plot)


def _line(text: str, first: str = "  ", rest: str = "    ", style: str = "") -> None:
    """One wrapped field of `status` (at spaces, continuation indented)."""
    from rich.text import Text

    for ln in wrap_words(text, console.width, first, rest):
        console.print(Text(ln, style=style), soft_wrap=True, highlight=False)


def _next_step(st: RunStatus, c: dict[str, Any] | None) -> str:
    """What to run next for a run nobody follows (a detached `up`), from its container's live state; a failed or
    crashed run's fix already says it."""
    from ktdeploy.core.run_summary import rerun_command

    if st.get("state") != "detached" or c is None:
        return ""
    if c.get("status") == "exited" and c.get("exit_code") == 0:
        return f"next: training finished; {rerun_command(st, resume=False)} converts and serves it"
    if c.get("status") in ("running", "restarting"):
        return (f"next: ktdeploy logs -f --run {st.get('id')} follows its log; {rerun_command(st, resume=False)} "
                "follows it, then converts and serves")
    return ""


def _print_status(st: RunStatus) -> None:
    from ktdeploy.core.eta import status_eta
    from ktdeploy.core.trainer_log import LogEntry, describe

    live: LiveStatus = st.get("live") or {}
    name = f"  name {st['name']}" if st.get("name") else ""
    # a record may lack a key (written by an older ktdeploy, or edited): shown as '?', never a crash
    _line(f"{st.get('id') or '?'}{name}  host {st.get('host') or '?'}  recipe {st.get('recipe') or '?'}  "
          f"recorded state {st.get('state') or '?'}", first="")
    if st.get("lock"):
        _line(f"lock {st['lock']} (one run of this job on this host at a time, however the host is spelled)")
    if st.get("state") in ("failed", "crashed") or st.get("error"):
        where = st.get("failed_stage") or st.get("stage") or "?"
        code = f" (exit {st['exit_code']})" if st.get("exit_code") is not None else ""
        _line(f"failed in {where}{code}: {st.get('error') or 'no error recorded'}", style="red")
        if st.get("failed_checks"):
            _line("failed checks: " + ", ".join(map(str, st["failed_checks"])))
        if st.get("fix"):
            _line(f"fix: {st['fix']}", rest="       ", style="green")
    if st.get("state") == "dry-run" and st.get("stops_at"):
        _line(f"plan stops at {st['stops_at']}: {st.get('stop_reason') or ''}")
    if st.get("down"):
        removed = ", ".join(f"{k}: {v}" for k, v in st["down"].items()) or "none"
        _line(f"containers stopped by `ktdeploy down` ({removed})")
    c = live.get("container")
    if live.get("error"):
        _line(f"container {st['container']}: host unreachable ({live['error']})")
    elif c is None:
        _line(f"container {st['container']}: absent")
    else:
        code = "" if c["status"] == "running" else f" exit {c['exit_code']}" + (" OOM-killed" if c["oom_killed"] else "")
        _line(f"container {st['container']}: {c['status']}{code}")
    p = live.get("progress")
    if p:
        _line(describe(LogEntry(**p)))
        eta = status_eta(st.get("eta"), p)
        if eta:
            _line(eta)
    nxt = _next_step(st, c)
    if nxt:
        _line(nxt, rest="       ", style="green")
    serve = live.get("serve")
    if serve:
        _line(f"serving {st['serve_container']}: {serve['status']}")
    _line(f"record {st['record']}")


@app.command()
def logs(
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    stage: str = typer.Option("train", "--stage", metavar="train|convert|serve",
                              help="Whose log: the training, conversion (and merge) or serving container's."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the container exits (Ctrl-C stops)."),
    tail: int = typer.Option(100, "--tail", metavar="N", help="Lines from the end to start with."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
) -> None:
    """A stage's container log (docker logs) of the latest run: training by default; a container that is gone,
    from the copy the run record keeps."""
    from ktdeploy.controller.run_queries import logs as run_logs

    run_logs(host, run, stage=stage, follow=follow, tail=tail, ssh=_ssh(ssh_key, known_hosts, False),
             write=lambda line: console.print(_log_text(line), highlight=False, markup=False, soft_wrap=True),
             say=lambda text: err_console.print(esc(text), highlight=False, soft_wrap=True))


_SGR = re.compile(r"\x1b\[[0-9;]*m")   # a colour code: dropped (it only colours; any other escape is shown)


def _log_text(line: str) -> str:
    """A container's log line for the terminal: its colour codes dropped and a progress bar's carriage returns made
    line breaks; every other control character is shown as an escape by the console (SafeConsole)."""
    return _SGR.sub("", line).replace("\r\n", "\n").replace("\r", "\n")


@app.command()
def down(
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
) -> None:
    """Stop and remove the latest run's containers; output, checkpoints and the record stay."""
    from ktdeploy.controller.run_queries import down as run_down

    done = run_down(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    for name, what in done.items():
        console.print(f"{esc(name)}: {esc(what)}", highlight=False)
