"""`ktdeploy up`, `status`, `logs`, `down`: parse, call ktdeploy.controller.api, render."""

from __future__ import annotations

import re
from pathlib import Path
from types import FrameType
from typing import NoReturn, Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, print_json, wrap_words
from ktdeploy.core.errors import StepError, UsageError
from ktdeploy.core.markup import esc

RUN_HELP = "A run id (or a unique prefix of one) or a run's --name; default: the latest run."
SSH_KEY_HELP = "SSH private key (default: the agent, ~/.ssh)."
KNOWN_HOSTS_HELP = "known_hosts file to check host keys against (default: ~/.ssh/known_hosts)."
RECIPE_PANEL, CHECKS_PANEL, DATA_PANEL, TUNE_PANEL, SSH_PANEL = "Recipe", "Checks", "Data", "Tuning", "SSH"


def _ssh(key: Optional[Path], known_hosts: Optional[Path], accept_new: bool) -> dict:
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

    def _raise(signum: int, frame: FrameType | None) -> NoReturn:
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (an embedding caller): keep the default
        pass


UP_HELP = ("Provision HOST and run the recipe there, stage by stage.\n\n"
           "PREFLIGHT (doctor) -> RUNTIME -> IMAGE -> VOLUMES -> TRAIN -> FOLLOW -> CONVERT -> SERVE; a stage that "
           "is already satisfied is skipped, so the same command again changes nothing. Ctrl-C stops following, "
           "never training. Exit codes: README, \"Exit codes\".")


@app.command(help=UP_HELP)
def up(
    recipe: Optional[Path] = typer.Argument(None, metavar="RECIPE", show_default=False,
                                            help="Recipe YAML (default: the shipped tiny recipe)."),
    host: str = typer.Option("localhost", "--host", "-H", metavar="HOST", show_default=False,
                             help="localhost (default), host, user@host:port, ssh://…, docker://NAME."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="Name for --run of status/logs/down."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; change nothing."),
    facts: Optional[Path] = typer.Option(None, "--facts", metavar="FILE",
                                         help="--dry-run from `doctor --json` output."),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="auto|PATH",
                                         help="Newest complete checkpoint, or this one."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start training, then return."),
    no_progress: bool = typer.Option(False, "--no-progress", help="Progress lines, not a bar."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", rich_help_panel=RECIPE_PANEL,
                                   help="Override a recipe value (repeatable)."),
    train: Optional[Path] = typer.Option(None, "--train", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                         help="LlamaFactory training YAML (not RECIPE)."),
    accelerate: Optional[Path] = typer.Option(None, "--accelerate", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                              help="Accelerate YAML, with --train."),
    deploy: Optional[Path] = typer.Option(None, "--deploy", metavar="FILE", rich_help_panel=RECIPE_PANEL,
                                          help="deploy: YAML for the pair (else derived)."),
    cpu_only: bool = typer.Option(False, "--cpu-only", rich_help_panel=CHECKS_PANEL,
                                  help="No-GPU test host: waive the GPU checks."),
    waive: list[str] = typer.Option([], "--waive", metavar="CHECK", rich_help_panel=CHECKS_PANEL,
                                    help="Let this failing check pass (recorded)."),
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
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", rich_help_panel=SSH_PANEL,
                                           help="SSH private key."),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", rich_help_panel=SSH_PANEL,
                                               help="known_hosts to check host keys against."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key", rich_help_panel=SSH_PANEL,
                                             help="Record an unknown host key."),
    slurm: Optional[str] = typer.Option(None, "--slurm", metavar="LOGIN", show_default=False,
                                        help="Submit TRAIN and CONVERT as Slurm jobs on LOGIN."),
) -> None:
    from ktdeploy.cli.events_view import EventView
    from ktdeploy.controller import api

    if slurm is not None:
        from ktdeploy.core.errors import UsageError

        if (host != "localhost" or tune or image_tar or facts or cpu_only or name or sync_model or sync_data
                or train or accelerate or deploy):
            raise UsageError("--slurm submits to a cluster: it takes no --host, --tune, --image-tar, --facts, "
                             "--cpu-only, --name, --sync-model/--sync-data or --train/--accelerate/--deploy",
                             key="--slurm", fix="ktdeploy up --slurm LOGIN_HOST RECIPE")
        from ktdeploy.core.errors import EXIT_TERMINATED, Terminated

        _sigterm_raises()   # as plain up: the record says so, the jobs this run submitted are cancelled; exit 143
        try:
            api.up_slurm(slurm, recipe, dry_run=dry_run, resume=resume, detach=detach, waive=waive, overrides=set_,
                         ssh=_ssh(ssh_key, known_hosts, accept_new_host_key), on_event=EventView(console))
        except Terminated:
            import sys

            sys.stderr.write("terminated\n")
            raise typer.Exit(EXIT_TERMINATED) from None
        return
    _sigterm_raises()
    view = EventView(console, bar=not no_progress and console.is_terminal)
    from ktdeploy.core.errors import EXIT_TERMINATED, Terminated

    try:
        res = api.up(host, recipe, dry_run=dry_run, resume=resume, detach=detach, waive=waive, tune=tune,
                     tune_budget_minutes=tune_budget, facts_file=str(facts) if facts else None,
                     image_tar=str(image_tar) if image_tar else None, overrides=set_,
                     ssh=_ssh(ssh_key, known_hosts, accept_new_host_key), on_event=view, cpu_only=cpu_only,
                     native=native_pair(recipe, train, accelerate, deploy), name=name,
                     sync_model=str(sync_model) if sync_model else None, sync_data=str(sync_data) if sync_data else None)
    except Terminated:  # typer would turn it into Ctrl-C's 130; the record already says SIGTERM
        import sys

        sys.stderr.write("terminated\n")
        raise typer.Exit(EXIT_TERMINATED) from None
    if res.stops_at:   # a dry run whose plan stops: the code the real run would end with (a step fails: 4)
        raise typer.Exit(StepError.exit_code)


def native_pair(recipe: Optional[Path], train: Optional[Path], accelerate: Optional[Path],
                deploy: Optional[Path]) -> tuple[str, str, str | None] | None:
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
    return str(train), str(accelerate), str(deploy) if deploy else None


@app.command()
def status(
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="Only runs on this host (as up had it)."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    all_: bool = typer.Option(False, "--all", help="List every recorded run."),
    as_json: bool = typer.Option(False, "--json", help="Print the record and the live state as JSON."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
) -> None:
    """The latest run: how it ended (a failure's stage, error and fix), its containers and progress now."""
    from ktdeploy.controller import api
    from ktdeploy.controller.runs import find_runs

    if all_:
        rows = [r.status() for r in find_runs(host)]
        if as_json:
            print_json(rows)
            return
        _print_all(rows)
        return
    st = api.status(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    if as_json:
        print_json(st)
        return
    _print_status(st)


def _print_all(rows: list[dict]) -> None:
    from rich.table import Column, Table

    # run ids (what --run takes) and container names are printed whole, never folded or cut: a table when
    # every cell fits the terminal, else one block per run with the id on its own line
    keys: tuple[str, ...] = ("id", "name", "host", "recipe", "state", "container")
    keys = tuple(k for k in keys if k != "name" or any(s.get("name") for s in rows))
    widths = [max([len(str(s.get(k) or "")) for s in rows] + [len(k)]) for k in keys]
    if sum(widths) + 3 * len(keys) + 1 > console.width:
        for s in rows:
            console.print(s.get("id", ""), style="bold", markup=False, highlight=False, crop=False, overflow="ignore")
            for k in keys[1:]:
                console.print(f"  {k:<9} {esc(s.get(k) or '')}", highlight=False, crop=False, overflow="ignore")
        return
    t = Table(*[Column("run" if k == "id" else k, no_wrap=True, overflow="ignore", min_width=w)
                for k, w in zip(keys, widths, strict=False)])
    for s in rows:
        t.add_row(*[esc(s.get(k) or "") for k in keys])
    console.print(t)


def _line(text: str, first: str = "  ", rest: str = "    ", style: str = "") -> None:
    """One wrapped field of `status` (at spaces, continuation indented)."""
    from rich.text import Text

    for ln in wrap_words(text, console.width, first, rest):
        console.print(Text(ln, style=style), soft_wrap=True, highlight=False)


def _print_status(st: dict) -> None:
    from ktdeploy.core.trainer_log import LogEntry, describe

    live: dict = st.get("live") or {}
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
    serve = live.get("serve")
    if serve:
        _line(f"serving {st['serve_container']}: {serve['status']}")
    _line(f"record {st['record']}")


@app.command()
def logs(
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the container exits (Ctrl-C stops)."),
    tail: int = typer.Option(100, "--tail", metavar="N", help="Lines from the end to start with."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
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
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help=RUN_HELP),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help=SSH_KEY_HELP),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help=KNOWN_HOSTS_HELP),
) -> None:
    """Stop and remove the latest run's containers; output, checkpoints and the record stay."""
    from ktdeploy.controller import api

    done = api.down(host, run, ssh=_ssh(ssh_key, known_hosts, False))
    for name, what in done.items():
        console.print(f"{esc(name)}: {esc(what)}", highlight=False)
