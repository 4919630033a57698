"""Every parser of host text is total: a section a host printed in an unexpected shape (``lscpu -J`` with
``children`` as a number, ``docker info`` with ``Runtimes`` as a list, a probe line with a ``ran`` key, JSON nested
3,000 deep, a 5,000-digit integer) is reported unreadable in ``HostFacts.errors`` and its facts stay unknown: never
a crash (exit 70), never "the system refused" (a RecursionError read as exit 8)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# what a parser can raise on text of the wrong shape (pydantic's ValidationError is a ValueError)
PARSE_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, AttributeError, KeyError, IndexError,
                                                 RecursionError, OverflowError, ZeroDivisionError,
                                                 csv.Error, UnicodeError)

UNREADABLE = "unreadable"


def parsed(name: str, errors: dict[str, str], build: Callable[[], T], default: Callable[[], T]) -> T:
    """``build()``, or ``default()`` with ``errors[name]`` saying the section was unreadable and why."""
    try:
        return build()
    except PARSE_ERRORS as err:
        why = str(err).splitlines()[0][:160] if str(err) else ""
        errors[name] = f"{UNREADABLE} ({type(err).__name__}{': ' + why if why else ''})"
        return default()


def unreadable(errors: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in errors.items() if v.startswith(UNREADABLE)}
