"""The resource model as terms (core/sizing/memory_terms.py): each term a named function whose docstring says where
its shape comes from, composed by estimate() into one list in the order the plan shows; a term is written as it
always was in `ktdeploy plan --json`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.sizing import memory_terms as mt
from ktdeploy.core.sizing.estimate import MEASURED, estimate
from ktdeploy.core.sizing.model_config import load_model_config
from ktdeploy.core.sizing.setup import setup_from
from ktdeploy.core.sizing.terms import Term
from tests.unit.core.sizing.test_estimate import _dicts

MODELS = Path(__file__).resolve().parents[4] / "recipes" / "models"
TERM_FNS = [*mt.HOST_TERMS, mt.tokenization_workers, *mt.GPU_TERMS, mt.allocator_slack, mt.cuda_context,
            *mt.DISK_TERMS]


@pytest.fixture(scope="module")
def arch():
    return load_model_config(MODELS / "Qwen3-235B-A22B-Instruct-2507.json")


@pytest.mark.parametrize("fn", TERM_FNS, ids=lambda f: f.__name__)
def test_each_term_says_where_it_comes_from(fn):
    assert (fn.__doc__ or "").strip(), f"{fn.__name__}: say the source of the term's shape"


@pytest.mark.parametrize("knobs", [{}, {"num_processes": 1}, {"finetuning_type": "full"},
                                   {"disable_gradient_checkpointing": True}, {"kt_weight_lifecycle": "ephemeral"}])
def test_the_plan_is_its_terms_in_order(arch, knobs):
    train, acc = _dicts(**knobs)
    plan = estimate((train, acc), arch)
    m = mt.Model(setup_from(train, acc), arch, MEASURED)
    fns = [*mt.HOST_TERMS, *mt.GPU_TERMS, *mt.DISK_TERMS]
    singles = [t for t in (fn(m) for fn in fns) if t is not None]
    assert [t.name for t in plan.breakdown if t.name not in ("tokenization workers (before training)",
                                                             "allocator slack", "CUDA context and workspaces")] == \
        [t.name for t in singles]
    assert [t.resource for t in plan.breakdown] == sorted((t.resource for t in plan.breakdown),
                                                          key=["host", "gpu", "disk"].index)
    assert plan.host_memory_gib == sum(t.value for t in plan.breakdown if t.resource == "host")


def test_a_term_is_written_as_the_plan_always_wrote_it():
    t = Term("host", "KT work pools", 1.23456, "scratch")
    assert t.gib == t.value and t.to_json() == {"resource": "host", "name": "KT work pools", "gib": 1.235,
                                                "explanation": "scratch"}
