"""`up`'s EVAL stage and `ktdeploy eval RUN`: fetch the evaluation set from the host into the run record, ask the
served model (and the base), score, and write ``eval/<UTC time>/{samples.jsonl,summary.json}`` into the record.

A failed or poor evaluation leaves the server running and says so; only ``deploy.eval.fail_below`` turns it into a
failing exit (CheckFailed: exit 1).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.eval_run import Endpoint, Progress, Settings, evaluate, list_models
from ktdeploy.controller.host_files import fetch_checked
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import events as ev
from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.errors import CheckFailed, ConnectError, KtdeployError, UsageError
from ktdeploy.core.eval import dataset as ds
from ktdeploy.core.eval.score import check_available
from ktdeploy.core.eval.summary import SampleResult, below, summarize
from ktdeploy.core.plan.params import EvalParams
from ktdeploy.core.plan.steps import Stage, Step
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.schema import Evaluation
from ktdeploy.core.safeio import private_dir, read_text, writing

EVAL_DIR = "eval"
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
MAX_EVAL_DATA = 64 << 20


class EvalHost(Protocol):
    """What the EVAL step uses of the executor."""

    conn: Connector
    record: RunRecord
    emit: ev.Sink
    recipe: Recipe | None


def new_eval_dir(parent: Path) -> Path:
    """A new folder ``parent/<UTC time>[-n]``, never an existing one."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        d = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise UsageError(f"{parent}: no free folder name for the evaluation", fix=f"Clean up {parent}.")


def jieba_cache() -> str | None:
    """A private folder for jieba's dictionary cache, ``${XDG_CACHE_HOME:-~/.cache}/ktdeploy/jieba-UID`` (0700, this
    user's; never the shared temp folder); None when no such folder can be had (jieba then builds it in memory)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ktdeploy"
    try:
        return str(private_dir(root / f"jieba-{os.getuid()}", root / f"jieba-{os.getuid()}"))
    except (UsageError, OSError, RuntimeError):
        return None


def settings(e: Evaluation | None) -> Settings:
    e = e or Evaluation()
    return Settings(max_tokens=e.max_tokens, temperature=e.temperature, timeout_s=e.timeout_s,
                    concurrency=e.concurrency, cache_dir=jieba_cache())


def load_samples(info_text: str, files: Mapping[str, bytes], datasets: tuple[str, ...], max_samples: int,
                 where: str = ds.DATA_CONFIG) -> ds.Loaded:
    """The samples of ``datasets`` (their rows in ``files``, by file_name), the first ``max_samples``."""
    info = ds.parse_dataset_info(info_text, where)
    out = ds.Loaded(samples=[])
    for name in datasets:
        e = ds.entry(info, name, where)
        got = ds.samples(e, ds.parse_rows(files[e.file_name], e.file_name))
        out.samples += got.samples
        out.skipped += got.skipped
    out.samples = out.samples[:max_samples]
    return out


def fetch_data(conn: Connector, p: EvalParams, into: Path) -> tuple[str, dict[str, bytes]]:
    """dataset_info.json and the datasets' files from the host (bounded, never through a link)."""
    into.mkdir(parents=True, exist_ok=True)
    info_local = into / ds.DATA_CONFIG
    why = fetch_checked(conn, f"{p.data_dir}/{ds.DATA_CONFIG}", info_local, 16 << 20)
    if why:
        raise UsageError(f"the evaluation set's {p.data_dir}/{ds.DATA_CONFIG} {why} on the host", key=p.source,
                         fix="Train first (the holdout is written by training), or fix the dataset folder.")
    info_text = read_text(info_local, 16 << 20, ds.DATA_CONFIG)
    info = ds.parse_dataset_info(info_text, f"{p.data_dir}/{ds.DATA_CONFIG}")
    files: dict[str, bytes] = {}
    for i, name in enumerate(p.datasets):
        e = ds.entry(info, name, f"{p.data_dir}/{ds.DATA_CONFIG}")
        local = into / f"{i}-{os.path.basename(e.file_name)}"
        why = fetch_checked(conn, f"{p.data_dir}/{e.file_name}", local, MAX_EVAL_DATA)
        if why:
            raise UsageError(f"dataset {name!r}: {p.data_dir}/{e.file_name} {why} on the host", key=p.source,
                             fix="Evaluate a file of at most 64 MiB that exists (deploy.eval.dataset), or a holdout.")
        files[e.file_name] = local.read_bytes()
    return info_text, files


def write_results(folder: Path, results: list[SampleResult], summary: dict[str, Any]) -> tuple[Path, Path]:
    import json

    with writing(folder, SAMPLES) as f:
        for r in results:
            f.write((json.dumps(r.to_json(), ensure_ascii=False) + "\n").encode())
    with writing(folder, SUMMARY) as f:
        f.write((json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode())
    return folder / SAMPLES, folder / SUMMARY


def run_eval(loaded: ds.Loaded, sides: dict[str, Endpoint], s: Settings, folder: Path, meta: dict[str, Any],
             on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Ask, score, summarize, write; the summary (with ``samples_file``)."""
    if not loaded.samples:
        raise UsageError("the evaluation set holds no sample" + (f" ({len(loaded.skipped)} rows skipped: "
                                                                   f"{loaded.skipped[0]})" if loaded.skipped else ""),
                         key="dataset", fix="Evaluate a dataset with at least one prompt.")
    check_available()
    try:
        results = evaluate(loaded.samples, sides, s, on_progress)
    except KeyboardInterrupt:   # nothing was written: the folder this evaluation made goes (the same -o works again)
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise
    summary = summarize(results, meta={**meta, "skipped_rows": len(loaded.skipped)})
    samples_file, _ = write_results(folder, results, summary)
    summary["samples_file"] = str(samples_file)
    unreached = [a.error for r in results for a in r.answers.values()]
    if unreached and all(e is not None and e.startswith("connection:") for e in unreached):
        raise ConnectError(f"no answer from {sides['tuned'].url}: {unreached[0]}",
                           fix=f"Check that the server runs (`ktdeploy status`) and the URL; every failure is in "
                               f"{samples_file}.")
    return summary


def short(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What status.json keeps of an evaluation."""
    keep = {k: summary[k] for k in ("samples", "source", "delta", "samples_file", "summary_file") if k in summary}
    for side in ("tuned", "base"):
        if side in summary:
            keep[side] = {"metrics": summary[side].get("metrics", {}), "failed": summary[side].get("failed", 0)}
    return keep


def _tell(emit: ev.Sink, pr: Progress) -> None:
    """A progress line at every tenth of the samples (and the last): `up`'s output stays short."""
    if pr.done == pr.total or pr.done % max(1, pr.total // 10) == 0:
        emit(ev.EvalProgressed(done=pr.done, total=pr.total, eta_s=pr.eta_s, failed=pr.failed))


def run_eval_step(ex: EvalHost, stage: Stage, s: Step) -> None:
    """The EVAL step of `up`. Never stops the server; a failure is recorded (and is exit 1 only with fail_below)."""
    p = s.typed(EvalParams)
    e = ex.recipe.require_deploy().eval if ex.recipe is not None else None
    folder = new_eval_dir(ex.record.path / EVAL_DIR)
    try:
        if p.url is None:
            raise UsageError(f"EVAL: {p.unreachable}", key="deploy.serve.host", fix=p.unreachable)
        info_text, files = fetch_data(ex.conn, p, folder / "data")
        loaded = load_samples(info_text, files, p.datasets, (e or Evaluation()).max_samples, f"{p.data_dir}/{ds.DATA_CONFIG}")
        key = os.environ.get(ex.recipe.require_deploy().serve.api_key_env or "") if ex.recipe is not None else None
        sides = {"tuned": Endpoint(p.url, p.tuned, key or None)}
        if p.base is not None and (e is None or e.compare_base):
            sides["base"] = Endpoint(p.url, p.base, key or None)
        ex.emit(ev.EvalStarted(samples=len(loaded.samples), url=p.url, tuned=p.tuned, base=p.base if "base" in sides else None,
                               source=p.source, base_why="" if "base" in sides else p.base_why))
        summary = run_eval(loaded, sides, settings(e), folder,
                           {"url": p.url, "tuned_model": p.tuned, "base_model": sides["base"].model if "base" in sides
                            else None, "source": p.source, "datasets": list(p.datasets)},
                           on_progress=lambda pr: _tell(ex.emit, pr))
    except KtdeployError as err:
        ex.record.set_status(ex.record.status().get("state", "running"),
                             eval={"failed": err.message, "fix": err.fix or ""})
        ex.emit(ev.EvalNotRun(why=err.message, fix=err.fix or ""))
        if e is not None and e.fail_below is not None:
            raise CheckFailed(f"EVAL: the evaluation failed ({err.message}); the server keeps running",
                              results=[CheckResult(name=CheckName.EVAL_SCORE, status="fail", detail=err.message)],
                              key="deploy.eval.fail_below", fix=err.fix) from None
        return
    summary["summary_file"] = str(folder / SUMMARY)
    verdict = below(summary, e.metric, e.fail_below) if e is not None and e.fail_below is not None else None
    ex.record.set_status(ex.record.status().get("state", "running"), eval={**short(summary), "below": verdict})
    ex.emit(ev.EvalFinished(summary_file=str(folder / SUMMARY), samples_file=summary["samples_file"],
                            tuned=summary.get("tuned", {}).get("metrics", {}),
                            base=summary.get("base", {}).get("metrics", {}) if "base" in summary else None,
                            failed=summary.get("tuned", {}).get("failed", 0), below=verdict))
    if verdict and e is not None:
        raise CheckFailed(f"EVAL: {verdict}; the server keeps running",
                          results=[CheckResult(name=CheckName.EVAL_SCORE, status="fail", detail=verdict)],
                          key="deploy.eval.fail_below",
                          fix=f"See {folder / SUMMARY} and {summary['samples_file']}; train longer or on better data, "
                              "or lower deploy.eval.fail_below.")


def detect_format(rows: list[Any]) -> str:
    """A bare dataset file's formatting, from its first object: sharegpt's ``conversations``, openai's ``messages``,
    else alpaca."""
    first = next((r for r in rows if isinstance(r, dict)), {})
    return "sharegpt" if "conversations" in first else "openai" if "messages" in first else "alpaca"


def local_samples(path: Path, name: str | None, fmt: str | None, max_samples: int) -> ds.Loaded:
    """`--dataset PATH`: a folder with a dataset_info.json (``name``: its entry; may be left out when it has one)
    or one JSON/JSONL file (``fmt``, else detected)."""
    if path.is_dir():
        info_text = read_text(path / ds.DATA_CONFIG, 16 << 20, ds.DATA_CONFIG)
        info = ds.parse_dataset_info(info_text, str(path / ds.DATA_CONFIG))
        if name is None:
            if len(info) != 1:
                raise UsageError(f"{path / ds.DATA_CONFIG} defines {len(info)} datasets", key="--dataset-name",
                                 fix="Name the one to evaluate: --dataset-name NAME.")
            name = next(iter(info))
        e = ds.entry(info, name, str(path / ds.DATA_CONFIG))
        files = {e.file_name: read_bytes_bounded(path / e.file_name)}
        return load_samples(info_text, files, (name,), max_samples, str(path / ds.DATA_CONFIG))
    raw = read_bytes_bounded(path)
    rows = ds.parse_rows(raw, str(path))
    fmt = fmt or detect_format(rows)
    e = ds.DatasetEntry(name=name or path.stem, file_name=path.name, formatting=fmt)
    got = ds.samples(e, rows)
    got.samples = got.samples[:max_samples]
    return got


def read_bytes_bounded(path: Path) -> bytes:
    from ktdeploy.core.safeio import read_bytes

    return read_bytes(path, MAX_EVAL_DATA, "dataset")


def eval_record(run_id: str | None, host: str | None, *, ssh: dict | None = None, endpoint: str | None = None,
                api_key: str | None = None, overrides: Mapping[str, Any] | None = None, no_base: bool = False,
                local: tuple[Path, str | None, str | None] | None = None,
                on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """`ktdeploy eval RUN`: the run's evaluation set fetched from its host (``local``: a dataset of this machine
    instead, as (path, name, format)), its served model (``endpoint``: another URL to the same server, e.g. through
    an SSH tunnel), results into the run record's ``eval/<UTC time>/``."""
    from ktdeploy.controller.connectors import connect
    from ktdeploy.controller.runs import latest_run
    from ktdeploy.core import run_record as rr
    from ktdeploy.core.eval.target import controller_url, eval_data, models
    from ktdeploy.core.host_target import parse_host
    from ktdeploy.core.recipe.document import load_recipe

    rec = latest_run(parse_host(host).redacted if host else None, run_id=run_id)
    st = rec.status()
    recipe = load_recipe(rec.path / rr.RECIPE)
    deploy = recipe.require_deploy()
    e = Evaluation(**{**(deploy.eval or Evaluation()).model_dump(), **(overrides or {})})
    m = models(recipe)
    target = parse_host(rec.status_text("host", st, empty_ok=True))
    url, why = (endpoint, "") if endpoint else controller_url(recipe, local=target.is_local, host_address=target.address)
    if url is None:
        raise UsageError(f"run {rec.id}: {why}", key="--endpoint", fix=why)
    key = api_key if api_key is not None else os.environ.get(deploy.serve.api_key_env or "") or None
    sides = {"tuned": Endpoint(url, m.tuned, key)}
    if m.base is not None and e.compare_base and not no_base:
        sides["base"] = Endpoint(url, m.base, key)
    try:   # one question first: a server that is not there is said at once, not after every sample failed
        list_models(sides["tuned"], timeout_s=min(settings(e).timeout_s, 30.0))
    except ConnectError as err:
        ended = f"; the run is {st.get('state')}" + (f" in {st['failed_stage']}" if st.get("failed_stage") else "") \
            if st.get("state") not in (None, "finished", "detached", "training", "running") else ""
        raise ConnectError(f"run {rec.id}: no server answers at {url} ({err.message}){ended}",
                           fix="See where the run stands with `ktdeploy status`; the same `ktdeploy up` serves a "
                               "trained run, or reach its server with --endpoint URL (an SSH tunnel).") from None
    folder = new_eval_dir(rec.path / EVAL_DIR)
    if local is not None:
        loaded, source, names = local_samples(*local, e.max_samples), str(local[0]), [local[1] or local[0].name]
    else:
        data = eval_data(recipe)
        p = EvalParams(data_dir=data.data_dir, datasets=data.datasets, source=data.source, url=url, tuned=m.tuned,
                       base=m.base)
        conn = connect(target, **(ssh or {}))
        try:
            info_text, files = fetch_data(conn, p, folder / "data")
        finally:
            conn.close()
        loaded = load_samples(info_text, files, data.datasets, e.max_samples, f"{data.data_dir}/{ds.DATA_CONFIG}")
        source, names = data.source, list(data.datasets)
    summary = run_eval(loaded, sides, settings(e), folder,
                       {"run": rec.id, "url": url, "tuned_model": m.tuned,
                        "base_model": sides["base"].model if "base" in sides else None, "source": source,
                        "datasets": names}, on_progress)
    summary["summary_file"] = str(folder / SUMMARY)
    rec.set_status(st.get("state", "finished"), eval=short(summary))
    return summary
