"""The samples README.md and docs/walkthrough.md quote, read back so a test can run the command and compare.

A sample is the fenced block right after an HTML comment ``<!-- doc-sample: NAME -->`` (invisible on GitHub). A
test runs what the sample shows and compares *the lines that matter* — the stage and step lines (``✓ ✗ → -``),
``done:``/``WARNING``/``CheckFailed:`` lines, doctor's ``fail NAME`` lines, `status`'s fields — after
``normalize`` has replaced what differs from run to run (host address, run ids, hashes, times, rates, paths
under the test's root), so a sample can no longer go stale: a changed message fails the test with both blocks.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = re.compile(r"<!-- doc-sample: ([\w.-]+) -->\s*\n```[\w-]*\n(.*?)\n```", re.S)

RULES: list[tuple[str, str]] = [
    (r"ssh://[\w.-]+@[\w.:\[\]-]+:\d+", "HOST"),
    (r"\b\d{8}-\d{6}-[\w.-]+?-[0-9a-f]{6}\b", "RUN"),
    (r"(ktd-[a-z0-9-]+?)-[0-9a-f]{8}\b", r"\1-HASH"),
    (r"ktdeploy/fake-trainer:[0-9a-f]{12}", "ktdeploy/fake-trainer:TAG"),
    (r"sha256:[0-9a-f]{12,64}", "sha256:ID"),
    (r"docker \d+\.\d+[\w.+~-]*", "docker VERSION"),
    (r"since [^\s)]+", "since TIME"),
    (r"\b\d+(\.\d+)? tok/s", "N tok/s"),
    (r"\b\d+(\.\d+)? s per step, \d+ tokens/s", "N s per step, N tokens/s"),   # FOLLOW's plan: the host's figures
    (r"loss \d+\.\d+", "loss N"),
    (r"eta \d+:\d\d:\d\d", "eta T"),
    (r"\b\d+ (pass|warn|fail|skip|waived)\b", r"N \1"),
    (r"\(\d+ (waived|left to)", r"(N \1"),
    (r"/\S*?/runs/RUN", "…/runs/RUN"),
    (r"…/…/", "…/"),
    (r"\(runtimes: [^)]*\)", "(runtimes: …)"),
]


def samples(doc: str) -> dict[str, str]:
    """{name: block text} of one document (README.md, docs/walkthrough.md)."""
    return {m.group(1): m.group(2) for m in SAMPLE.finditer((REPO / doc).read_text())}


def normalize(text: str, root: str | dict[str, str] | None = None) -> str:
    """``root``: the test's folder shown as /v in a sample, or {path: what the sample shows}."""
    subs = root if isinstance(root, dict) else ({root: "/v"} if root else {})
    for path, shown in sorted(subs.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, shown)
    for pat, rep in RULES:
        text = re.sub(pat, rep, text)
    return text


MATTER = re.compile(r"^(✓|✗|→|- |done:|WARNING|CPU-only|CheckFailed:|StepError:|UsageError:|\S+\s+host )"
                    r"|^\s+fail  |^  (failed|fix|failed checks|container|serving|record|note|to repair|waived|lock|"
                    r"image check|containers)\b")
# progress lines, and FOLLOW's ETA lines: how many a run prints depends on timing
PROGRESS = re.compile(r"^\s*step \d+/\d+|^→ FOLLOW: ETA ")
FAIL_LINE = re.compile(r"^(\s*fail\s+\S+)\s.*$")   # doctor's `fail NAME detail`: the name matters, the detail is the host's


def _unwrapped(text: str) -> list[str]:
    """The lines of ``text`` with a terminal's wrapping undone: a line indented deeper than the line it follows,
    that starts no line of its own (MATTER), continues it."""
    out: list[str] = []
    for ln in text.splitlines():
        if out and ln.startswith(" ") and not MATTER.match(ln) and not PROGRESS.match(ln) \
                and len(ln) - len(ln.lstrip()) > len(out[-1]) - len(out[-1].lstrip()):
            out[-1] = out[-1].rstrip() + " " + ln.strip()
        else:
            out.append(ln)
    return out


def matter(text: str, root: str | dict[str, str] | None = None) -> list[str]:
    """The lines of ``text`` that a sample must match, normalized and unwrapped, without the `$ command` lines
    and the progress lines (how many a run prints depends on timing)."""
    out = []
    for ln in _unwrapped(text):
        if ln.startswith("$ ") or not MATTER.match(ln) or PROGRESS.match(ln):
            continue
        ln = FAIL_LINE.sub(r"\1", normalize(" ".join(ln.split()), root))
        out.append(ln)
    return out


def _without(lines: list[str], checks: tuple[str, ...]) -> list[str]:
    """``lines`` without doctor's `fail NAME` lines of ``checks`` and without their names in `failed checks:`."""
    out = []
    for ln in lines:
        if ln.strip() in {f"fail {n}" for n in checks}:
            continue
        head, sep, names = ln.partition("failed checks: ")
        if sep:
            ln = head + sep + ", ".join(n for n in names.split(", ") if n not in checks)
        out.append(ln)
    return out


def compare(name: str, doc: str, actual: str, root: str | dict[str, str] | None = None,
            host_dependent: tuple[str, ...] = ()) -> None:
    """Assert the sample ``name`` of ``doc`` shows the lines that matter of ``actual`` (a command's output).
    ``host_dependent``: doctor checks whose `fail NAME` line depends on this machine's CPU (the doc says so beside
    the sample): left out of both sides.
    KTDEPLOY_DOC_SAMPLES=DIR writes this run's output there instead (DIR/NAME.txt, the ``root`` paths replaced):
    a run that makes the samples, not a test."""
    import os

    out_dir = os.environ.get("KTDEPLOY_DOC_SAMPLES")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        subs = root if isinstance(root, dict) else ({root: "/v"} if root else {})
        for path, shown in sorted(subs.items(), key=lambda kv: -len(kv[0])):
            actual = actual.replace(path, shown)
        (Path(out_dir) / f"{name}.txt").write_text(actual)
        return
    have = samples(doc)
    if name not in have:
        raise AssertionError(f"{doc} has no sample {name!r} (<!-- doc-sample: {name} --> before a fenced block); "
                             f"this run printed:\n{normalize(actual, root)}")
    want = _without(matter(have[name], root), host_dependent)
    got = _without(matter(actual, root), host_dependent)
    if want != got:
        diff = "\n".join(difflib.unified_diff(want, got, f"{doc}: {name}", "this run", lineterm=""))
        raise AssertionError(f"{doc}'s sample {name!r} is stale:\n{diff}\n\nthis run (normalized):\n"
                             + normalize(actual, root))
