"""Text from outside on the operator's terminal.

- ``esc``: user text inside rich markup: ``f"[green]✓[/green] {esc(path)}"`` prints a path holding ``[/x]`` as
  text, never as a tag (an unescaped one made rich raise MarkupError after the work was done).
- ``terminal_safe``: the one sanitizer of control characters. A recipe key, a host's answer, a tensor name or a
  record value holding ESC/CSI/OSC sequences, other C0/C1 controls, DEL, or bidi overrides could retitle, clear
  or rewrite the terminal (or hide text); each such character is shown as its escape (``\\x1b``, ``\\u202e``).
  Newline and tab stay. The CLI's consoles (``cli/output.SafeConsole``) apply it to every segment they print.
"""

from __future__ import annotations

import re
from typing import Any

# C0 but \t and \n, DEL, C1, the bidi embeddings/overrides/isolates and marks, line/paragraph separators
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _shown(m: re.Match[str]) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def terminal_safe(text: Any) -> str:
    """``text`` with every terminal control character replaced by its visible escape."""
    s = text if isinstance(text, str) else str(text)
    return CONTROL.sub(_shown, s) if CONTROL.search(s) else s


def esc(value: Any) -> str:
    from rich.markup import escape

    return escape(terminal_safe(value))
