"""Path facts: existence, writability and free space for the recipe's model / data / output paths.

The paths are user input: they travel as argv items to a fixed script (never spliced into shell text).
"""

from __future__ import annotations

from typing import Any

from ktdeploy.core.facts.host import PathFacts
from ktdeploy.core.facts.limits import parse_df_line
from ktdeploy.core.markers import field_values, sh_fields
from ktdeploy.core.safeio import norm_path

# Run as: sh -c PATHS_SCRIPT ktdeploy PATH...  For each path: a tab-separated header line, then df -Pk
# of the path (or its nearest existing parent) and du -sk when it is a directory (bounded by timeout).
# The ``@@KTD-PATH`` / ``@@KTD-DU`` lines are core/markers.py's records.
PATH_KEY, DU_KEY = "KTD-PATH", "KTD-DU"
PATHS_SCRIPT = "\n".join([
    "",
    'for p in "$@"; do',
    '  q=$p',
    '  while [ ! -e "$q" ] && [ "$q" != / ]; do q=$(dirname -- "$q"); done',
    '  e=no; [ -e "$p" ] && e=yes',
    '  d=no; [ -d "$p" ] && d=yes',
    '  w=no; [ -w "$q" ] && w=yes',
    '  r=$(readlink -f -- "$q" 2>/dev/null || echo)',
    "  " + sh_fields(PATH_KEY, '"$p"', '"$e"', '"$d"', '"$w"', '"$q"', '"$r"'),
    '  df -Pk -- "$q" 2>/dev/null | tail -n 1',
    '  if [ "$d" = yes ] && [ -n "$KTD_DU" ]; then ' + sh_fields(DU_KEY, newline=False)
    + '; timeout 20 du -sk -- "$p" 2>/dev/null | cut -f1; fi',
    "done",
    ""])


def real_path(path: str, checked: str, checked_real: str) -> str:
    """The host's real spelling of ``path``: the resolved nearest existing parent plus the missing tail."""
    path, checked = norm_path(path), norm_path(checked)
    tail = path[len(checked):].lstrip("/") if path.startswith(checked) else ""
    return norm_path(checked_real.rstrip("/") + "/" + tail) if tail else norm_path(checked_real)


def parse_paths(text: str) -> list[PathFacts]:
    out: list[PathFacts] = []
    cur: dict[str, Any] | None = None
    df_lines: list[str] = []

    def flush() -> None:
        if cur is None:
            return
        df = parse_df_line("\n".join(df_lines))
        out.append(PathFacts(**cur, mount=df["mount"] if df else None,
                             total_bytes=df["total_bytes"] if df else None,
                             free_bytes=df["free_bytes"] if df else None))

    for line in text.splitlines():
        head, du = field_values(line, PATH_KEY), field_values(line, DU_KEY)
        if head is not None:
            flush()
            path, e, d, w, q, *rest = head
            cur = {"path": path, "exists": e == "yes", "is_dir": d == "yes", "writable": w == "yes", "checked": q,
                   "real": real_path(path, q, rest[0]) if rest and rest[0] else None}
            df_lines = []
        elif du is not None and cur is not None:
            v = du[0].strip()
            cur["used_bytes"] = int(v) * 1024 if v.isdigit() else None
        elif cur is not None:
            df_lines.append(line)
    flush()
    return out
