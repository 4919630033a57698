"""LlamaFactory's own generation metric, run as written: ``ComputeSimilarity`` (``llamafactory/train/sft/metric.py``)
read with ``ast`` from the locked llamafactory-kt 0.9.6.dev0 wheel and executed on decoded texts, to hold
``ktdeploy.core.eval.score`` to the numbers LlamaFactory's ``do_predict`` reports (tests/unit/core/eval/test_score.py).

The wheel comes from ``.wheelhouse/full`` or is `pip download`-ed (checked against docker/requirements/full.lock)
into the git-ignored ``.cache/lf-metric-oracle``. The only stand-in is the tokenizer (LlamaFactory decodes token ids
first): one id per character, 0 as the padding it drops — so the texts it scores are the texts given.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from locked_wheels import ROOT, locked_wheel

DIST, VERSION = "llamafactory-kt", "0.9.6.dev0"
WHEEL = "llamafactory_kt-0.9.6.dev0-py3-none-any.whl"
METRIC = "llamafactory/train/sft/metric.py"
CACHE = ROOT / ".cache" / "lf-metric-oracle"
IGNORE_INDEX = -100   # llamafactory.extras.constants


class CharTokenizer:
    pad_token_id = 0

    @staticmethod
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    @staticmethod
    def batch_decode(rows: Any, skip_special_tokens: bool = True) -> list[str]:
        return ["".join(chr(int(i)) for i in row if int(i) != 0) for row in rows]


@dataclass
class EvalPrediction:
    predictions: Any
    label_ids: Any


def compute_similarity_class() -> Any:
    import jieba
    import numpy as np
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    wheel = locked_wheel(DIST, WHEEL, CACHE, [ROOT / ".wheelhouse" / "full" / WHEEL], version=VERSION)
    with zipfile.ZipFile(wheel) as z:
        text = z.read(METRIC).decode()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "ComputeSimilarity")
    ns: dict[str, Any] = {"dataclass": dataclass, "Optional": Optional, "np": np, "IGNORE_INDEX": IGNORE_INDEX,
                          "numpify": np.asarray, "jieba": jieba, "sentence_bleu": sentence_bleu,
                          "SmoothingFunction": SmoothingFunction, "Rouge": Rouge}
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"<{WHEEL}:{METRIC}>", "exec"), ns)  # noqa: S102
    return ns["ComputeSimilarity"]


def _ids(texts: Sequence[str]) -> Any:
    import numpy as np

    width = max([len(t) for t in texts] + [1])
    return np.array([CharTokenizer.encode(t) + [IGNORE_INDEX] * (width - len(t)) for t in texts], dtype=np.int64)


def llamafactory_scores(pairs: Sequence[tuple[str, str]]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(per-sample scores, the means) of (prediction, label) pairs, by LlamaFactory's own ComputeSimilarity."""
    metric = compute_similarity_class()(tokenizer=CharTokenizer())
    metric(EvalPrediction(_ids([p for p, _ in pairs]), _ids([lab for _, lab in pairs])), compute_result=False)
    per_sample = {k: list(v) for k, v in metric.score_dict.items()}
    return per_sample, metric._dump()
