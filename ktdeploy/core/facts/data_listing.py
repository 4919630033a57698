"""Facts about a recipe's data and weights on the host: dataset_info.json, the first bytes of each dataset
file, the model's config.json, the listing of kt_weight_path. Pure parsers of the output of DATA_SCRIPT
(run by controller/doctor.py through a connector; every read is bounded by `head -c`).

DATA_SCRIPT args: pairs of KIND PATH. KIND is `read` (first READ_LIMIT bytes), `ls` (first 200 names), `sizes`
(a folder's files, one `BYTES<TAB>NAME` line each, links followed: a Hugging Face cache snapshot links its blobs;
at most MAX_FILES) or `shards` (a safetensors index: `total<TAB>BYTES` from its metadata, then one
`shard<TAB>NAME` line per distinct file its weight_map names, however large the index).
Output: for each pair a header line `@@KTD-DATA<TAB>KIND<TAB>STATUS<TAB>SIZE<TAB>PATH` (a record of
core/markers.py) then the content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.markers import field_values, sh_fields
from ktdeploy.core.safeio import parse_json

READ_LIMIT = 65536
MAX_FILES = 5000

DATA_KEY = "KTD-DATA"


def _head(kind: str, status: str, size: str) -> str:
    return sh_fields(DATA_KEY, kind, status, size, '"$p"')


DATA_SCRIPT = "\n".join([
    "",
    # every line of an answer's body starts with '|' (parse_data_output strips it): a file's content or name that
    # reads like a header line can never start a forged entry
    "body() { sed 's/^/|/'; }",
    "while [ $# -ge 2 ]; do",
    "  kind=$1; p=$2; shift 2",
    '  if [ "$kind" = ls ]; then',
    f'    if [ -d "$p" ]; then {_head("ls", "ok", "0")}',
    # one line per name, a newline or carriage return in a name shown as '?': `ls -1` printed it raw, and a file
    # named "x<LF>kt-weight-manifest.json<LF>_layer_0" listed a manifest and a layer folder (probe 3, F14)
    """      for f in "$p"/* "$p"/.[!.]*; do [ -e "$f" ] || [ -L "$f" ] || continue""",
    r"""        printf '%s' "${f##*/}" | tr '\n\r' '??'; echo""",
    '      done | head -n 200 | body',
    f'    else {_head("ls", "missing", "0")}; fi',
    '  elif [ "$kind" = sizes ]; then',
    f'    if [ -d "$p" ]; then {_head("sizes", "ok", "0")}',
    """      for f in "$p"/* "$p"/.[!.]*; do [ -f "$f" ] || continue""",
    r"""        printf '%s\t' "$(wc -c < "$f" 2>/dev/null | tr -d ' ')"; printf '%s' "${f##*/}" | tr '\n\r' '??'; echo""",
    f'      done | head -n {MAX_FILES} | body',
    f'    else {_head("sizes", "missing", "0")}; fi',
    '  elif [ "$kind" = shards ]; then',
    '    if [ -f "$p" ] && [ -r "$p" ]; then',
    f'      {_head("shards", "ok", "0")}',
    r"""      t=$(grep -o '"total_size"[[:space:]]*:[[:space:]]*[0-9]*' "$p" 2>/dev/null | head -n 1 | tr -dc '0-9')""",
    r"""      { printf 'total\t%s\n' "$t"; """,
    r"""        grep -o '"[^"]*[.]safetensors"' "$p" 2>/dev/null | tr -d '"' | sort -u | head -n 20000 | sed 's/^/shard\t/'; } | body""",
    f'    else {_head("shards", "missing", "0")}; fi',
    "  else",
    '    if [ -f "$p" ] && [ -r "$p" ]; then',
    """      size=$(wc -c < "$p" 2>/dev/null | tr -d ' ')""",
    f'      {_head("read", "ok", "${size:-0}")}; {{ head -c {READ_LIMIT} "$p"; echo; }} | body',
    f'    else {_head("read", "missing", "0")}; fi',
    "  fi",
    "done",
    ""])


@dataclass
class Entry:
    kind: str
    path: str
    ok: bool
    size: int
    content: str


@dataclass
class DataFacts:
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)

    def get(self, kind: str, path: str) -> Entry | None:
        return self.entries.get((kind, path))


def parse_data_output(text: str) -> DataFacts:
    facts = DataFacts()
    cur: Entry | None = None
    body: list[str] = []

    def close() -> None:
        if cur is not None:
            content = "\n".join(body)
            if cur.kind == "read" and content.endswith("\n"):
                content = content[:-1]
            cur.content = content
            facts.entries[(cur.kind, cur.path)] = cur

    for line in text.split("\n"):
        head = field_values(line, DATA_KEY)
        if head is not None and len(head) >= 4:
            close()
            kind, status, size, path = head[0], head[1], head[2], "\t".join(head[3:])
            cur = Entry(kind, path, status == "ok", int(size) if size.isdigit() else 0, "")
            body = []
            continue
        if line.startswith("|"):      # a body line (DATA_SCRIPT frames them); anything else is not ours
            body.append(line[1:])
    close()
    return facts


def file_sizes(entry: Entry | None) -> dict[str, int] | None:
    """A `sizes` answer -> {file name: bytes}; None when the folder is missing or was not asked for."""
    if entry is None or not entry.ok:
        return None
    out: dict[str, int] = {}
    for line in entry.content.split("\n"):
        size, tab, name = line.partition("\t")
        if tab and size.isdigit() and name:
            out[name] = int(size)
    return out


def index_shards(entry: Entry | None) -> tuple[int | None, list[str]] | None:
    """A `shards` answer -> (metadata.total_size or None, the shard files the weight_map names); None when the
    index is missing."""
    if entry is None or not entry.ok:
        return None
    total, shards = None, []
    for line in entry.content.split("\n"):
        kind, _, value = line.partition("\t")
        if kind == "total" and value.isdigit():
            total = int(value)
        elif kind == "shard" and value:
            shards.append(value)
    return total, shards


def _why(err: ValueError | RecursionError, with_line: bool = False) -> str:
    """The parser's message: a JSONDecodeError's msg (and line), else the text of a plain ValueError, which json
    raises without msg/lineno, e.g. for an integer longer than Python's int digit limit."""
    if isinstance(err, RecursionError):
        return "nested too deeply"
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} (line {err.lineno})" if with_line else err.msg
    return str(err)


def first_rows(content: str, complete: bool, name: str, n: int = 3) -> tuple[list[Any] | None, str]:
    """(up to n parsed rows, problem) from the first bytes of a dataset file (json array or jsonl)."""
    s = content.lstrip()
    if name.endswith(".jsonl") or (s and s[0] == "{" and not complete):
        rows = []
        lines = s.split("\n")
        if not complete:
            lines = lines[:-1]  # the last line may be cut by the bounded read
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rows.append(parse_json(line))
            except ValueError as err:
                return None, f"line {i + 1} is not JSON: {_why(err)}"
            if len(rows) >= n:
                break
        return (rows, "") if rows else (None, "no JSON rows in the first bytes")
    if name.endswith(".json"):
        if complete:
            try:
                data = parse_json(s)
            except ValueError as err:
                return None, f"not JSON: {_why(err, with_line=True)}"
            if not isinstance(data, list):
                return None, f"a JSON {type(data).__name__}, not a list of samples"
            return data[:n], ""
        if not s.startswith("["):
            return None, "not a JSON array of samples"
        dec, pos, rows = json.JSONDecoder(), 1, []
        while len(rows) < n:
            while pos < len(s) and s[pos] in " \r\n\t,":
                pos += 1
            try:
                obj, pos = dec.raw_decode(s, pos)
            except (ValueError, RecursionError) as err:
                if rows:
                    break
                return None, f"the first sample is not JSON: {_why(err)}"
            rows.append(obj)
        return rows, ""
    return [], ""  # csv/parquet/arrow: presence only
