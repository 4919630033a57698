"""`ktdeploy doctor` readable at 80 columns (and without a tty): no path or key split mid-token, each failing
check's fix on its own line(s); one fail count for doctor's summary, its last line and `up`'s panel."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from ktdeploy.cli.output import print_checks
from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.controller.up_inputs import load_facts_file
from ktdeploy.core.recipe import load_recipe

REPO = Path(__file__).resolve().parents[3]
SPLIT = re.compile(r"[\s│┃|]+")


def tokens(text: str) -> set[str]:
    return set(SPLIT.split(text))


def cli(*args, columns=80, home=None):
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("FORCE_COLOR", None)
    if home:
        env["KTDEPLOY_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)


def test_recorded_failures_render_whole_at_80_columns():
    """Deterministic: the real GPU machine's facts against the 397B recipe fail 3 checks with long keys/paths."""
    facts = load_facts_file(REPO / "examples/facts/gpu-h200-1gpu.json")
    report = DoctorReport(facts, run_checks(facts, load_recipe(REPO / "recipes/qwen35-397b-bf16-lora.yaml")))
    assert report.failed
    buf = io.StringIO()
    print_checks(report.checks, stream=Console(file=buf, width=80, force_terminal=False, color_system=None),
                 title="ktdeploy doctor")
    out = buf.getvalue()
    words = tokens(out)
    for c in report.checks:
        for tok in SPLIT.split(f"{c.name} {c.detail or ''}"):
            assert tok in words, (c.name, tok)
    for c in report.failed:
        fix_lines = [ln for ln in out.splitlines() if ln.startswith("        fix: ")]
        assert any(c.fix.split()[0] in ln for ln in fix_lines), c.name
        assert all(t in words for t in SPLIT.split(c.fix)), c.name


def test_doctor_cli_at_80_columns_keeps_tokens_whole_and_counts_once(tmp_path):
    js = json.loads(cli("doctor", "--recipe", "recipes/tiny-moe-lora.yaml", "--json", columns=200).stdout)
    r = cli("doctor", "--recipe", "recipes/tiny-moe-lora.yaml")
    out = r.stdout
    assert "│" not in out and "┃" not in out, out   # no folded table columns
    words = tokens(out)
    failing = [c for c in js["checks"] if c["status"] == "fail"]
    for c in failing:
        for tok in SPLIT.split(f"{c['name']} {c['detail']} {c['fix'] or ''}"):
            if tok and not re.search(r"\d", tok):   # numbers (free memory, ...) may move between the two runs
                assert tok in words, (c["name"], tok, out)
    n = int(re.search(r"(\d+) fail", out).group(1))
    assert n == len(failing) == js["summary"]["fail"]
    if failing:
        assert r.returncode == 1 and re.search(rf"^{n} check\(s\) failed:", out, re.M), out
        # `up` on the same host prints the same count in its line and in the panel that stops it
        up = cli("up", "--host", "localhost", "--dry-run", "recipes/tiny-moe-lora.yaml", home=tmp_path)
        text = " ".join((up.stdout + up.stderr).split())
        counts = re.findall(r"(\d+) fail\b", text)
        assert up.returncode == 1 and counts and set(counts) == {str(n)}, text
        assert not re.search(r"found \d+ failing", text), text


def test_doctor_names_the_image_tag_for_this_cpu_without_all():
    """README: "Which tag a CPU takes: `ktdeploy doctor` names it" — in the default report, not only under --all
    (where cpu.variant's pass line is the only place that says it)."""
    js = json.loads(cli("doctor", "--json", columns=200).stdout)
    variant = next(c for c in js["checks"] if c["name"] == "cpu.variant")
    best = (variant.get("data") or {}).get("best")
    r = cli("doctor")
    head = r.stdout.splitlines()[:4]
    if best:
        assert any(ln.startswith(f"image for this CPU: ktsft:{best}") for ln in head), r.stdout
    else:
        assert not any(ln.startswith("image for this CPU") for ln in head), r.stdout
