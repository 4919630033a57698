"""The train section means what LlamaFactory reads (OmegaConf, YAML 1.1), before and after render.

LlamaFactory loads the training YAML with OmegaConf.load (llamafactory/extras/arguments.py read_args);
the real omegaconf is the reference here.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

omegaconf = pytest.importorskip("omegaconf")
from omegaconf import OmegaConf  # noqa: E402

from ktdeploy.core.recipe.document import build  # noqa: E402
from ktdeploy.core.recipe.loader import lf_load, parse_recipe_text  # noqa: E402
from ktdeploy.core.recipe.render import render  # noqa: E402
from ktdeploy.core.recipe.rules import run_rules  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
TRICKY = ["off", "on", "yes", "no", "Off", "NO", "y", "n", "'off'", '"yes"', "1e-4", "1.0e-4", "0777", "0o17",
          "1:20", "2024-01-01", "~", "null", ".inf", "0x1F", "true", "'True'", "1_000", "12345678901234567890",
          "-0", "+1", "3.", "abc", "'1e-4'", "[off, 'on', 2]", "{a: no}", "'2024-01-01'", "0b101", "1_0.5"]


def lf_read(text: str):
    return OmegaConf.to_container(OmegaConf.load(io.StringIO(text)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(TRICKY), min_size=1, max_size=6))
def test_our_reader_is_omegaconfs(values):
    text = "".join(f"k{i}: {v}\n" for i, v in enumerate(values))
    assert lf_load(text) == lf_read(text)


BASE = (ROOT / "recipes" / "qwen35-397b-bf16-lora.yaml").read_text()


def _with(extra: dict[str, str]) -> str:
    base = BASE
    for k in extra:
        base = re.sub(rf"^  {k}:.*\n", "", base, flags=re.M)
    lines = "".join(f"  {k}: {v}\n" for k, v in extra.items())
    return base.replace("train:\n", "train:\n" + lines, 1)


KEYS = ["packing", "report_to", "save_strategy", "run_name", "plot_loss", "warmup_ratio", "seed"]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(TRICKY), min_size=1, max_size=4))
def test_render_keeps_lf_meaning(extra):
    text = _with(extra)
    recipe = build(parse_recipe_text(text, "r.yaml"))
    want = lf_read(text)["train"]
    assert recipe.train == want                        # check sees what LlamaFactory sees
    out = render(recipe)
    assert lf_read(out.train_yaml) == want             # and render does not change it


def test_packing_off_is_false():
    recipe = build(parse_recipe_text(_with({"packing": "off"}), "r.yaml"))
    assert recipe.train["packing"] is False
    assert "packing: false" in render(recipe).train_yaml


def test_quoted_off_stays_a_string_and_is_rejected():
    recipe = build(parse_recipe_text(_with({"overwrite_output_dir": "'off'"}), "r.yaml"))
    assert recipe.train["overwrite_output_dir"] == "off"
    errs = [f for f in run_rules(recipe) if f.severity == "error" and f.path == "train.overwrite_output_dir"]
    assert errs and errs[0].line
