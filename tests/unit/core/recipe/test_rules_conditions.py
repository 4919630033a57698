"""lf.conditions / lf.ddp_backend (issue #49): the stack's conditions read from its code, evaluated as it does.

The extractor (tools/gen_arg_conditions.py) runs on code written like the stack's; the catalogue it generated from the
locked wheels holds the four classes plain `check` was looser on; `holds` evaluates an atom as Python does in the
stack (truthiness, `is None`, equality with the YAML value LlamaFactory receives).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ktdeploy.core.recipe import catalog_data as cd
from ktdeploy.core.recipe.rules_conditions import holds

TOOLS = Path(__file__).resolve().parents[4] / "tools"


def _gac():
    spec = importlib.util.spec_from_file_location("gen_arg_conditions", TOOLS / "gen_arg_conditions.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOURCE = '''
class Args:
    def __post_init__(self):
        self.warmup_steps = self.warmup_ratio
        self.mode = Mode(self.mode)
        if self.kind != "lora":
            if self.use_dora:
                raise ValueError("`use_dora` is only valid for LoRA training.")
            if self.ratio is not None:
                raise ValueError(f"ratio {self.ratio} is LoRA only")
        if self.workers == 0 and self.prefetch is not None:
            raise ValueError("prefetch needs workers")
        if self.backend != Engine.HF:
            raise ValueError("only huggingface")
        if self.effort not in {"xhigh", "low"}:
            raise ValueError("effort")
        if self.warmup_steps < 0:
            raise ValueError("rewritten first: not decidable from the text")
        if self.a or self.b:
            raise ValueError("an `or`: left out")
        if len(self.a) > 1:
            raise ValueError("a call: left out")
        if self.a == self.b:
            raise ValueError("two fields")
        if self.a == len(self.b):
            raise ValueError("a field and a call: left out")
        assert self.bits in [None, 8, 4], "bits"
        assert self.a or self.b, "an assert of an `or`: left out"
'''
FIELDS = {"kind", "use_dora", "ratio", "workers", "prefetch", "backend", "effort", "warmup_steps", "warmup_ratio",
          "a", "b", "mode", "bits"}


def test_the_extractor_keeps_conjunctions_of_field_tests_and_leaves_the_rest_out():
    gac = _gac()
    found = gac.conditions(SOURCE, {"__post_init__": "Args"}, FIELDS, {"Engine": {"HF": "huggingface"}})
    got = {msg: atoms for atoms, msg, _fn in found}
    assert got == {
        "`use_dora` is only valid for LoRA training.": (("kind", "!=", "lora"), ("use_dora", "truthy", None)),
        "ratio {ratio} is LoRA only": (("kind", "!=", "lora"), ("ratio", "is not None", None)),
        "prefetch needs workers": (("workers", "==", 0), ("prefetch", "is not None", None)),
        "only huggingface": (("backend", "!=", "huggingface"),),
        "effort": (("effort", "not in", ("xhigh", "low")),),
        "rewritten first: not decidable from the text": (("warmup_steps", "<", 0),),
        "two fields": (("a", "field ==", "b"),),
        "bits": (("bits", "not in", (None, 8, 4)),),    # an assert raises when its test does not hold
    }
    assert {fn for _a, _m, fn in found} == {"Args.__post_init__"}
    # a field the code rewrites is dropped by the generator; converting it with its own enum is not a rewrite
    assert gac.rewritten(SOURCE, {"Mode"}) == {"warmup_steps"}


def test_the_generated_catalogue_holds_the_four_classes_from_the_wheels():
    conditions = {msg: atoms for atoms, msg, _where in cd.ARG_CONDITIONS}
    for switch in ("use_dora", "use_rslora", "pissa_init"):
        assert conditions[f"`{switch}` is only valid for LoRA training."] == (
            ("finetuning_type", "!=", "lora"), (switch, "truthy", None))
    assert conditions["`loraplus_lr_ratio` is only valid for LoRA training."][1] == \
        ("loraplus_lr_ratio", "is not None", None)
    prefetch = next(a for m, a in conditions.items() if m.startswith("--dataloader_prefetch_factor"))
    assert prefetch == (("dataloader_num_workers", "==", 0), ("dataloader_prefetch_factor", "is not None", None))
    assert conditions["vLLM/SGLang backend is only available for API, CLI and Web."] == \
        (("infer_backend", "!=", "huggingface"),)
    assert cd.TRAIN_DEFAULTS["infer_backend"] == "huggingface"
    assert "nccl" in cd.FIELD_CHOICES["ddp_backend"] and "ucc" not in cd.FIELD_CHOICES["ddp_backend"]
    # no rewritten field: warmup_steps is set from warmup_ratio before _validate_args checks it
    assert all(a[0] != "warmup_steps" for atoms, _m, _w in cd.ARG_CONDITIONS for a in atoms)


@pytest.mark.parametrize("op,value,literal,expected", [
    ("truthy", "false", None, True),        # a string is truthy in the stack (types.catalog reports its type)
    ("truthy", 0, None, False),
    ("falsy", None, None, True),
    ("is not None", False, None, True),     # loraplus_lr_ratio: false is refused ('is not None')
    ("==", 0.0, 0, True),
    ("!=", "HuggingFace", "huggingface", True),
    ("not in", "high", ("xhigh", "medium", "low"), True),
    ("in", "low", ("xhigh", "medium", "low"), True),
    (">", 0.1, 1e-6, True),
    (">", "0.1", 1e-6, None),               # the stack raises TypeError there: another refusal, not this one
])
def test_an_atom_holds_as_python_evaluates_it_in_the_stack(op, value, literal, expected):
    assert holds(op, value, literal) is expected


def test_the_docs_count_the_generated_conditions():
    text = (Path(__file__).resolve().parents[4] / "docs" / "stack-rules.md").read_text()
    assert f"`catalog_data.ARG_CONDITIONS` ({len(cd.ARG_CONDITIONS)} conditions)" in " ".join(text.split())


def test_a_two_field_condition_reads_the_other_field_and_names_the_one_set():
    from ktdeploy.core.recipe import load_recipe, validate

    root = Path(__file__).resolve().parents[4]
    r = load_recipe(root / "recipes" / "tiny-moe-lora.yaml", ["train.image_min_pixels=1000000"])
    found = [f for f in validate(r) if f.rule == "lf.conditions"]
    assert [f.path for f in found] == ["train.image_min_pixels"]
    assert "image_min_pixels: 1000000" in found[0].message and "cannot be smaller" in found[0].message
    assert "change image_min_pixels" in found[0].fix
    ok = load_recipe(root / "recipes" / "tiny-moe-lora.yaml", ["train.image_min_pixels=589824"])
    assert not [f for f in validate(ok) if f.rule == "lf.conditions"]
