"""deploy.eval.holdout: the rows `ktdeploy train` holds out of the training data before LlamaFactory reads it.

The split (``core/eval/split.py``: a seeded hash of each row) is written beside the output dir, to
``<output_dir>-holdout/``: a ``dataset_info.json`` with each training dataset under its own name (the training rows,
same formatting and columns) and ``<name>.holdout`` (the held-out rows), the rows' files, and ``holdout.json`` (seed,
rule, the sources' SHA-256, the held-out row indices). The trainer is pointed at that folder (``dataset_dir``), so it
never reads a held-out row; `up`'s EVAL stage reads the ``.holdout`` entries. A second run (a resume) finds the same
split and reuses it; a split made from other files or another rule is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ktdeploy.core.errors import OverwriteRefused, RunRecordError, UsageError
from ktdeploy.core.eval import dataset as ds
from ktdeploy.core.eval import split as sp
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.safeio import parse_json, read_bytes, read_text, staging_dir, write_file

MAX_DATASET = 4 << 30     # one training dataset file read for the split
MEDIA_COLUMNS = ("images", "videos", "audios")


def _rows_file(name: str, part: str) -> str:
    return f"{name}.{part}.json"


def carve(data_dir: str, names: Sequence[str], output_dir: str, holdout: float, seed: int, *,
          write: bool = True) -> str:
    """Split each dataset of ``names`` (entries of ``data_dir``'s dataset_info.json) and return the folder the
    trainer reads instead (``dataset_dir``). ``write=False`` (a dry run) only names it."""
    target = JobLayout(output_dir).holdout_dir
    if not write:
        return target
    info_path = os.path.join(data_dir, ds.DATA_CONFIG)
    info = ds.parse_dataset_info(read_text(info_path, 16 << 20, ds.DATA_CONFIG), info_path)
    new_info: dict[str, Any] = {}
    sources: dict[str, dict[str, Any]] = {}
    parts: dict[str, tuple[list[Any], list[Any]]] = {}
    splits: dict[str, sp.Split] = {}
    for name in names:
        e = ds.entry(info, name, info_path)
        if any(e.columns.get(c) for c in MEDIA_COLUMNS):
            raise UsageError(f"dataset {name!r} names media files ({', '.join(MEDIA_COLUMNS)}); deploy.eval.holdout "
                             "splits text datasets only", key="deploy.eval.holdout",
                             fix="Hold out by hand (train.eval_dataset / deploy.eval.dataset) for this dataset.")
        path = os.path.join(data_dir, e.file_name)
        if os.path.isdir(path):
            raise UsageError(f"dataset {name!r} is a folder ({path}); deploy.eval.holdout splits one JSON/JSONL file",
                             key="deploy.eval.holdout", fix="Point file_name at one .json or .jsonl file.")
        raw = read_bytes(path, MAX_DATASET, f"dataset {name}")
        rows = ds.parse_rows(raw, path)
        s = sp.split_rows(rows, holdout, seed)
        sources[name] = {"file": posixpath.normpath(path), "sha256": hashlib.sha256(raw).hexdigest(), "rows": len(rows)}
        splits[name] = s
        parts[name] = ([rows[i] for i in s.train], [rows[i] for i in s.held])
        new_info[name] = {**e.raw, "file_name": _rows_file(name, "train")}
        new_info[name + sp.HOLDOUT_SUFFIX] = {**e.raw, "file_name": _rows_file(name, "holdout")}
    for other, e in info.items():   # train.eval_dataset and the rest stay readable from the split's folder
        if other not in new_info:
            fname = e.get("file_name") if isinstance(e, dict) else None
            new_info[other] = {**e, "file_name": os.path.join(data_dir, fname)} if isinstance(fname, str) else e
    done = Path(target, sp.MANIFEST)
    if os.path.lexists(target):
        recorded = parse_json(read_text(done, 16 << 20, "holdout record")) if done.is_file() else None
        if sp.same_split(recorded, seed, holdout, sources):
            return target
        raise RunRecordError(f"{target} holds a held-out split made from other data or settings; ktdeploy never "
                             "overwrites it", key="deploy.eval.holdout",
                             fix=f"Remove {target} if that split is no longer wanted, or choose a new train.output_dir.")
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = staging_dir(parent, ".ktdeploy-holdout-")
    try:
        for name, (train, held) in parts.items():
            write_file(tmp, _rows_file(name, "train"), json.dumps(train, ensure_ascii=False))
            write_file(tmp, _rows_file(name, "holdout"), json.dumps(held, ensure_ascii=False))
        write_file(tmp, ds.DATA_CONFIG, json.dumps(new_info, indent=2, ensure_ascii=False) + "\n")
        write_file(tmp, sp.MANIFEST, json.dumps(sp.manifest(seed=seed, holdout=holdout, sources=sources,
                                                            splits=splits), indent=2) + "\n")
        try:
            os.rename(tmp, target)   # published whole, or not at all
        except OSError:
            raise OverwriteRefused(f"{target} appeared while the split was written; not overwritten",
                                   fix=f"Remove {target} if it is stale, then run again.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # gone after the rename; a failed split leaves nothing
    return target
