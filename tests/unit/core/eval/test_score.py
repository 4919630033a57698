"""core/eval/score.py against LlamaFactory's own ComputeSimilarity (tools/lf_metric_oracle.py: its code from the
locked llamafactory-kt wheel, run as written): the same per-sample numbers and the same means."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ktdeploy.core.errors import UsageError
from ktdeploy.core.eval import score as sc

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools"))
import lf_metric_oracle as oracle  # noqa: E402

PAIRS = [
    ("The capital of France is Paris.", "Paris is the capital of France."),
    ("hello world", "hello world"),
    ("北京是中国的首都。", "中国的首都是北京"),
    ("", "a reference"),
    ("an answer", ""),
    ("   ", "   "),
    ("1 2 3 4 5 6", "1 2 3 4 5 7"),
    ("mixed 中文 and English 123", "mixed English and 中文 123!"),
    ("x" * 300, "x" * 299 + "y"),
]


@pytest.fixture(scope="module")
def lf():
    try:
        return oracle.llamafactory_scores(PAIRS)
    except (SystemExit, Exception) as err:  # noqa: BLE001 - no wheel: say so, never pass silently
        pytest.skip(f"llamafactory-kt {oracle.VERSION} wheel not available: {err}")


def test_every_sample_scores_as_llamafactory_scores_it(lf, tmp_path):
    per_sample, _ = lf
    ours = [sc.similarity(p, r, str(tmp_path)) for p, r in PAIRS]
    for k in ("bleu-4", "rouge-1", "rouge-2", "rouge-l"):
        assert [o[k] for o in ours] == per_sample[k], k


def test_the_totals_are_llamafactorys_means(lf, tmp_path):
    _, means = lf
    ours = sc.mean_scores([sc.score(p, r, str(tmp_path)) for p, r in PAIRS])
    for k, v in means.items():
        assert ours[k] == pytest.approx(v, abs=1e-4), k


def test_exact_match_compares_stripped_text():
    assert sc.exact_match(" Paris \n", "Paris") == 100.0 and sc.exact_match("paris", "Paris") == 0.0
    assert sc.mean_scores([]) == {}


def test_jieba_never_reads_a_cache_from_the_shared_temp_folder(tmp_path, monkeypatch):
    import jieba

    sc.similarity("a b", "a b", str(tmp_path))
    assert jieba.dt.tmp_dir == str(tmp_path)


def test_a_missing_metric_library_is_a_usage_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "rouge_chinese", None)
    with pytest.raises(UsageError) as e:
        sc.check_available()
    assert "ktdeploy[eval]" in e.value.fix and e.value.exit_code == 2
