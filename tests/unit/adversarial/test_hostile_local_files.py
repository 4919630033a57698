"""Hostile local files and values that an outside probe (stop 27) found getting past the promises of
docs/security.md: an alias bomb through a train/accelerate --set, a FIFO or a malformed status.json in a run
record, rich markup in a path or record value, links inside a training output, a 24 KB fused file asking for
15 M tensors, a deeply nested JSON, a tiny-model that replaced or wrote through existing data files, and URL
passwords printed by `status --all`, findings and `convert`. Each test fails on the code before the fix."""

from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path

import pytest

from ktdeploy.agent import convert as cv
from ktdeploy.core.recipe.loader import MAX_BYTES
from tests.unit.adversarial.harness import SECRET, invoke, problems
from tests.unit.agent.conftest import write_safetensors

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes/tiny-moe-lora.yaml"

BOMB = "\n".join(["a: &a [x,x,x,x,x,x,x,x,x]"] +
                 [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)])


@pytest.fixture
def st_writer():
    return write_safetensors


def _flat(out: str) -> str:
    return " ".join(out.replace("│", " ").split())


@pytest.mark.parametrize("section", ["train", "accelerate"])
def test_an_alias_bomb_in_a_yaml11_override_is_refused_at_once(tmp_path, section):
    t0, c0 = time.monotonic(), time.process_time()
    rc, out, _ = invoke(["check", str(RECIPE), "--set", f"{section}.foo={BOMB}"], cwd=tmp_path)
    assert rc == 2 and "alias bomb" in _flat(out) and not problems(rc, out), out
    # CPU time bounds the work (a loaded CI machine stretches the wall clock); the wall bound catches a hang
    assert time.process_time() - c0 < 5 and time.monotonic() - t0 < 60


# ---------------------------------------------------------------- run records

def _record(home: Path, rid: str, status: str | None) -> Path:
    d = home / "runs" / rid
    d.mkdir(parents=True)
    if status is None:
        os.mkfifo(d / "status.json")  # nobody ever writes it
    else:
        (d / "status.json").write_text(status)
    return d


GOOD = {"id": "r-good", "host": "ssh://u:" + SECRET + "@127.0.0.1:1", "recipe": "https://u:" + SECRET + "@h/[/oops]",
        "state": "running", "container": "ktd-a", "serve_container": "ktd-a-serve", "output_dir": "/o",
        "created": 1.0}


def test_a_fifo_status_json_never_blocks_and_the_others_still_list(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    _record(tmp_path / "home", "r-fifo", None)
    _record(tmp_path / "home", "r-good", json.dumps(GOOD))
    rc, out, secs = invoke(["status", "--all"], cwd=tmp_path)
    assert rc == 0 and "r-good" in out and not problems(rc, out), out
    for cmd in ("status", "logs", "down"):
        rc, out, secs = invoke([cmd, "--run", "r-fifo"], cwd=tmp_path)
        assert rc == 6 and "not a regular file" in _flat(out) and secs < 5, (cmd, out)


@pytest.mark.parametrize("status", [
    "{}",
    json.dumps({**GOOD, "host": 5}),
    json.dumps({**GOOD, "container": 5}),
    json.dumps({**GOOD, "output_dir": ["x"]}),
    json.dumps({**GOOD, "container": "../../../../victim/pwn"}),
    "[" * 100_000 + "]" * 100_000,
])
def test_a_malformed_status_json_is_a_record_error_not_a_crash(tmp_path, monkeypatch, status):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    _record(tmp_path / "home", "r1", status)
    for cmd in ("status", "logs", "down"):
        rc, out, _ = invoke([cmd, "--run", "r1"], cwd=tmp_path)
        assert rc == 6 and "r1" in out and not problems(rc, out), (cmd, out)
    assert not (tmp_path / "victim").exists()


def test_record_values_are_text_not_markup_and_their_passwords_are_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path / "home"))
    # the recipe (single-run views) and the error (the --all table's reason) both hold rich's closing tag
    _record(tmp_path / "home", "r-good", json.dumps({**GOOD, "error": "boom [/oops] at https://u:" + SECRET + "@h"}))
    for args in (["status", "--all"], ["status", "--all", "--json"], ["status", "--run", "r-good"],
                 ["status", "--run", "r-good", "--json"]):
        rc, out, _ = invoke(args, cwd=tmp_path)
        assert rc == 0 and not problems(rc, out), (args, out)
        assert "[/oops]" in out and "u:***@" in out, (args, out)


def test_paths_holding_markup_are_printed_as_they_are(tmp_path, st_writer):
    odd = tmp_path / "mk" / "["
    odd.mkdir(parents=True)
    recipe = odd / "x].yaml"  # the path holds "[/x]", rich's closing tag
    recipe.write_text(RECIPE.read_text())
    rc, out, _ = invoke(["check", str(recipe)], cwd=tmp_path)
    assert rc == 0 and "[/x].yaml" in _flat(out).replace(" ", "") and not problems(rc, out), out
    rc, out, _ = invoke(["render", str(RECIPE), "-o", str(tmp_path / "rend[/x]")], cwd=tmp_path)
    assert rc == 0 and str(tmp_path / "rend[/x]" / "train.yaml") in _flat(out).replace(" ", ""), out
    from tests.unit.agent.test_convert import make_output

    src = make_output(tmp_path / "out", st_writer)
    rc, out, _ = invoke(["convert", str(src), "-o", str(tmp_path / "lor[b]")], cwd=tmp_path)
    assert rc == 0 and "lor[b]" in out and not problems(rc, out), out


# ---------------------------------------------------------------- convert

def test_full_convert_refuses_a_link_in_the_training_output(tmp_path):
    from tests.fakes import kt_layout

    kt_layout.write_full_model(str(tmp_path / "full"))
    (tmp_path / "secret").write_text("TOP SECRET KEY")
    (tmp_path / "full" / "tokenizer.json").unlink(missing_ok=True)
    (tmp_path / "full" / "tokenizer.json").symlink_to(tmp_path / "secret")
    with pytest.raises(cv.ConvertError, match="symbolic link"):
        cv.convert(tmp_path / "full", tmp_path / "full-out")
    assert not (tmp_path / "full-out").exists()


def test_lora_convert_refuses_a_linked_artifact(tmp_path, st_writer):
    from tests.unit.agent.test_convert import make_output

    src = make_output(tmp_path / "out", st_writer)
    fused = src / "fused_expert_lora.safetensors"
    os.rename(fused, tmp_path / "elsewhere.safetensors")
    fused.symlink_to(tmp_path / "elsewhere.safetensors")
    with pytest.raises(cv.ConvertError, match="symbolic link"):
        cv.convert(src, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def _fused(path: Path, layers: int, a_shape: list[int], b_shape: list[int]) -> None:
    """A fused expert file of zero-byte tensors: a few KB that name as many expert slices as the shapes say."""
    header = {f"layers.{L}.experts.{p}_lora_{w}": {"dtype": "F32", "shape": a_shape if w == "a" else b_shape,
                                                   "data_offsets": [0, 0]}
              for L in range(layers) for p in ("gate", "up", "down") for w in ("a", "b")}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.mark.parametrize("a_shape,b_shape,words", [
    ([65536, 0, 8], [65536, 8, 0], "no rank"),               # rank 0: 15.7 M slices of nothing
    ([65536, 1, 0], [65536, 0, 1], "per-expert tensors"),    # rank 1, zero-wide: the same count
])
def test_a_small_fused_file_cannot_ask_for_millions_of_tensors(tmp_path, a_shape, b_shape, words):
    src = tmp_path / "out"
    src.mkdir()
    _fused(src / cv.FUSED, 40, a_shape, b_shape)
    (src / cv.CONFIG).write_text(json.dumps({"r": a_shape[1], "lora_alpha": 16}))
    t0, c0 = time.monotonic(), time.process_time()
    with pytest.raises(cv.ConvertError, match=words):
        cv.convert(src, tmp_path / "adapter", verify_manifest=False)
    # CPU time bounds the work (a loaded CI machine stretches the wall clock); the wall bound catches a hang
    assert time.process_time() - c0 < 5 and time.monotonic() - t0 < 60


def test_a_deeply_nested_safetensors_header_is_a_format_error(tmp_path):
    from ktdeploy.agent import safetensors_io as st

    raw = b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(st.SafetensorsFormatError, match="not JSON"):
        st.read_header(tmp_path / "x.safetensors")


def test_convert_keeps_a_url_password_out_of_the_adapter_and_publishes_it_readable(tmp_path, st_writer):
    from tests.unit.agent.test_convert import make_output

    src = make_output(tmp_path / "out", st_writer)
    s = cv.convert(src, tmp_path / "adapter", base_model=f"https://u:{SECRET}@hub.example/base")
    assert SECRET not in str(s.base_model_name_or_path)
    for p in (tmp_path / "adapter").iterdir():
        assert SECRET.encode() not in p.read_bytes(), p.name
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "adapter").stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700


# ---------------------------------------------------------------- tiny-model's dataset, dataset rows, findings

def test_tiny_dataset_never_replaces_or_writes_through_existing_files(tmp_path):
    from ktdeploy.agent.tiny import build_dataset
    from ktdeploy.core.errors import UsageError

    data = tmp_path / "data"
    build_dataset(data, 8)
    before = (data / "tiny_sft.json").read_bytes()
    with pytest.raises(UsageError, match="already holds"):
        build_dataset(data, 8, seed=5)
    assert (data / "tiny_sft.json").read_bytes() == before
    build_dataset(data, 8, seed=5, overwrite=True)
    assert (data / "tiny_sft.json").read_bytes() != before

    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "registry.json").write_text('{"mine": {"file_name": "m.json"}}')
    (other / "dataset_info.json").symlink_to(tmp_path / "registry.json")
    with pytest.raises(UsageError, match="symbolic link"):
        build_dataset(other, 8)
    assert json.loads((tmp_path / "registry.json").read_text()) == {"mine": {"file_name": "m.json"}}
    (other / "dataset_info.json").unlink()
    (other / "dataset_info.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        build_dataset(other, 8)
    (other / "dataset_info.json").write_text('{"mine": {"file_name": "m.json"}}')
    build_dataset(other, 8)
    assert set(json.loads((other / "dataset_info.json").read_text())) == {"mine", "tiny_sft", "tiny_sft_long"}


def test_a_deeply_nested_dataset_row_is_a_problem_not_a_crash():
    from ktdeploy.core.facts.data_listing import first_rows

    for name in ("d.jsonl", "d.json"):
        rows, why = first_rows("[" * 30_000 + "]" * 30_000, True, name)
        assert rows is None and "nested too deeply" in why, (name, why)


def test_findings_stay_one_screen_and_hide_passwords(tmp_path):
    # as many unknown keys and as long a value as fit under the loader's size cap (a bigger file is refused unread)
    text = RECIPE.read_text().replace("train:\n", "train:\n" + "".join(f"  zz_unknown_{i}: 1\n" for i in range(1_500)), 1)
    text = re.sub(r"(?m)^  template: .*$", f"  template: 'https://u:{SECRET}@h/{'x' * 30_000}'", text, count=1)
    assert len(text.encode()) < MAX_BYTES
    (tmp_path / "r.yaml").write_text(text)
    for args in (["check", "r.yaml"], ["check", "r.yaml", "--json"]):
        rc, out, _ = invoke(args, cwd=tmp_path)
        assert rc == 2 and not problems(rc, out), (args, out[-2000:])
        if "--json" not in args:
            assert len(out) < 64_000 and "more (" in out, len(out)
