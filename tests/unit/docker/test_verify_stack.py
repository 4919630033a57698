"""docker/verify_stack.py's verdicts (it runs inside the image at build time)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("verify_stack", ROOT / "docker" / "verify_stack.py")
vs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vs)

WAIVED = "compressed-tensors 0.15.0.1 requires transformers, which is not installed."


def test_clean_pip_check_passes():
    assert vs.judge_pip_check("No broken requirements found.\n", {}) == ([], [])


def test_waived_line_is_a_note_not_an_error():
    errors, notes = vs.judge_pip_check(WAIVED + "\n", {WAIVED: "fork provides it"})
    assert errors == [] and len(notes) == 1


def test_unwaived_line_fails():
    errors, _ = vs.judge_pip_check(WAIVED + "\npeft-kt 0.18.1 has requirement torch>=1.13, but you have nothing.\n",
                                   {WAIVED: "x"})
    assert len(errors) == 1 and "peft-kt" in errors[0]


def test_stale_waiver_fails():
    errors, _ = vs.judge_pip_check("No broken requirements found.\n", {WAIVED: "x"})
    assert len(errors) == 1 and "stale" in errors[0]


def test_lock_mismatch_and_strays_are_reported():
    pins = {"torch": "2.9.1", "numpy": "2.3.0"}
    have = {"torch": "2.9.0", "pip": "23.0", "transformers": "5.15.1"}
    errors = vs.check_lock(pins, have, extra_allowed=set())
    assert any("torch is 2.9.0" in e for e in errors)
    assert any("numpy==2.3.0 is not installed" in e for e in errors)
    assert any("transformers==5.15.1 is installed but not in the lock" in e for e in errors)
    assert not any("pip" in e.split()[1] for e in errors)


def test_excluded_upstream_distribution_fails_the_build():
    errors, _ = vs.check_expectations({}, {"transformers": "the fork provides it"}, {"transformers": "5.15.1"})
    assert errors and "excluded distribution transformers==5.15.1" in errors[0]


def test_version_table_is_asserted_against_what_python_imports():
    # json is importable here and has a __version__: a wrong expectation must fail, a right one pass.
    import json

    errors, table = vs.check_expectations({"module": {"json": "0.0-wrong"}}, {}, {})
    assert errors and "json" in errors[0]
    errors, table = vs.check_expectations({"module": {"json": json.__version__},
                                          "attr": {"json": "JSONDecoder"}}, {}, {})
    assert errors == [] and len(table) == 2
    errors, _ = vs.check_expectations({"attr": {"json": "KTransformersPlugin"}}, {}, {})
    assert errors and "KTransformersPlugin" in errors[0]


def test_missing_distribution_fails():
    errors, _ = vs.check_expectations({"dist": {"sglang-kt": "0.7.2"}}, {}, {"torch": "2.9.1"})
    assert errors == ["distribution sglang-kt: installed nothing, want 0.7.2"]


def test_manifest_cache_gives_the_same_lines_and_skips_unchanged_files(tmp_path):
    import os

    root = tmp_path / "venv"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "a.py").write_text("a = 1\n")
    (root / "lib" / "b file.bin").write_bytes(b"\0" * 4096)
    os.symlink("a.py", root / "lib" / "link.py")
    cache = tmp_path / "cache"
    cache.mkdir()
    plain = vs.manifest_lines((root,))
    assert vs.manifest_lines((root,), cache=cache) == plain          # first run fills the cache
    rows = (cache / "manifest-cache.tsv").read_text().splitlines()
    assert len(rows) == 2 and all(r.endswith(("a.py", "b file.bin")) for r in rows)
    # a cached hash is trusted while size and mtime match: plant a false one to see it is not re-read
    fake = "f" * 64
    (cache / "manifest-cache.tsv").write_text("".join(
        " ".join([*r.split(" ", 3)[:2], fake, r.split(" ", 3)[3]]) + "\n" for r in rows))
    assert all(ln.startswith(fake) for ln in vs.manifest_lines((root,), cache=cache) if not ln.startswith("link"))
    # ... and a file the light stage rewrote (new mtime) is hashed again
    (cache / "manifest-cache.tsv").write_text("".join(
        " ".join([*r.split(" ", 3)[:2], fake, r.split(" ", 3)[3]]) + "\n" for r in rows))
    st = (root / "lib" / "a.py").stat()
    os.utime(root / "lib" / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    got = {ln.split(" ", 2)[2]: ln for ln in vs.manifest_lines((root,), cache=cache) if not ln.startswith("link")}
    assert got[str(root / "lib" / "a.py")] in plain and got[str(root / "lib" / "b file.bin")].startswith(fake)


def test_unwritable_manifest_cache_is_not_an_error(tmp_path):
    root = tmp_path / "venv"
    root.mkdir()
    (root / "x").write_text("x")
    missing = tmp_path / "no-such-dir"
    assert vs.manifest_lines((root,), cache=missing) == vs.manifest_lines((root,))


def test_files_the_light_stage_brought_are_always_hashed(tmp_path):
    """light is built reproducibly: its RECORD or an unchecked-hash .pyc can change with size and mtime kept,
    so the build lists its files in fresh-paths.txt and they never come from the cache."""
    root = tmp_path / "venv"
    root.mkdir()
    (root / "RECORD").write_text("one\n")
    (root / "torch.so").write_text("stack\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    plain = vs.manifest_lines((root,))
    st = (root / "RECORD").stat()
    fake = "f" * 64
    (cache / "manifest-cache.tsv").write_text(f"{st.st_size} {st.st_mtime_ns} {fake} {root / 'RECORD'}\n")
    (cache / "fresh-paths.txt").write_text(f"{root / 'RECORD'}\n")
    assert vs.manifest_lines((root,), cache=cache) == plain
    assert [r.split(" ", 3)[3] for r in (cache / "manifest-cache.tsv").read_text().splitlines()] == \
        [str(root / "torch.so")]                                     # only the stack's file is kept
