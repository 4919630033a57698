"""Property test: any document — mutated recipes, wrong types, garbage, unicode, huge numbers — ends in exit 0 or a
clean error (exit 2), never a traceback (exit 70 is the internal-error path)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ktdeploy.cli import main
from ktdeploy.core.recipe.render import dump_yaml
from tests.unit.core.recipe.conftest import _read

BASE = _read("qwen35-397b-bf16-lora.yaml")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["auto", "bf16", "fp8", "int8", "AMXINT4", "retain", "recompute", "/data/models", "checkpoint-5",
                     "ünïcødé 🚀", "../../etc", "$(touch /tmp/pwned)", ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                      max_leaves=8)


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


ALL_PATHS = list(_paths(BASE))


@st.composite
def mutated(draw):
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(ALL_PATHS))
        node = doc
        for p in path[:-1]:
            if not isinstance(node, dict) or p not in node:
                break
            node = node[p]
        else:
            if isinstance(node, dict):
                action = draw(st.sampled_from(["set", "delete", "rename"]))
                if action == "set":
                    node[path[-1]] = draw(values)
                elif action == "delete":
                    node.pop(path[-1], None)
                else:
                    node[draw(st.text(min_size=1, max_size=15))] = node.pop(path[-1], None)
    return doc


def _exit_code(tmp_path, text: str) -> int:
    p = tmp_path / "fuzz.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["check", str(p), "--json"])
    return exc.value.code


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=mutated())
def test_mutated_recipes_never_crash(tmp_path, capsys, doc):
    try:
        text = dump_yaml(doc)
    except Exception:
        return  # not representable as YAML at all
    assert _exit_code(tmp_path, text) in (0, 2)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "could not evaluate" not in out.out, "a rule crashed on a value type instead of reporting it"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=300),
                      st.builds(lambda a, b: a + b, st.just(dump_yaml(BASE)[:400]), st.text(max_size=50))))
def test_garbage_text_never_crashes(tmp_path, capsys, text):
    assert _exit_code(tmp_path, text) in (0, 2)
    assert "internal error" not in capsys.readouterr().err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(["train", "accelerate", "deploy"]), value=values)
def test_whole_section_replaced(tmp_path, capsys, section, value):
    doc = copy.deepcopy(BASE)
    doc[section] = value
    try:
        text = dump_yaml(doc)
    except Exception:
        return
    assert _exit_code(tmp_path, text) == 2 or isinstance(value, dict)
    assert "internal error" not in capsys.readouterr().err
