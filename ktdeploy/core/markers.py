"""The output-marker format of ktdeploy's host scripts (pure), in one place: what the fixed sh scripts print
around their values and how it is read back. Lines starting with ``@@`` are markers; values never start
with one (they are command output after a marker line, or follow a tab).

- sections (fact gathering, ``controller/facts_gather.py``): ``@@KTD-BEGIN NAME`` / stdout /
  ``@@KTD-RC NAME RC`` / stderr / ``@@KTD-END NAME``;
- fields (job state, ``core/plan/state.py``): ``@@KEY<TAB>VALUE`` lines and ``@@BLOCK`` ... ``@@end`` blocks;
- records (path facts, ``core/facts/disk.py``; data/weights reads, ``core/facts/data_listing.py``): a
  ``@@KEY<TAB>F1<TAB>F2...`` header line, then the lines of its body up to the next header
  (``sh_fields`` prints one, ``field_values`` reads it back);
- the follow snapshot (``controller/executor.snapshot``): ``FOLLOW_SH`` prints ``@@inspect<TAB>RC``, docker
  inspect's answer, ``@@log``, the trainer_log tail and a closing ``@@end``; ``parse_follow`` returns None for
  an answer that is cut short (no ``@@end``: the connection dropped) or malformed, so only a complete answer
  from a live connection is ever read;
- files (the agent's run record read from the host, ``controller/executor``): ``FILES_SH`` prints
  ``@@dir<TAB>DIR``, then ``@@file<TAB>NAME`` and the file's first bytes for each name, and ``@@end``;
  ``parse_files`` reads it back.

Every emitter here prints ``@@`` + a name from this module, and every parser reads the same names back.
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


def sh_fields(key: str, *values: str, newline: bool = True) -> str:
    """sh text printing one ``@@KEY<TAB>V1<TAB>V2...`` line; each value is a shell word (e.g. ``"$p"``).
    ``newline=False`` leaves the line open for a command's output to finish it (``printf '@@image\t'; cmd``)."""
    fmt = "\\t".join([marker(key)] + ["%s"] * len(values)) + ("\\n" if newline else "")
    if not values and not newline:
        fmt = marker(key) + "\\t"
    return f"printf '{fmt}'" + "".join(f" {v}" for v in values)


def sh_block(key: str) -> str:
    """sh text printing a bare ``@@KEY`` line (a block's start; ``sh_block("end")`` closes it)."""
    return f"echo '{marker(key)}'"


def field_values(line: str, key: str) -> list[str] | None:
    """The tab-separated values of a ``@@KEY<TAB>...`` line, or None when ``line`` is not one."""
    head = marker(key) + "\t"
    if not line.startswith(head):
        return None
    return line[len(head):].split("\t")


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
            fields.setdefault(k, v)  # the first wins: the scripts print every field before any host-made text
    return fields, out



# -- the follow snapshot: docker's answer about the container, then the trainer_log tail, framed and closed ----------
FOLLOW_INSPECT, FOLLOW_LOG = "inspect", "log"

# Run as: sh -c FOLLOW_SH ktdeploy-follow CONTAINER LOG
FOLLOW_SH = "\n".join([
    "",
    "st=$(docker inspect --type container --format '{{json .State}}' -- \"$1\" 2>&1); rc=$?",
    sh_fields(FOLLOW_INSPECT, '"$rc"'),
    "printf '%s\\n' \"$st\"",
    sh_block(FOLLOW_LOG),
    # the trainer may be mid-line: $(...) drops the torn line's missing newline and printf ends it, so '@@end'
    # always stands on its own line (the parser skips the torn line until it is finished)
    # a regular file, not a link (a trainer_log linked to /dev/zero would keep tail reading)
    'lt=; [ -f "$2" ] && [ ! -h "$2" ] && lt=$(tail -n 5 -- "$2" 2>/dev/null); [ -z "$lt" ] || printf \'%s\\n\' "$lt"',
    sh_block("end"),
    ""])


@dataclass
class FollowFrame:
    inspect_rc: str          # docker inspect's exit status, as printed
    inspect: list[str]       # docker inspect's stdout+stderr lines
    log: list[str]           # the trainer_log tail


def is_complete(text: str) -> bool:
    """Whether a framed answer got as far as its closing ``@@end`` line (a cut connection does not)."""
    return END in text.splitlines()


def parse_follow(text: str) -> FollowFrame | None:
    """A FOLLOW_SH answer -> its parts, or None when it is not complete (no ``@@end`` line) or does not start
    with the ``@@inspect`` line."""
    lines = text.splitlines()
    if not lines or END not in lines:
        return None
    head = field_values(lines[0], FOLLOW_INSPECT)
    if head is None:
        return None
    log_at = lines.index(marker(FOLLOW_LOG)) if marker(FOLLOW_LOG) in lines else None
    end_at = lines.index(END)
    body = lines[1:log_at] if log_at is not None else []
    tail = lines[log_at + 1:end_at] if log_at is not None else []
    return FollowFrame("\t".join(head), body, tail)


# -- files: the newest folder under a directory, and the first bytes of named files in it --------------------------
# Run as: sh -c FILES_SH ktdeploy-files PARENT NAME...  (the newest folder by mtime; nothing when there is none)
FILES_SH = "\n".join([
    "",
    'p=$1; shift; d=$(ls -1dt -- "$p"/*/ 2>/dev/null | head -n 1)',
    '[ -n "$d" ] || exit 0',
    sh_fields("dir", '"${d%/}"'),
    'for f in "$@"; do',
    "  " + sh_fields("file", '"$f"') + '; head -c 65536 -- "$d$f" 2>/dev/null; echo',
    "done",
    sh_block("end"),
    ""])


def parse_files(text: str) -> tuple[str, dict[str, str]] | None:
    """A FILES_SH answer -> (the folder, {name: text}); None when there was no folder or the answer was cut
    short. A missing file reads as ""."""
    if not is_complete(text):
        return None
    folder: str | None = None
    files: dict[str, str] = {}
    cur: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        d, f = field_values(line, "dir"), field_values(line, "file")
        if d is not None:
            folder = "\t".join(d)
        elif f is not None or line == END:
            if cur is not None:
                text_ = "\n".join(body)
                files[cur] = text_[:-1] if text_.endswith("\n") else text_
            if line == END:
                break
            cur, body = "\t".join(f or []), []
        elif cur is not None:
            body.append(line)
    return (folder, files) if folder is not None else None


# -- a Slurm job's state (scontrol, then sacct) and the trainer_log tail, framed and closed -------------------------
JOB_BLOCKS = ("scontrol", "sacct", "log")

# Run as: bash -c JOB_SH ktdeploy-job JOBID LOG
JOB_SH = "\n".join([
    sh_block("scontrol"), 'scontrol show job --oneliner -- "$1" 2>&1', sh_block("end"),
    sh_block("sacct"), 'sacct --noheader --parsable2 --allocations --jobs "$1" '
                       '--format JobID,State,NodeList,ExitCode,Restarts 2>&1', sh_block("end"),
    # the trainer log: a regular file, not a link, its last 64 KiB (a line without end is not read whole)
    sh_block("log"), '[ -f "$2" ] && [ ! -h "$2" ] && tail -c 65536 -- "$2" 2>/dev/null | tail -n 20',
    sh_block("end"),
    sh_block("done"), ""])


def parse_job(text: str) -> dict[str, str] | None:
    """JOB_SH's answer -> {scontrol, sacct, log: text}; None when it was cut short (never "no such job")."""
    if marker("done") not in text.splitlines():
        return None
    _fields, blocks = parse_fields(text, JOB_BLOCKS)
    return {k: "\n".join(v) for k, v in blocks.items()}
