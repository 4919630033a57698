"""README.md and every docs/ page are checked by running what they quote (tests/docs.py): the first command's
sample, the Quick start's lines and their exit codes, the checks the 397B dry run names, `status` of a failed
run, every `ktdeploy` option they show, the exit-code table, the test counts and the tiny model's size, and what
the test command needs. (The SSH session samples are run by tests/integration/test_walkthrough_cpu_only.py.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ktdeploy.cli import app
from tests.docs import compare, samples
from tests.fakes.tiny_model import WEIGHTS_BYTES

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(str(f.relative_to(REPO)) for f in (REPO / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- doc-(sample|figure): ([\w.-]+) -->")


def cli(*args, home: Path, cwd: Path = REPO, columns: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def _no_gpu_no_volumes() -> str | None:
    """Why this machine is not the README's: its sample is of a host without a GPU or /srv/ktdeploy."""
    if Path("/srv/ktdeploy").exists():
        return "/srv/ktdeploy exists here"
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return "this machine has a GPU"
    return None


def test_the_first_command_prints_the_readme_sample(tmp_path):
    why = _no_gpu_no_volumes()
    if why:
        pytest.skip(f"the README's sample is of a host without a GPU and without /srv/ktdeploy ({why})")
    r = cli("up", "--host", "localhost", home=tmp_path)
    sample = samples("docs/up.md")["first-command"]
    assert r.returncode == int(sample.rstrip().splitlines()[-1]), r.stdout + r.stderr
    # a CPU without AMX or AVX512-BF16 (CI machines are of either kind) also fails the LoRA-vs-CPU check
    compare("first-command", "docs/up.md", r.stdout + r.stderr, host_dependent=("recipe.weight_format_vs_isa",))
    st = cli("status", home=tmp_path)
    assert cli("down", home=tmp_path).returncode == 0
    st = cli("status", home=tmp_path)
    compare("status-failed", "docs/up.md", st.stdout, {str(tmp_path): "~/.local/share/ktdeploy"},
            host_dependent=("recipe.weight_format_vs_isa",))


def _quick_start(doc: str = "README.md", name: str = "quick-start") -> list[tuple[list[str], set[int]]]:
    out = []
    for line in samples(doc)[name].splitlines():
        command, _, comment = line.partition("#")
        codes = re.search(r"\(exit ([\d or]+)\)", comment)
        assert codes, f"README quick start: no (exit N) on {line!r}"
        argv = shlex.split(command)
        assert argv[0] == ".venv/bin/ktdeploy", line
        out.append((argv[1:], {int(c) for c in re.findall(r"\d+", codes.group(1))}))
    return out


@pytest.mark.parametrize("argv,codes", _quick_start(), ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else "")
def test_the_quick_start_runs_as_written(tmp_path, argv, codes):
    """Each line, as written, in a folder like the repository's (the README's relative paths resolve)."""
    for d in ("recipes", "examples", "bench"):
        (tmp_path / d).symlink_to(REPO / d)
    r = cli(*argv, home=tmp_path / "home", cwd=tmp_path)
    assert r.returncode in codes, (argv, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stdout + r.stderr


def test_the_cpu_only_path_ends_where_the_walkthrough_says(tmp_path):
    """The walkthrough's CPU-only end, line after line in one folder (serve uses what convert wrote)."""
    for d in ("recipes", "bench"):
        (tmp_path / d).symlink_to(REPO / d)
    for argv, codes in _quick_start("docs/walkthrough.md", "cpu-only-end"):
        r = cli(*argv, home=tmp_path / "home", cwd=tmp_path)
        assert r.returncode in codes, (argv, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stdout + r.stderr
    assert (tmp_path / "adapter-sglang" / "adapter_config.json").is_file()


def _paragraph(doc: str, name: str) -> str:
    text = (REPO / doc).read_text()
    start = text.index(f"<!-- doc-sample: {name} -->")
    return text[start:].split("\n\n", 1)[0]


def test_the_397b_dry_run_fails_the_checks_the_readme_names(tmp_path):
    para = " ".join(_paragraph("README.md", "quick-start-397b").split())
    named = set(re.findall(r"`([a-z]+\.[a-z_]+)`", para))
    r = cli("up", "--host", "gpu01", "recipes/qwen35-397b-bf16-lora.yaml", "--dry-run", "--facts",
            "examples/facts/gpu-h200-1gpu.json", home=tmp_path)
    assert r.returncode == 1 and "exits 1" in para
    failed = set(re.findall(r"^\s+fail\s+(\S+)", r.stderr, re.M))
    assert named == failed, (named, failed)


def _quoted_commands(doc: str) -> list[tuple[list[str], str]]:
    """Every `ktdeploy SUB ... --option` line of a doc's fenced blocks."""
    out = []
    in_block = False
    for line in (REPO / doc).read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        line = line.split("#")[0].replace("\\", " ")
        m = re.search(r"(?:^|[\s/$])ktdeploy((?:\s+[a-z][a-z-]*)+)((?:\s+\S+)*)", line)
        if m:
            out.append((m.group(1).split(), line))
    return out


def _command(words: list[str]):
    cmd = typer.main.get_command(app)
    for w in words:
        subs = getattr(cmd, "commands", None)
        if not subs or w not in subs:
            break
        cmd = subs[w]
    return cmd


@pytest.mark.parametrize("doc", DOCS)
def test_every_quoted_ktdeploy_option_exists(doc):
    """An option the docs show that the command no longer has (or never had) fails here."""
    bad = []
    quoted = _quoted_commands(doc)
    assert len(quoted) >= 5 or doc not in ("README.md", "docs/walkthrough.md", "docs/up.md"), quoted
    for words, line in quoted:
        cmd = _command(words)
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for opt in re.findall(r"(?<![\w/-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b", line.split("ktdeploy", 1)[1]):
            if opt not in opts and opt not in ("--help",):
                bad.append(f"{' '.join(words)}: {opt} ({line.strip()[:100]})")
    assert not bad, "\n".join(bad)


def test_the_exit_code_table_is_the_codes_ktdeploy_uses():
    from ktdeploy.core import errors

    text = (REPO / "README.md").read_text()
    table = text[text.index("## Exit codes"):]
    documented = {int(c) for c in re.findall(r"^\|\s*(\d+)\s*\|", table, re.M)}
    used = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and hasattr(c, "exit_code")}
    used |= {errors.EXIT_SYSTEM, errors.EXIT_INTERNAL, errors.EXIT_INTERRUPTED, errors.EXIT_PIPE, errors.EXIT_TERMINATED, 0}
    assert documented == used, (documented, used)


def _collected(tier: str, *extra: str) -> int:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra,
                        f"tests/{tier}"], capture_output=True, text=True, cwd=REPO, timeout=300)
    m = re.search(r"(\d+)/\d+ tests? collected", r.stdout) or re.search(r"(\d+) tests? collected", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    return int(m.group(1))


def test_the_test_counts_the_docs_give_are_current():
    """Within 10 %: a count the docs give may lag a few tests behind, never a tier's growth."""
    unit = _collected("unit")
    integration = _collected("integration", "-m", "docker")
    for doc in ("docs/testing.md", "docs/walkthrough.md"):
        text = " ".join((REPO / doc).read_text().split())
        u = re.search(r"<!-- doc-figure: unit-tests -->\D*?(\d+) tests", text)
        i = re.search(r"<!-- doc-figure: integration-tests -->\D*?(\d+) (?:passed|tests)", text)
        assert u and i, f"{doc}: the unit and integration counts are marked <!-- doc-figure: ... -->"
        assert abs(int(u.group(1)) - unit) <= 0.1 * unit, (doc, int(u.group(1)), unit)
        assert abs(int(i.group(1)) - integration) <= 0.1 * integration, (doc, int(i.group(1)), integration)


def test_the_tiny_models_size_is_the_real_builds():
    from ktdeploy.agent.tiny import SIZES
    from ktdeploy.core.checks.model import _expected_bytes

    text = (REPO / "docs/walkthrough.md").read_text()
    mb = float(re.search(r"<!-- doc-figure: tiny-weights -->([\d.]+) MB", text).group(1))
    assert abs(mb * 1e6 - WEIGHTS_BYTES) < 0.05e6, (mb, WEIGHTS_BYTES)
    assert abs(_expected_bytes(SIZES["small"].config_dict())[0] / WEIGHTS_BYTES - 1) < 0.01


@pytest.mark.parametrize("doc", ("README.md", "docs/walkthrough.md", "docs/testing.md"))
def test_the_docs_say_what_the_test_command_needs(doc):
    text = " ".join((REPO / doc).read_text().split())
    at = text.index("./run-tests.sh")
    for word in ("root", "apt-get", "Debian mirror", "debootstrap", "ssh-keygen", "rsync"):
        assert word in text[at:], (doc, word)


def test_the_samples_are_where_the_tests_look_for_them():
    assert {"quick-start", "recipe-example"} <= set(samples("README.md"))
    assert {"first-command", "status-failed"} <= set(samples("docs/up.md"))
    # the CPU-only path with the test double of the trainer image: a test's transcript, kept with the tests
    assert {"up-session", "up-again", "status-finished"} <= set(samples("docs/testing.md"))
    assert "fake-trainer" not in (REPO / "docs/up.md").read_text() + (REPO / "docs/walkthrough.md").read_text() \
        + (REPO / "README.md").read_text()
    assert json.dumps(samples("README.md"))


def _tests_text() -> str:
    return "\n".join(f.read_text() for f in (REPO / "tests").rglob("*.py"))


@pytest.mark.parametrize("doc", DOCS)
def test_every_sample_and_figure_of_every_page_is_checked(doc):
    """A `<!-- doc-sample/figure: NAME -->` on any page is checked by a test that names both the page and NAME:
    moving a sample to another page without its test, or adding one no test reads, fails here."""
    tests = _tests_text()
    unchecked = [f"{kind} {name}" for kind, name in MARKER.findall((REPO / doc).read_text())
                 if f'"{doc}"' not in tests or (f'"{name}"' not in tests and f"doc-{kind}: {name}" not in tests)]
    assert not unchecked, f"{doc}: no test reads {unchecked}"


def test_the_readme_stays_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 260
    for doc in DOCS:
        for target in re.findall(r"\]\(([\w./-]+)(?:#[\w-]*)?\)", (REPO / doc).read_text()):
            assert ((REPO / doc).parent / target).exists(), (doc, target)


def test_the_readme_recipe_example_checks_clean(tmp_path):
    """The README's recipe is complete: `ktdeploy check` accepts it as written."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(samples("README.md")["recipe-example"] + "\n")
    assert 20 <= len(recipe.read_text().splitlines()) <= 35
    r = cli("check", str(recipe), home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
