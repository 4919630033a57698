"""ktdeploy: a checked path from a recipe to a KTransformers + LlamaFactory fine-tune and its server."""

import _signal  # already loaded by the interpreter (like sys and posix): no import machinery runs here
import sys as _sys


def _interrupted_at_start(signum: int, frame: object) -> None:  # pragma: no cover - timing
    """Ctrl-C while the CLI is still importing (before ktdeploy.cli's own guard): one line, exit 130."""
    import posix

    posix.write(2, b"interrupted\n")
    posix._exit(130)


def _is_the_cli() -> bool:
    """This process is the CLI: the console script, `python -m ktdeploy` or the image's entry point (never the
    trainer's `-m ktdeploy.agent.lf_entry`, nor a program that imports ktdeploy)."""
    if _sys.argv and _sys.argv[0].rpartition("/")[2] == "ktdeploy":
        return True
    orig = list(getattr(_sys, "orig_argv", []))
    target = orig[orig.index("-m") + 1] if "-m" in orig[:-1] else None
    return target in ("ktdeploy", "ktdeploy.__main__", "ktdeploy.cli", "ktdeploy.cli.image_entry")


# ktdeploy.cli restores Python's handler once it has imported its commands.
if _is_the_cli() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    try:
        _signal.signal(_signal.SIGINT, _interrupted_at_start)
    except ValueError:  # not the main thread
        pass

from ktdeploy.core.errors import (  # noqa: E402  (after the start-up guard)
    CheckFailed,
    ConnectError,
    ImageError,
    KtdeployError,
    RecipeError,
    RunRecordError,
    StackUnavailable,
    StepError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckFailed",
    "ConnectError",
    "ImageError",
    "KtdeployError",
    "RecipeError",
    "RunRecordError",
    "StackUnavailable",
    "StepError",
    "UsageError",
    "__version__",
]
