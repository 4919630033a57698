"""core/eval/split.py: the held-out rows depend on the seed and the rows' contents only."""

import random

import pytest

from ktdeploy.core.errors import UsageError
from ktdeploy.core.eval import split as sp

ROWS = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(100)]


def test_the_same_rows_in_another_order_give_the_same_held_out_rows():
    s1 = sp.split_rows(ROWS, 0.1, seed=3)
    shuffled = ROWS[:]
    random.Random(1).shuffle(shuffled)
    s2 = sp.split_rows(shuffled, 0.1, seed=3)
    assert len(s1.held) == 10 and len(s1.train) == 90
    assert sorted(sp.canonical(ROWS[i]) for i in s1.held) == sorted(sp.canonical(shuffled[i]) for i in s2.held)
    assert set(s1.held).isdisjoint(s1.train) and sorted(s1.held + s1.train) == list(range(100))


def test_another_seed_holds_out_other_rows_and_a_count_is_a_count():
    assert sp.split_rows(ROWS, 0.1, 3).held != sp.split_rows(ROWS, 0.1, 4).held
    assert len(sp.split_rows(ROWS, 7, 0).held) == 7


def test_a_duplicated_row_is_held_out_with_its_twin():
    rows = ROWS[:20] + [ROWS[0]] * 3
    for seed in range(30):
        s = sp.split_rows(rows, 0.25, seed)
        train = {sp.canonical(rows[i]) for i in s.train}
        assert not train & {sp.canonical(rows[i]) for i in s.held}
        if 0 in s.held:
            assert s.duplicates_held == 3
            break
    else:
        pytest.fail("row 0 was never held out in 30 seeds")


@pytest.mark.parametrize("rows, holdout", [([{"a": 1}], 0.5), ([{"a": 1}] * 5, 0.5), (ROWS[:3], 3)])
def test_a_split_that_leaves_nothing_to_train_on_is_refused(rows, holdout):
    with pytest.raises(UsageError) as e:
        sp.split_rows(rows, holdout, 0)
    assert e.value.key == "deploy.eval.holdout"


def test_manifest_records_the_rule_and_the_sources_and_recognises_itself():
    srcs = {"d": {"file": "/data/d.json", "sha256": "ab" * 32, "rows": 100}}
    m = sp.manifest(seed=1, holdout=0.1, sources=srcs, splits={"d": sp.split_rows(ROWS, 0.1, 1)})
    assert m["datasets"]["d"]["held_rows"] == 10 and m["rule"] == sp.RULE
    assert sp.same_split(m, 1, 0.1, srcs)
    assert not sp.same_split(m, 2, 0.1, srcs) and not sp.same_split(m, 1, 0.1, {"d": {**srcs["d"], "rows": 99}})
