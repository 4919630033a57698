"""LlamaFactory's own generation metrics, computed as its ``do_predict`` computes them (pure; the libraries it uses).

``llamafactory/train/sft/metric.py`` (llamafactory-kt 0.9.6.dev0, ``ComputeSimilarity``), per sample: ROUGE-1/2/L
F-scores from ``rouge_chinese.Rouge`` on the jieba words (0 when either side has no word), BLEU-4 from nltk's
``sentence_bleu`` on the characters with ``SmoothingFunction().method3``, each x100 rounded to 4 places; the total is
the plain mean over samples (``np.mean``). ktdeploy adds exact match (the stripped answer equals the stripped
reference: 100 or 0). The three libraries are the optional ``eval`` extra (``pip install 'ktdeploy[eval]'``):
jieba alone is ~19 MB.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from ktdeploy.core.errors import UsageError

METRICS = ("bleu-4", "rouge-1", "rouge-2", "rouge-l", "exact_match")
EXTRA_FIX = "Install the evaluation extra: pip install 'ktdeploy[eval]' (jieba, rouge-chinese, nltk: LlamaFactory's metrics)."


@cache
def _libs(cache_dir: str | None) -> tuple[Any, Any, Any, Any]:
    try:
        import jieba
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
        from rouge_chinese import Rouge
    except ImportError as e:
        raise UsageError(f"scoring needs LlamaFactory's metric libraries; {e.name or e} is not installed",
                         key="eval", fix=EXTRA_FIX) from None
    # jieba caches its parsed dictionary (marshal) in the temp folder, shared with every local user; a cache another
    # user planted there would be loaded: keep it in a folder of ours, or build the dictionary in memory each time
    # (its failed cache write is then only logged, below CRITICAL)
    jieba.setLogLevel(logging.WARNING if cache_dir else logging.CRITICAL)
    jieba.dt.tmp_dir = cache_dir or "/nonexistent/ktdeploy-no-jieba-cache"
    return jieba, sentence_bleu, SmoothingFunction().method3, Rouge


def check_available() -> None:
    """UsageError naming the extra when LlamaFactory's metric libraries are missing (before any request is sent)."""
    try:
        import jieba  # noqa: F401
        import nltk.translate.bleu_score  # noqa: F401
        import rouge_chinese  # noqa: F401
    except ImportError as e:
        raise UsageError(f"`ktdeploy eval` scores with LlamaFactory's metric libraries; {e.name or e} is not "
                         "installed", key="eval", fix=EXTRA_FIX) from None


def similarity(pred: str, label: str, cache_dir: str | None = None) -> dict[str, float]:
    """One sample's BLEU-4 and ROUGE-1/2/L, exactly as ComputeSimilarity scores a decoded (prediction, label)."""
    jieba, sentence_bleu, smooth, rouge_cls = _libs(cache_dir)
    hypothesis = list(jieba.cut(pred))
    reference = list(jieba.cut(label))
    if len(" ".join(hypothesis).split()) == 0 or len(" ".join(reference).split()) == 0:
        result = {"rouge-1": {"f": 0.0}, "rouge-2": {"f": 0.0}, "rouge-l": {"f": 0.0}}
    else:
        result = rouge_cls().get_scores(" ".join(hypothesis), " ".join(reference))[0]
    out = {k: round(v["f"] * 100, 4) for k, v in result.items()}
    out["bleu-4"] = round(sentence_bleu([list(label)], list(pred), smoothing_function=smooth) * 100, 4)
    return out


def exact_match(pred: str, label: str) -> float:
    return 100.0 if pred.strip() == label.strip() else 0.0


def score(pred: str, label: str, cache_dir: str | None = None) -> dict[str, float]:
    return {**similarity(pred, label, cache_dir), "exact_match": exact_match(pred, label)}


def mean_scores(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The total over samples: the plain mean of each metric (LlamaFactory's ``_dump``); {} for no sample."""
    if not rows:
        return {}
    return {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in METRICS if all(k in r for r in rows)}
