"""cli/progress.py: a long step's progress is a rich bar on a terminal (done/total, elapsed, ETA) and plain lines
elsewhere (no control sequence in a log or a pipe); core/ticks.tick reaches a `say` that draws progress and
leaves a plain one alone; merge ticks once per shard, and `ktdeploy merge` on a terminal draws the bar."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from ktdeploy.cli.progress import Ticker, hms, waiting
from ktdeploy.core.ticks import tick
from tests.unit.agent.merge.test_merge import MINI

REPO = Path(__file__).resolve().parents[3]
CSI = re.compile(r"\x1b\[")


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100, color_system="standard" if terminal else None), buf


def test_on_a_terminal_a_bar_with_the_count_and_the_eta():
    con, buf = _console(True)
    with Ticker("merge: shards", con, total=4) as t:
        t.say("model-00001.safetensors: merged (1/4)")
        t.tick(1, 4, "model-00001.safetensors", eta_s=90)
        t._progress.refresh()
        shown = buf.getvalue()
    assert "merge: shards" in shown and "1/4" in shown and "eta 1m30s" in shown, shown
    assert "model-00001.safetensors: merged (1/4)" in shown and CSI.search(shown)


def test_elsewhere_plain_lines_only():
    con, buf = _console(False)
    with Ticker("wheels", con, total=3) as t:
        t.tick(1, 3, "numpy-2.2.6.whl")
        t.say("a line of its own")
        t.tick(3, 3, "torch.whl")
    text = buf.getvalue()
    assert not CSI.search(text), repr(text)
    lines = text.splitlines()
    assert lines[0].startswith("wheels 1/3: numpy-2.2.6.whl (eta ") and lines[1:] == ["a line of its own",
                                                                                       "wheels 3/3: torch.whl"], lines
    con, buf = _console(False)
    with Ticker("merge: shards", con, plain_ticks=False) as t:   # the work's own lines already count
        t.tick(1, 2, "x")
        t("model-00001.safetensors: merged (1/2)")
    assert buf.getvalue() == "model-00001.safetensors: merged (1/2)\n"


def test_waiting_says_start_and_end_without_a_terminal():
    con, buf = _console(False)
    with waiting(con, "IMAGE: checking ktsft:amx in a container"):
        pass
    assert buf.getvalue().splitlines() == ["IMAGE: checking ktsft:amx in a container …",
                                           "IMAGE: checking ktsft:amx in a container: 0s"]


def test_tick_reaches_only_a_say_that_draws():
    got = []

    class Drawing:
        def __call__(self, text):
            pass

        def tick(self, done, total, what):
            got.append((done, total, what))

    tick(Drawing(), 2, 5, "layer 3")
    tick(print, 2, 5, "layer 3")   # a plain say: nothing happens
    assert got == [(2, 5, "layer 3")]
    assert (hms(5), hms(65), hms(3725)) == ("5s", "1m05s", "1h02m")


def test_merge_ticks_once_per_shard(tmp_path):
    from ktdeploy.agent.merge import merge
    from tests.fakes import kt_layout as kl

    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2)
    kl.write_lora_adapter(str(tmp_path / "out"), base=str(tmp_path / "base"), m=MINI, seed=3)
    ticks, said = [], []

    class Say:
        def __call__(self, text):
            said.append(text)

        def tick(self, done, total, what):
            ticks.append((done, total))

    merge(tmp_path / "out", tmp_path / "base", tmp_path / "merged", say=Say())
    assert ticks == [(0, 2), (1, 2), (2, 2)] and any("merged (2/2)" in s for s in said)


def test_merge_on_a_terminal_draws_the_bar(tmp_path):
    import pty

    from tests.fakes import kt_layout as kl

    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2)
    kl.write_lora_adapter(str(tmp_path / "out"), base=str(tmp_path / "base"), m=MINI, seed=3)
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "ktdeploy", "merge", str(tmp_path / "out"), "--base",
                          str(tmp_path / "base"), "-o", str(tmp_path / "merged")], stdout=subprocess.PIPE,
                         stderr=slave, cwd=REPO, env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    got = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:   # the child closed the terminal
            break
        if not chunk:
            break
        got += chunk
    out = p.communicate(timeout=120)[0].decode()
    os.close(master)
    text = got.decode("utf-8", "replace")
    assert p.returncode == 0 and "merged model written" in out, (out, text)
    assert "merge: shards" in text and CSI.search(text), text   # the bar, drawn on the terminal
    assert "merged (2/2)" in text                               # the lines stay, above it


def test_image_build_says_its_stages_with_the_eta_of_the_last_build(tmp_path, monkeypatch, capsys):
    """The build's own lines (a double of what docker's classic builder prints: the real build needs the base
    image) through `image build`'s progress: without a terminal, each stage's line ends with the time left by the
    last build; the first build has none and leaves its timings for the next."""
    import json as _json

    from ktdeploy.cli import image_cmds
    from ktdeploy.controller.images import build as build_mod
    from tests.unit.core.test_build_clock import LINES

    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    clock = iter(range(10**6))
    monkeypatch.setattr("time.monotonic", lambda: float(next(clock)))

    def double(opts, on_line=None):
        for _t, line in LINES:
            on_line(line)
        return "report"

    monkeypatch.setattr(build_mod, "build", double)
    assert image_cmds._build_with_progress(None, quiet=False) == "report"
    first = capsys.readouterr().err
    assert "[stage 1/5] deps: docker build --target deps" in first and "left, by the last build" not in first
    assert "Step 2/3 : RUN pip install" in first and "\x1b[" not in first
    times = _json.loads((tmp_path / image_cmds.TIMES).read_text())
    assert "deps:RUN pip install --no-index -r /lock/full.lock" in times
    image_cmds._build_with_progress(None, quiet=True)
    again = capsys.readouterr().err.splitlines()
    stage2 = next(ln for ln in again if ln.startswith("[stage 2/5]"))
    assert stage2.endswith("left, by the last build)") and "(about " in stage2, stage2
    assert " ---> 1a2b3c" not in again          # --quiet: the stage and step lines only
