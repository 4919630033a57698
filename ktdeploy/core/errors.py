"""The whole exception tree in one place (httpx style).

Every error a user can meet is a KtdeployError: the CLI prints it on one screen
(what, why, fix) and exits with its ``exit_code``; it never shows a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class KtdeployError(Exception):
    """Base of every expected failure. ``fix`` tells the user what to do."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None, key: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.key = key


class UsageError(KtdeployError):
    """The command line itself is wrong (missing file, bad option value)."""

    exit_code = 2


class RecipeError(KtdeployError):
    """The recipe is invalid. ``findings`` holds every violation at once."""

    exit_code = 2

    def __init__(self, message: str, findings: Iterable[Any] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.findings = list(findings or [])


class ConnectError(KtdeployError):
    """A host could not be reached (SSH refused, DNS, host key mismatch, docker missing)."""

    exit_code = 3


class CheckFailed(KtdeployError):
    """Doctor found a failing check; ``results`` holds the CheckResults."""

    exit_code = 1

    def __init__(self, message: str, results: Iterable[Any] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.results = list(results or [])


class StepError(KtdeployError):
    """A step of a plan failed on the host (command exit code, container crash)."""

    exit_code = 4

    def __init__(self, message: str, *, step: str | None = None, rc: int | None = None,
                 output: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.step = step
        self.rc = rc
        self.output = output


class ImageError(KtdeployError):
    """Building, verifying, saving or loading an image failed."""

    exit_code = 5


class RunRecordError(KtdeployError):
    """A run record is missing or unreadable, or an output dir would be overwritten."""

    exit_code = 6


class OverwriteRefused(RunRecordError):
    """A file or folder would be overwritten (exit 6, as the README's table says): named as what it is, with the
    --force or another-path fix, rather than as a run record's error."""


class StackUnavailable(KtdeployError):
    """The stack's own judgement (``check --stack``, ``stack.judge``) could not run: the image is not there, it holds
    no LlamaFactory/kt-kernel stack (a reduced or test image), or the judge itself failed."""

    exit_code = 7


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was (``ktdeploy up`` installs the handler): every place that handles Ctrl-C
    (a run record marked, training left running) handles it the same way; the exit code is 143."""


# Exit codes besides each error's own ``exit_code`` (the README's "Exit codes" table lists them all).
EXIT_SYSTEM = 8         # the operating system refused (permissions, disk full, out of memory) outside a known path
EXIT_INTERNAL = 70      # a bug in ktdeploy: no input may reach it (tests/unit/adversarial checks this)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT at any moment
EXIT_PIPE = 141         # the reader of the output went away (`ktdeploy ... | head`): 128 + SIGPIPE, as a shell tool
EXIT_TERMINATED = 143   # SIGTERM (128 + 15) while `ktdeploy up` ran: the run record says so

