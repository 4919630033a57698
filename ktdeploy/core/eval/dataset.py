"""Evaluation samples from a LlamaFactory dataset (pure): an entry of ``dataset_info.json`` (alpaca, sharegpt and the
openai spelling of sharegpt, with their ``columns`` and ``tags``) applied to the rows of its file, the way
LlamaFactory's own converters (``llamafactory/data/converter.py``) turn a row into prompt messages and a response.

A sample is the chat the server is asked to continue (``messages``: system, history, the last user turn) and the
reference answer (``reference``: the last assistant turn; None when the row has none). A row LlamaFactory would skip
(a broken role order) is counted, never guessed at.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.errors import UsageError
from ktdeploy.core.safeio import parse_json

DATA_CONFIG = "dataset_info.json"
FORMATS = ("alpaca", "sharegpt", "openai")
REMOTE_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
# LlamaFactory's DatasetAttr defaults (llamafactory/data/parser.py)
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "history": None, "system": None}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
ROLE_OF_TAG = {"user_tag": "user", "assistant_tag": "assistant", "observation_tag": "user",
               "function_tag": "assistant", "system_tag": "system"}


@dataclass(frozen=True)
class Sample:
    id: str                                   # "<dataset>:<row index>"
    messages: tuple[dict[str, str], ...]      # OpenAI chat messages: what the server continues
    reference: str | None                     # the row's answer; None: nothing to score against

    def prompt_text(self) -> str:
        """The last user turn (what a person reads in the table and the JSONL)."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users else ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": list(self.messages), "reference": self.reference}


@dataclass(frozen=True)
class DatasetEntry:
    """One ``dataset_info.json`` entry, read as LlamaFactory's DatasetAttr reads it."""

    name: str
    file_name: str
    formatting: str = "alpaca"
    columns: Mapping[str, str | None] = field(default_factory=dict)
    tags: Mapping[str, str | None] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)   # the entry as written (copied for the training split)


@dataclass
class Loaded:
    samples: list[Sample]
    skipped: list[str] = field(default_factory=list)      # "<id>: why", rows LlamaFactory would skip too


def parse_dataset_info(text: str | bytes, where: str = DATA_CONFIG) -> dict[str, Any]:
    try:
        info = parse_json(text)
    except ValueError as e:
        raise UsageError(f"{where} is not JSON ({e})", key=DATA_CONFIG,
                         fix="Fix the file: LlamaFactory reads it with json.load.") from None
    if not isinstance(info, dict):
        raise UsageError(f"{where} is not a JSON object of dataset entries", key=DATA_CONFIG,
                         fix='Write {"NAME": {"file_name": "FILE.json"}, ...}.')
    return info


def entry(info: Mapping[str, Any], name: str, where: str = DATA_CONFIG) -> DatasetEntry:
    """The named entry; refused (UsageError, naming the fix) when missing, remote or in a format not read here."""
    if name not in info:
        known = ", ".join(sorted(map(str, info))[:8]) or "none"
        raise UsageError(f"dataset {name!r} is not defined in {where} (it defines: {known})", key="dataset",
                         fix=f"Add {name!r} to {where}, or name one it defines.")
    e = info[name]
    if not isinstance(e, dict):
        raise UsageError(f"{where}: entry {name!r} is not an object", key="dataset",
                         fix='Write "NAME": {"file_name": "FILE.json", ...}.')
    remote = [k for k in REMOTE_KEYS if k in e]
    if remote:
        raise UsageError(f"{where}: dataset {name!r} is remote ({remote[0]}); ktdeploy evaluates local files only",
                         key="dataset", fix="Download it into the data folder and name it by file_name.")
    fmt = str(e.get("formatting", "alpaca"))
    if fmt not in FORMATS:
        raise UsageError(f"{where}: dataset {name!r} has formatting {fmt!r}", key="dataset",
                         fix=f"Use one of {', '.join(FORMATS)}.")
    if e.get("ranking"):
        raise UsageError(f"{where}: dataset {name!r} is a ranking (preference) dataset: it has no single answer to "
                         "score", key="dataset", fix="Evaluate a supervised (SFT) dataset.")
    fname = e.get("file_name")
    if not isinstance(fname, str) or not fname or posixpath.isabs(fname) or ".." in fname.split("/"):
        raise UsageError(f"{where}: dataset {name!r} has no usable file_name ({fname!r})", key="dataset",
                         fix="Name a file inside the data folder (relative, no '..').")
    cols, tags = e.get("columns"), e.get("tags")
    return DatasetEntry(name=name, file_name=fname, formatting=fmt, columns=dict(cols) if isinstance(cols, dict) else {},
                        tags=dict(tags) if isinstance(tags, dict) else {}, raw=dict(e))


def parse_rows(text: str | bytes, where: str) -> list[Any]:
    """A JSON array (``.json``) or one JSON value per line (``.jsonl``), as the ``datasets`` json loader reads both."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = parse_json(stripped)
        except ValueError as e:
            raise UsageError(f"{where} is not JSON ({e})", fix="Fix the dataset file.") from None
        if not isinstance(rows, list):
            raise UsageError(f"{where} is not a JSON array of rows", fix="Fix the dataset file.")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(parse_json(line))
        except ValueError as e:
            raise UsageError(f"{where}, line {n} is not JSON ({e})", fix="Fix the dataset file (JSON lines).") from None
    return rows


def _col(e: DatasetEntry, key: str, defaults: Mapping[str, str | None]) -> str | None:
    v = e.columns.get(key, defaults.get(key)) if key in e.columns or key in defaults else None
    return v if isinstance(v, str) and v else None


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _alpaca(e: DatasetEntry, row: Mapping[str, Any]) -> tuple[list[dict[str, str]], str | None, str | None]:
    msgs: list[dict[str, str]] = []
    system = _col(e, "system", ALPACA_COLUMNS)
    if system and _text(row.get(system)):
        msgs.append({"role": "system", "content": _text(row.get(system))})
    hist = _col(e, "history", ALPACA_COLUMNS)
    if hist and isinstance(row.get(hist), list):
        for turn in row[hist]:
            if not (isinstance(turn, list | tuple) and len(turn) == 2):
                return [], None, "a history turn is not a [prompt, response] pair"
            msgs += [{"role": "user", "content": _text(turn[0])}, {"role": "assistant", "content": _text(turn[1])}]
    query = [_text(row.get(c)) for c in (_col(e, "prompt", ALPACA_COLUMNS), _col(e, "query", ALPACA_COLUMNS))
             if c and _text(row.get(c))]
    msgs.append({"role": "user", "content": "\n".join(query)})   # LlamaFactory: "prompt\nquery"
    resp = _col(e, "response", ALPACA_COLUMNS)
    ref = row.get(resp) if resp else None
    return msgs, ref if isinstance(ref, str) else None, None


def _sharegpt(e: DatasetEntry, row: Mapping[str, Any]) -> tuple[list[dict[str, str]], str | None, str | None]:
    openai = e.formatting == "openai"
    defaults = dict(SHAREGPT_TAGS)
    if openai:   # LlamaFactory's "openai" spelling: role/content keys, user/assistant/system values
        defaults.update(role_tag="role", content_tag="content", user_tag="user", assistant_tag="assistant",
                        observation_tag="tool", function_tag="function", system_tag="system")
    tags = {k: e.tags.get(k, v) for k, v in defaults.items()}
    col = e.columns.get("messages", "messages" if openai else "conversations")
    turns = row.get(col) if isinstance(col, str) else None
    if not isinstance(turns, list):
        return [], None, f"no {col!r} list"
    role_tag, content_tag = tags["role_tag"], tags["content_tag"]
    role_of = {tags[k]: r for k, r in ROLE_OF_TAG.items() if tags.get(k)}
    msgs: list[dict[str, str]] = []
    if turns and isinstance(turns[0], dict) and tags["system_tag"] and turns[0].get(role_tag) == tags["system_tag"]:
        msgs.append({"role": "system", "content": _text(turns[0].get(content_tag))})
        turns = turns[1:]
    else:
        sys_col = e.columns.get("system")
        if isinstance(sys_col, str) and _text(row.get(sys_col)):
            msgs.append({"role": "system", "content": _text(row.get(sys_col))})
    odd = (tags["user_tag"], tags["observation_tag"])
    even = (tags["assistant_tag"], tags["function_tag"])
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or t.get(role_tag) not in (odd, even)[i % 2]:
            return [], None, "invalid role order (LlamaFactory skips this row too)"
        msgs.append({"role": role_of[t[role_tag]], "content": _text(t.get(content_tag))})
    if not turns:
        return [], None, "no turns"
    if len(turns) % 2 != 0:   # ends on the user's turn: a prompt without a reference
        return msgs, None, None
    ref = msgs.pop()["content"]
    return msgs, ref, None


def samples(e: DatasetEntry, rows: Sequence[Any], *, indices: Sequence[int] | None = None) -> Loaded:
    """The rows (or those at ``indices``) as samples; a row that is no object or breaks LlamaFactory's role order is
    skipped and named."""
    out = Loaded(samples=[])
    for i in (range(len(rows)) if indices is None else indices):
        sid = f"{e.name}:{i}"
        row = rows[i]
        if not isinstance(row, dict):
            out.skipped.append(f"{sid}: not a JSON object")
            continue
        msgs, ref, why = (_alpaca if e.formatting == "alpaca" else _sharegpt)(e, row)
        if why:
            out.skipped.append(f"{sid}: {why}")
            continue
        out.samples.append(Sample(id=sid, messages=tuple(msgs), reference=ref))
    return out


def names_of(dataset: object) -> list[str]:
    """``train.dataset`` (a comma list or a YAML list) as LlamaFactory splits it."""
    if isinstance(dataset, str):
        return [n.strip() for n in dataset.split(",") if n.strip()]
    if isinstance(dataset, list):
        return [str(n).strip() for n in dataset if str(n).strip()]
    return []
