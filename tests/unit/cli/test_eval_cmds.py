"""`ktdeploy eval --endpoint` and `ktdeploy chat --prompt` as a person runs them, against real HTTP servers on
127.0.0.1 (tests/fakes/openai_server.py); the metric rows docs/eval.md shows come from this run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import samples
from tests.fakes.openai_server import OpenAIDouble

ROOT = Path(__file__).resolve().parents[3]
ROWS = [{"instruction": "", "input": "alpha beta", "output": "alpha beta"},
        {"instruction": "", "input": "gamma delta", "output": "gamma"},
        {"instruction": "", "input": "one two three", "output": "one two three"},
        {"instruction": "", "input": "no reference"}]


@pytest.fixture
def servers():
    tuned, base = OpenAIDouble(model="tuned"), OpenAIDouble(mode="refuse-odd", model="base")
    yield tuned, base
    tuned.stop()
    base.stop()


def _cli(*args, tmp_path, **env):
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "HOME": str(tmp_path), "KTDEPLOY_HOME": str(tmp_path / "k"),
                                         "COLUMNS": "100", **env})


def _rows(text: str) -> list[list[str]]:
    """The table's metric and count rows, cell by cell (the column widths follow the timing cells)."""
    keep = ("bleu", "rouge", "exact", "answered", "failed")
    return [[c.strip() for c in ln.strip("│ ").split("│")] for ln in text.splitlines()
            if ln.startswith("│") and ln.strip("│ ").startswith(keep)]


def test_eval_prints_the_docs_table_and_writes_every_sample(servers, tmp_path):
    tuned, base = servers
    (tmp_path / "held.json").write_text(json.dumps(ROWS))
    r = _cli("eval", "--endpoint", tuned.url, "--base-endpoint", base.url, "--dataset", str(tmp_path / "held.json"),
             "--concurrency", "1", "-o", str(tmp_path / "ev"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "eval 4/4, eta 0 s" in r.stderr   # progress lines where stderr is no terminal
    rows, want = _rows(r.stdout), _rows(samples("docs/eval.md")["eval-table"])
    assert rows == want and len(rows) == 7
    got = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    # the base server refuses its odd requests; its one logprob probe (after the first answer) is its request 3
    assert [g["base"].get("error", "")[:12] for g in got] == ["refused: HTT", "", "", "refused: HTT"]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["tuned_model"] == "tuned"   # from /v1/models
    assert _cli("eval", "--endpoint", tuned.url, "--dataset", str(tmp_path / "held.json"), "-o", str(tmp_path / "ev"),
                tmp_path=tmp_path).returncode == 2   # never over an evaluation


def test_chat_prompt_prints_only_the_answer_and_control_characters_are_shown_as_escapes(servers, tmp_path):
    tuned, _ = servers
    r = _cli("chat", "--endpoint", tuned.url, "--prompt", "hi \x1b]0;pwned\x07 there", tmp_path=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("hi \\x1b]0;pwned") and r.stdout.endswith(" there\n")   # ESC shown as its escape
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout                             # BEL: dropped by rich


def test_a_key_is_named_never_given_and_an_unset_one_is_a_usage_error(servers, tmp_path):
    tuned, _ = servers
    r = _cli("chat", "--endpoint", tuned.url, "--prompt", "x", "--api-key-env", "KTD_TEST_KEY", tmp_path=tmp_path)
    assert r.returncode == 2 and "KTD_TEST_KEY" in r.stderr
    r = _cli("chat", "--endpoint", tuned.url, "--prompt", "x", "--api-key-env", "KTD_TEST_KEY", tmp_path=tmp_path,
             KTD_TEST_KEY="s3cret")
    assert r.returncode == 0 and "s3cret" not in r.stdout + r.stderr


def test_eval_of_a_run_whose_server_is_not_there_says_so_at_once(tmp_path):
    """`ktdeploy eval` of the latest run (the walkthrough's 5b) when nothing listens on its port: exit 3 at once
    with the fix, not every sample asked of both sides first (200 x 2 refused requests, ~50 s on the walk)."""
    import socket
    import time

    from ktdeploy.controller.runs import RunRecord
    from ktdeploy.core import run_record as rr

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again: nothing listens there
    recipe = (ROOT / "recipes" / "tiny-moe-lora.yaml").read_text().replace(
        "    lora_name: tiny-lora", f"    lora_name: tiny-lora\n    port: {port}")
    os.environ["KTDEPLOY_HOME"], old = str(tmp_path / "k"), os.environ.get("KTDEPLOY_HOME")
    try:
        rec = RunRecord.create("tiny-moe-lora")
    finally:
        os.environ.pop("KTDEPLOY_HOME") if old is None else os.environ.__setitem__("KTDEPLOY_HOME", old)
    rec.write_text(rr.RECIPE, recipe)
    rec.set_status("crashed", host="localhost", failed_stage="FOLLOW")
    (tmp_path / "held.json").write_text(json.dumps(ROWS * 50))
    t0 = time.monotonic()
    r = _cli("eval", "--dataset", str(tmp_path / "held.json"), "--no-base", tmp_path=tmp_path)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert time.monotonic() - t0 < 20 and "eval 20/" not in r.stderr, r.stderr   # no sample was asked
    assert "ktdeploy status" in r.stderr and f"127.0.0.1:{port}" in r.stderr, r.stderr
    assert not (rec.path / "eval").exists() or not any((rec.path / "eval").iterdir())
