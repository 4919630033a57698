"""The CLI: parse options, call the controller (or a core module), render. Nothing else.

Each command group lives in its own module and registers itself on ``app``.
"""

from __future__ import annotations

import sys

try:  # Ctrl-C while the CLI still starts up (typer's import alone takes ~50 ms): one line, exit 130
    import importlib
    import os

    import typer

    from ktdeploy.cli.help import App
    from ktdeploy.core.errors import (
        EXIT_INTERNAL,
        EXIT_INTERRUPTED,
        EXIT_PIPE,
        EXIT_SYSTEM,
        EXIT_TERMINATED,
        KtdeployError,
        Terminated,
        UsageError,
    )

    app = App(
        name="ktdeploy",
        help="Fine-tune trillion-parameter MoE models with KTransformers + LlamaFactory on one checked path.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    # One module per command group; each does `from ktdeploy.cli import app` and decorates its commands.
    COMMAND_MODULES = [
        "recipe_cmds",   # check, render
        "plan_cmds",     # plan
        "image_cmds",    # image build|save|load|layers
        "doctor_cmds",   # doctor
        "agent_cmds",    # train, convert, serve, tiny-model
        "tune_cmds",     # tune
        "up_cmds",       # up, up-slurm, status, logs, down
        "eval_cmds",     # eval, chat
    ]

    for _name in COMMAND_MODULES:
        importlib.import_module(f"ktdeploy.cli.{_name}")

    import signal as _signal

    import ktdeploy as _pkg

    if _signal.getsignal(_signal.SIGINT) is _pkg._interrupted_at_start:   # the start-up guard's job is done
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    sys.exit(130)


def _print_version(value: bool) -> None:
    if value:
        from ktdeploy import __version__

        sys.stdout.write(f"ktdeploy {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print ktdeploy's version and exit.")) -> None:
    """Fine-tune trillion-parameter MoE models with KTransformers + LlamaFactory on one checked path."""


def _kind(err: BaseException) -> str | None:
    """click's exception family by name: typer >= 0.20 bundles its own click (typer._click), so an isinstance
    test against the installed click never matches."""
    names = {c.__name__ for c in type(err).__mro__ if c.__module__.startswith(("click", "typer"))}
    for kind in ("Exit", "Abort", "ClickException"):
        if kind in names:
            return kind
    return None


def exit_code_for(err: BaseException) -> int:
    """The one mapping from an exception to a documented exit code (README, "Exit codes")."""
    if isinstance(err, KtdeployError):
        return err.exit_code
    if isinstance(err, Terminated):
        return EXIT_TERMINATED
    if isinstance(err, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    kind = _kind(err)
    if kind in ("Exit", "ClickException"):
        return int(getattr(err, "exit_code", 2))
    if kind == "Abort":
        return EXIT_INTERRUPTED
    if isinstance(err, (OSError, MemoryError, RecursionError)):
        return EXIT_SYSTEM
    return EXIT_INTERNAL


def _output_closed() -> None:
    """The reader of stdout went away (`ktdeploy ... | head`): stop quietly with 128 + SIGPIPE, as `yes | head`
    does; nothing more is written (stdout now goes to /dev/null, so the interpreter's last flush cannot fail)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(EXIT_PIPE)


def _fd_identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _stdout_closed(before: tuple[int, int] | None) -> bool:
    """Did the command stop because stdout's reader went away? rich answers EPIPE by pointing fd 1 at /dev/null
    and exiting 1 (Console.on_broken_pipe), typer's bundled click by swapping stdout for its PacifyFlushWrapper and
    exiting 1: either way 1 would read as "a check failed"."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    try:
        now = _fd_identity(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return now is not None and now != before and now == _fd_identity_of(os.devnull)


def _fd_identity_of(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every exception becomes one screen and a documented exit code, never a traceback."""
    try:
        stdout_was = _fd_identity(sys.stdout.fileno())
    except (OSError, ValueError):
        stdout_was = None
    try:
        rc = app(args=argv, standalone_mode=False)
    except SystemExit:
        if _stdout_closed(stdout_was):
            _output_closed()
        raise
    except BrokenPipeError:
        _output_closed()
        raise
    except BaseException as err:  # noqa: BLE001 - this is the one place that maps every exception
        handle(err)
    rc = rc if isinstance(rc, int) else 0
    if rc == EXIT_INTERRUPTED:  # typer turns Ctrl-C into Exit(130), which click returns without a word
        sys.stderr.write("interrupted\n")
    sys.exit(rc)


def handle(err: BaseException) -> None:
    """One screen for ``err`` and its documented exit code (also for the image's entry point, before the CLI)."""
    if _kind(err) == "Abort" and isinstance(err.__cause__, KeyboardInterrupt):
        err = err.__cause__  # click turns Ctrl-C (and our SIGTERM) into Abort: the cause says which
    try:
        from ktdeploy.cli.output import print_error, print_internal_error, print_system_error

        if isinstance(err, UnicodeError):  # only user text can fail to encode (a lone surrogate in a name)
            # a plain UnicodeError (the idna codec's "label empty or too long") has no .reason
            reason = err.reason if isinstance(err, (UnicodeEncodeError, UnicodeDecodeError, UnicodeTranslateError)) \
                else str(err)
            err = UsageError(f"an argument, file name or value is not valid text: {reason}",
                             fix="use UTF-8 names and values without lone surrogates")
        code = exit_code_for(err)
        kind = _kind(err)
        if isinstance(err, KtdeployError):
            print_error(err)
        elif isinstance(err, Terminated):
            sys.stderr.write("terminated\n")
        elif isinstance(err, KeyboardInterrupt) or kind == "Abort" or (kind == "Exit" and code == EXIT_INTERRUPTED):
            sys.stderr.write("interrupted\n")  # typer turns Ctrl-C into Exit(130) without a word
        elif kind == "ClickException":
            import io

            from ktdeploy.core.terminal_text import terminal_safe

            buf = io.StringIO()  # click quotes the argv it refuses: sanitized like every other print
            err.show(file=buf)  # type: ignore[attr-defined]  # a ClickException, matched by name: typer bundles its own click
            sys.stderr.write(terminal_safe(buf.getvalue()))
        elif kind == "Exit":
            pass
        elif code == EXIT_SYSTEM:
            print_system_error(err)
        else:
            if os.environ.get("KTDEPLOY_DEBUG"):
                raise err
            print_internal_error(err)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one is reported
        code = EXIT_INTERRUPTED
    sys.exit(code)
