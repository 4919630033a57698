"""The CLI: parse options, call ktdeploy.controller.api (or a core module), render. Nothing else.

Each command group lives in its own module and registers itself on ``app``.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from ktdeploy.core.errors import KtdeployError

app = typer.Typer(
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
    "up_cmds",       # up, status, logs, down
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"ktdeploy.cli.{_name}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every expected error becomes one screen and an exit code, never a traceback."""
    from ktdeploy.cli.output import print_error, print_internal_error

    try:
        rc = app(args=argv, standalone_mode=False)
    except KtdeployError as err:
        print_error(err)
        sys.exit(err.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as err:  # click's own usage errors and anything unforeseen
        import click

        if isinstance(err, click.exceptions.Exit):
            sys.exit(err.exit_code)
        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(err.exit_code)
        if isinstance(err, click.exceptions.Abort):
            sys.stderr.write("aborted\n")
            sys.exit(130)
        if os.environ.get("KTDEPLOY_DEBUG"):
            raise
        print_internal_error(err)
        sys.exit(70)
    sys.exit(rc if isinstance(rc, int) else 0)
