"""ktdeploy.core.safeio: each helper against the exact example of issue 16 that it fixes."""

from __future__ import annotations

import json
import os
import time

import pytest

from ktdeploy.core.errors import RecipeError, RunRecordError, UsageError
from ktdeploy.core.safeio import inside, load_json, norm_path, read_text, redact, redact_host, run_id_name, write_file


@pytest.mark.parametrize("spelling", ["//srv/m", "/srv/./m", "/srv/m/", "/srv/x/../m", "///srv//m//."])
def test_every_spelling_of_the_model_volume_contains_the_output(spelling):
    assert norm_path(spelling) == "/srv/m"
    assert inside("/srv/m/out", spelling) and inside(spelling + "/out", "/srv/m")
    assert not inside("/srv/model-other", spelling)


def test_symlinks_are_resolved_on_the_host(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "models")
    assert inside(str(tmp_path / "alias" / "out"), str(tmp_path / "models"), host=True)
    assert not inside(str(tmp_path / "alias" / "out"), str(tmp_path / "models"))


def test_recipe_rule_refuses_output_volume_inside_double_slash_model_volume(tmp_path):
    from ktdeploy.core.recipe import load_recipe, validate
    from tests.unit.core.recipe.conftest import RECIPES

    text = (RECIPES / "tiny-moe-lora.yaml").read_text().replace("    model: models\n", "    model: //srv/ktdeploy\n")
    p = tmp_path / "r.yaml"
    p.write_text(text)
    findings = validate(load_recipe(p))
    assert any(f.path == "deploy.volumes.output" and f.severity == "error" for f in findings)


def test_write_never_follows_a_link_out_of_the_folder(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    d = tmp_path / "out"
    d.mkdir()
    (d / "launch.sh").symlink_to(victim)
    (d / "dangling").symlink_to(tmp_path / "created-outside")
    for name in ("launch.sh", "dangling"):
        with pytest.raises(UsageError):
            write_file(d, name, "x", overwrite=True)
    assert victim.read_text() == "keep" and not (tmp_path / "created-outside").exists()
    (tmp_path / "linkdir").symlink_to(tmp_path)
    with pytest.raises(UsageError):
        write_file(tmp_path / "linkdir", "f", "x")


def test_write_refuses_overwrite_and_empty_folder(tmp_path):
    write_file(tmp_path, "a", "1")
    with pytest.raises(RunRecordError):
        write_file(tmp_path, "a", "2")
    assert (tmp_path / "a").read_text() == "1"
    write_file(tmp_path, "a", "2", overwrite=True, mode=0o755)
    assert (tmp_path / "a").read_text() == "2" and os.stat(tmp_path / "a").st_mode & 0o777 == 0o755
    with pytest.raises(UsageError):
        write_file("", "a", "x")
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no temp file left behind


def test_fifo_and_dev_zero_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for p in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(UsageError):
            read_text(p)
    assert time.monotonic() - t0 < 2


def test_json_reader_bounded(tmp_path):
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"a": "x" * 2000}))
    with pytest.raises(UsageError):
        load_json(p, limit=1000)
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UsageError):
        load_json(p)


def test_yaml_alias_bomb_refused_fast(tmp_path):
    from ktdeploy.core.recipe import load_recipe

    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False))
    assert len(bomb) < 500
    p = tmp_path / "bomb.yaml"
    p.write_text(bomb)
    t0, c0 = time.monotonic(), time.process_time()
    with pytest.raises(RecipeError, match="alias"):
        load_recipe(p)
    # CPU time bounds the work (a loaded CI machine stretches the wall clock); the wall bound catches a hang
    assert time.process_time() - c0 < 5 and time.monotonic() - t0 < 60


def test_400_digit_number_refused(tmp_path):
    from ktdeploy.core.recipe import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text("train:\n  cutoff_len: " + "9" * 400 + "\n")
    with pytest.raises(RecipeError, match="digits"):
        load_recipe(p)


@pytest.mark.parametrize("text,want", [
    ("ssh://user:PW@host", "ssh://user:***@host"),
    ("ssh://a b:PW:x@y@h:2/p", "ssh://a b:***@h:2/p"),
    ("cannot reach ssh://u:PW@h:1", "cannot reach ssh://u:***@h:1"),
    ("ssh://u@h", "ssh://u@h"),
])
def test_redact(text, want):
    assert redact(text) == want
    assert "PW" not in redact_host(text)


def _redact_by_the_regex(s: str) -> str:
    """The redaction as it was written first (a regex finds each scheme): the oracle for the linear finder."""
    import re

    from ktdeploy.core.safeio import _redact_authority

    out, i = [], 0
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://", s):
        if m.start() < i:
            continue
        end = m.end()
        while end < len(s) and s[end] not in "/?#\n":
            end += 1
        authority = s[m.end():end]
        if _redact_authority(authority) != authority:
            out.append(s[i:m.end()] + _redact_authority(authority))
            i = end
    out.append(s[i:])
    return "".join(out)


def test_redaction_finds_every_scheme_the_regex_found():
    import random

    rng = random.Random(7)
    alphabet = "ab1+.-:/@?#\n xZ"
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        text += rng.choice(["", "ssh://u:PW@h", "a1+.b://x:y@z", "1://p:q@r"])
        assert redact(text) == _redact_by_the_regex(text), text


def test_redaction_time_is_linear_in_the_text():
    """A long run of scheme characters (a record's 64 KB note, a log line): the regex took 24 s on 64 KB."""
    for text in ("x" * (1 << 20), "a1" * (1 << 19), "x" * (1 << 20) + "://u:PW@h", "a://" * (1 << 18)):
        c0 = time.process_time()
        out = redact(text)
        assert time.process_time() - c0 < 2, len(text)
        assert "PW" not in out


def test_redact_host_without_scheme():
    assert redact_host("user:PW@host:22") == "user:***@host:22"
    assert redact_host("host:22") == "host:22"


@pytest.mark.parametrize("rid", ["../../x", "/etc", "..", "a/b", "", "x/../y", "-rf", "a\nb"])
def test_run_id_is_a_name(rid):
    with pytest.raises(UsageError):
        run_id_name(rid)


def test_down_run_traversal_refused(tmp_path, monkeypatch):
    from ktdeploy.controller.runs import latest_run

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "status.json").write_text('{"id": "x"}')
    (tmp_path / "home" / "runs").mkdir(parents=True)
    with pytest.raises(UsageError):
        latest_run(run_id="../../x", root=tmp_path / "home" / "runs")


def test_one_corrupt_record_does_not_hide_the_others(tmp_path):
    from ktdeploy.controller.runs import all_runs

    for name, text in (("good", '{"created": 1}'), ("bad", "{nope"), ("list", "[1]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "status.json").write_text(text)
    assert [r.id for r in all_runs(tmp_path)] == ["good"]


def test_records_never_hold_a_password(tmp_path):
    from ktdeploy.controller.runs import RunRecord

    rec = RunRecord.create("r", root=tmp_path)
    rec.set_status("planned", host="ssh://u:PW@h")
    rec.event("x", host="ssh://u:PW@h")
    for f in ("status.json", "events.jsonl"):
        assert "PW" not in (rec.path / f).read_text()


def test_interrupted_up_leaves_a_consistent_record(tmp_path, monkeypatch):
    """Ctrl-C during preflight: the record says 'stopped' (not a stale 'planned'), and the CLI exits 130."""
    import ktdeploy.controller.up_host
    from ktdeploy.cli import main
    from ktdeploy.controller.runs import all_runs
    from tests.unit.core.recipe.conftest import RECIPES

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ktdeploy.controller.up_host, "run_doctor", interrupted)   # up's facts + doctor phase
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        main(["up", "--dry-run", "--host", "localhost", str(RECIPES / "tiny-moe-lora.yaml")])
    assert exc.value.code == 130
    (rec,) = all_runs(tmp_path / "runs")
    assert rec.status()["state"] == "stopped"
    assert rec.events()[-1]["event"] == "interrupted"


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "- " * 3000 + "x\n", "{a: " * 2000 + "1" + "}" * 2000])
def test_deep_yaml_refused_before_parsing_at_any_call_depth(tmp_path, text):
    """The refusal may not depend on how deep the caller's stack already is (RecursionError did)."""
    from ktdeploy.core.recipe import load_recipe

    p = tmp_path / "deep.yaml"
    p.write_text(text)

    def nested(n):
        return nested(n - 1) if n else load_recipe(p)

    t0, c0 = time.monotonic(), time.process_time()
    for depth in (0, 700):
        with pytest.raises(RecipeError, match="nested"):
            nested(depth)
    # CPU time bounds the work (a loaded CI machine stretches the wall clock); the wall bound catches a hang
    assert time.process_time() - c0 < 5 and time.monotonic() - t0 < 60


def test_image_save_never_writes_through_a_dangling_link(tmp_path):
    """`image save -o LINK`: refused before docker is asked anything (docker save would follow the link)."""
    from ktdeploy.controller.images.build import save

    link = tmp_path / "images.tar"
    link.symlink_to(tmp_path / "elsewhere.tar")
    with pytest.raises(UsageError, match="already exists"):
        save(["ktsft:does-not-exist"], link)
    assert not (tmp_path / "elsewhere.tar").exists()
