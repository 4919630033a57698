"""`ktdeploy eval` and `ktdeploy chat`: the served model through its OpenAI-compatible API (docs/eval.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ktdeploy.cli import app
from ktdeploy.cli.output import console, err_console, print_json
from ktdeploy.core.errors import UsageError
from ktdeploy.core.terminal_text import esc

RUN_ARG = "A run id (`ktdeploy status --all`); default: the latest run. Its endpoint, models and evaluation set."
KEY_ENV_HELP = "Name of the environment variable holding the API key (default: the run recipe's api_key_env); " \
               "the key itself never goes on the command line."


def _key(api_key_env: Optional[str]) -> Optional[str]:
    if api_key_env is None:
        return None
    if not api_key_env.replace("_", "").isalnum() or api_key_env[0].isdigit():
        raise UsageError(f"--api-key-env {api_key_env!r} is not a variable name", key="--api-key-env",
                         fix="Name the variable, e.g. --api-key-env KTDEPLOY_API_KEY (never the key).")
    value = os.environ.get(api_key_env)
    if not value:
        raise UsageError(f"--api-key-env names {api_key_env}, which is not set", key="--api-key-env",
                         fix=f"export {api_key_env}=<key> first.")
    return value


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    TextColumn("{task.fields[failed]}"), console=err_console, transient=True)


def _table(summary: dict) -> None:
    from rich.table import Table

    from ktdeploy.core.eval.score import METRICS

    sides = [s for s in ("base", "tuned") if s in summary]
    t = Table("metric", *sides, *(["Δ tuned-base"] if "delta" in summary else []))
    for m in METRICS:
        row = [f"{summary[s]['metrics'][m]:.2f}" if m in summary[s].get("metrics", {}) else "-" for s in sides]
        if "delta" in summary:
            row.append(f"{summary['delta'][m]:+.2f}" if m in summary["delta"] else "-")
        t.add_row(m, *row)
    for label, key in (("answered", "answered"), ("failed", "failed")):
        t.add_row(label, *[str(summary[s].get(key, 0)) for s in sides], *([""] if "delta" in summary else []))
    t.add_row("latency p50 s", *[str((summary[s].get("latency_s") or {}).get("p50", "-")) for s in sides],
              *([""] if "delta" in summary else []))
    t.add_row("tokens/s", *[str(summary[s].get("tokens_per_s", "-")) for s in sides],
              *([""] if "delta" in summary else []))
    if any("ref_logprob" in summary[s] for s in sides):
        t.add_row("ref logprob", *[str(summary[s].get("ref_logprob", "-")) for s in sides],
                  *([""] if "delta" in summary else []))
    console.print(t)
    console.print(f"samples: {esc(summary['samples'])} ({esc(summary.get('no_reference', 0))} without a reference); "
                  f"every answer: {esc(summary.get('samples_file', '?'))}", highlight=False)


@app.command("eval")
def eval_(
    run: Optional[str] = typer.Argument(None, metavar="[RUN]", help=RUN_ARG, show_default=False),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", metavar="URL",
                                           help="The OpenAI-compatible API (…/v1): without RUN, evaluate this server; "
                                                "with RUN, reach the run's server at this URL (an SSH tunnel)."),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME", help="--endpoint: the tuned model's name "
                                                                                "(default: the first /v1/models lists)."),
    base_endpoint: Optional[str] = typer.Option(None, "--base-endpoint", metavar="URL",
                                                help="--endpoint: a second server answering as the base model."),
    base_model: Optional[str] = typer.Option(None, "--base-model", metavar="NAME",
                                             help="--endpoint: the base model's name (on --base-endpoint, else the "
                                                  "same server: sglang-kt's model=<served> beside <served>:<lora>)."),
    no_base: bool = typer.Option(False, "--no-base", help="Ask the tuned model only."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", metavar="PATH",
                                           help="A JSON/JSONL file (alpaca, sharegpt or openai rows) or a folder "
                                                "with a dataset_info.json: with RUN, instead of its recipe's "
                                                "evaluation set; with --endpoint, the set to ask."),
    dataset_name: Optional[str] = typer.Option(None, "--dataset-name", metavar="NAME",
                                               help="The dataset_info.json entry (a --dataset folder)."),
    fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT",
                                      help="alpaca, sharegpt or openai (a --dataset file; default: from its rows)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", metavar="VAR", help=KEY_ENV_HELP),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1, help="At most this many samples."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="max_tokens per answer."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, max=64, help="Requests in flight."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.1, help="Seconds per request."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", metavar="DIR",
                                       help="--endpoint: a new folder for samples.jsonl and summary.json (default: "
                                            "$KTDEPLOY_HOME/evals/<UTC time>)."),
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
    ssh_key: Optional[Path] = typer.Option(None, "--ssh-key", metavar="FILE", help="SSH key for the run's host."),
    known_hosts: Optional[Path] = typer.Option(None, "--known-hosts", metavar="FILE", help="known_hosts file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Did the fine-tune work? Held-out prompts through the served model, scored with LlamaFactory's own metrics
    (BLEU-4, ROUGE-1/2/L) and exact match, base and tuned side by side; every answer into samples.jsonl."""
    from ktdeploy.controller import eval_stage as es
    from ktdeploy.core.eval.score import check_available

    check_available()   # before anything is fetched or asked
    if fmt is not None and fmt not in ("alpaca", "sharegpt", "openai"):
        raise UsageError(f"--format {fmt!r}", key="--format", fix="Use alpaca, sharegpt or openai.")
    flags = {k: v for k, v in (("max_samples", max_samples), ("max_tokens", max_tokens),
                               ("concurrency", concurrency), ("timeout_s", timeout)) if v is not None}
    key = _key(api_key_env)
    progress = _progress() if not as_json and sys.stderr.isatty() else None
    task = progress.add_task("eval", total=None, failed="") if progress else None

    def tick(p: Any) -> None:
        if progress is not None and task is not None:
            progress.update(task, completed=p.done, total=p.total, failed=f"{p.failed} failed" if p.failed else "")
        elif not as_json and (p.done == p.total or p.done % max(1, p.total // 10) == 0):   # a log, not a terminal
            eta = f", eta {p.eta_s:.0f} s" if p.eta_s is not None else ""
            err_console.print(f"eval {p.done}/{p.total}{eta}" + (f", {p.failed} failed" if p.failed else ""),
                              highlight=False)

    if progress is not None:
        progress.start()
    try:
        if endpoint is not None and run is None:
            summary = _endpoint_eval(endpoint, model, base_endpoint, base_model, no_base, dataset, dataset_name, fmt,
                                     key, flags, out, tick)
        else:
            if base_endpoint is not None or model is not None or base_model is not None:
                raise UsageError("--model, --base-model and --base-endpoint go with --endpoint (no RUN): a run asks "
                                 "its own served models", key="RUN", fix="Drop RUN, or drop those options.")
            summary = es.eval_record(run, host, ssh=_ssh(ssh_key, known_hosts), endpoint=endpoint, api_key=key,
                                     overrides=flags, no_base=no_base, on_progress=tick,
                                     local=(dataset, dataset_name, fmt) if dataset is not None else None)
    finally:
        if progress is not None:
            progress.stop()
    if as_json:
        print_json(summary)
        return
    _table(summary)


def _ssh(key: Optional[Path], known: Optional[Path]) -> dict:
    return {k: str(v) for k, v in (("key", key), ("known_hosts", known)) if v is not None}


def _endpoint_eval(endpoint: str, model: Optional[str], base_endpoint: Optional[str], base_model: Optional[str],
                   no_base: bool, dataset: Optional[Path], dataset_name: Optional[str], fmt: Optional[str],
                   key: Optional[str], flags: dict, out: Optional[Path], tick: Any) -> dict:
    from ktdeploy.controller import eval_stage as es
    from ktdeploy.controller.eval_run import Endpoint, list_models
    from ktdeploy.controller.runs import home
    from ktdeploy.core.recipe.schema import Evaluation

    if dataset is None:
        raise UsageError("--endpoint needs the prompts to ask: --dataset PATH", key="--dataset",
                         fix="Give a JSON/JSONL file or a folder with a dataset_info.json (docs/eval.md).")
    e = Evaluation(**flags)
    loaded = es.local_samples(dataset, dataset_name, fmt, e.max_samples)
    tuned = model or _first_model(Endpoint(endpoint, "", key), list_models)
    sides = {"tuned": Endpoint(endpoint, tuned, key)}
    if not no_base and (base_endpoint or base_model):
        bep = base_endpoint or endpoint
        sides["base"] = Endpoint(bep, base_model or _first_model(Endpoint(bep, "", key), list_models), key)
    if out is not None:
        if os.path.lexists(out):
            raise UsageError(f"{out} exists; ktdeploy never writes over an evaluation", key="--out",
                             fix="Name a new folder.")
        out.mkdir(parents=True)
        folder = out
    else:
        folder = es.new_eval_dir(home() / "evals")
    return es.run_eval(loaded, sides, es.settings(e), folder,
                       {"url": endpoint, "tuned_model": tuned, "base_url": sides["base"].url if "base" in sides else None,
                        "base_model": sides["base"].model if "base" in sides else None, "source": str(dataset)}, tick)


def _first_model(ep: Any, list_models: Any) -> str:
    names = list_models(ep)
    if not names:
        raise UsageError(f"{ep.url}/models names no model", key="--model", fix="Name it: --model NAME.")
    return str(names[0])


@app.command()
def chat(
    run: Optional[str] = typer.Argument(None, metavar="[RUN]", help=RUN_ARG, show_default=False),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", metavar="URL", help="The OpenAI-compatible API (…/v1)."),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME",
                                        help="The model name (default: the run's tuned model, else the first "
                                             "/v1/models lists)."),
    base: bool = typer.Option(False, "--base", help="Talk to the run's base model instead of the tuned one."),
    prompt: Optional[str] = typer.Option(None, "--prompt", metavar="TEXT",
                                         help="One question: print only the answer and exit 0 (for scripts)."),
    system: Optional[str] = typer.Option(None, "--system", metavar="TEXT", help="A system message."),
    max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="max_tokens per answer."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, max=2.0, help="Sampling temperature."),
    timeout: float = typer.Option(300.0, "--timeout", min=0.1, help="Seconds one answer may take."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", metavar="VAR", help=KEY_ENV_HELP),
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST", help="The latest run on this host."),
) -> None:
    """Chat with the served model in the terminal (streamed; the server applies the chat template; the
    conversation is kept until you leave with Ctrl-D or /exit), or ask one question with --prompt."""
    from ktdeploy.controller.eval_run import Endpoint, Settings, list_models, stream_chat

    key = _key(api_key_env)
    if endpoint is None:
        endpoint, run_model, run_key = _run_endpoint(run, host, base)
        model = model or run_model
        key = key if key is not None else run_key
    ep = Endpoint(endpoint, model or _first_model(Endpoint(endpoint, "", key), list_models), key)
    s = Settings(max_tokens=max_tokens, temperature=temperature, timeout_s=timeout)
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        answer = "".join(stream_chat(ep, [*history, {"role": "user", "content": prompt}], s))
        console.print(answer, markup=False, highlight=False, soft_wrap=True)
        return
    err_console.print(f"chat with {esc(ep.model)} at {esc(ep.url)} (Ctrl-D or /exit to leave)", highlight=False)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            err_console.print()
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        parts: list[str] = []
        for piece in stream_chat(ep, history, s):
            parts.append(piece)
            console.print(piece, end="", markup=False, highlight=False, soft_wrap=True)
        console.print()
        history.append({"role": "assistant", "content": "".join(parts)})


def _run_endpoint(run: Optional[str], host: Optional[str], base: bool) -> tuple[str, str, Optional[str]]:
    """(URL, model, key) of a recorded run's server, as this machine reaches it."""
    from ktdeploy.controller.runs import latest_run
    from ktdeploy.core import run_record as rr
    from ktdeploy.core.eval.target import controller_url, models
    from ktdeploy.core.host_target import parse_host
    from ktdeploy.core.recipe.document import load_recipe

    rec = latest_run(parse_host(host).redacted if host else None, run_id=run)
    recipe = load_recipe(rec.path / rr.RECIPE)
    target = parse_host(rec.status_text("host", rec.status(), empty_ok=True))
    url, why = controller_url(recipe, local=target.is_local, host_address=target.address)
    if url is None:
        raise UsageError(f"run {rec.id}: {why}", key="--endpoint", fix=why)
    m = models(recipe)
    if base and m.base is None:
        raise UsageError(f"run {rec.id} serves no base model: {m.base_why}", key="--base", fix="Drop --base.")
    env = recipe.require_deploy().serve.api_key_env
    return url, (m.base if base and m.base else m.tuned), (os.environ.get(env) or None) if env else None
