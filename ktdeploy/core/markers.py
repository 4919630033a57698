"""The output-marker format of ktdeploy's host scripts (pure), in one place: what the fixed sh scripts print
around their values and how it is read back. Lines starting with ``@@`` are markers; values never start
with one (they are command output after a marker line, or follow a tab).

- sections (fact gathering, ``controller/facts_gather.py``): ``@@KTD-BEGIN NAME`` / stdout /
  ``@@KTD-RC NAME RC`` / stderr / ``@@KTD-END NAME``;
- fields (job state, ``core/plan/state.py``): ``@@KEY<TAB>VALUE`` lines and ``@@BLOCK`` ... ``@@end`` blocks.
(The follow snapshot's framing, ``controller/executor.parse_snapshot``, is still its own: not moved yet.)
"""

from __future__ import annotations

from dataclasses import dataclass

MARK = "@@"
END = MARK + "end"

# sh function printing one section: sec NAME 'COMMAND' (stderr kept to 2000 bytes in "$t")
SECTION_SH = (
    'sec() { printf \'@@KTD-BEGIN %s\\n\' "$1"; sh -c "$2" 2>"$t" </dev/null; rc=$?; '
    'printf \'\\n@@KTD-RC %s %s\\n\' "$1" "$rc"; head -c 2000 "$t"; printf \'\\n@@KTD-END %s\\n\' "$1"; }')


def marker(name: str) -> str:
    return MARK + name


@dataclass
class Section:
    stdout: str | None
    rc: int | None
    stderr: str = ""


def parse_sections(text: str) -> dict[str, Section]:
    out: dict[str, Section] = {}
    buf: list[str] = []
    err: list[str] = []
    name, mode, rc = None, None, None
    for line in text.split("\n"):
        if line.startswith("@@KTD-BEGIN "):
            name, buf, err, mode, rc = line[12:].strip(), [], [], "out", None
        elif line.startswith("@@KTD-RC ") and name:
            parts = line.split()
            rc = int(parts[2]) if len(parts) > 2 and parts[2].lstrip("-").isdigit() else None
            mode = "err"
        elif line.startswith("@@KTD-END ") and name:
            stdout = "\n".join(buf)
            if stdout.endswith("\n"):
                stdout = stdout[:-1]
            out[name] = Section(stdout=stdout, rc=rc, stderr="\n".join(err).strip())
            name, mode = None, None
        elif mode == "out":
            buf.append(line)
        elif mode == "err":
            err.append(line)
    return out


def parse_fields(text: str, blocks: tuple[str, ...] = ()) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``@@KEY<TAB>VALUE`` lines -> {KEY: VALUE}; the lines between ``@@BLOCK`` (one of ``blocks``) and
    ``@@end`` -> {BLOCK: lines}."""
    fields: dict[str, str] = {}
    out: dict[str, list[str]] = {b: [] for b in blocks}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith(MARK) and line[len(MARK):] in blocks:
            current = line[len(MARK):]
            continue
        if line == END:
            current = None
            continue
        if current is not None:
            out[current].append(line)
            continue
        if line.startswith(MARK) and "\t" in line:
            k, _, v = line[len(MARK):].partition("\t")
            fields[k] = v
    return fields, out

