"""core/eval/summary.py: per side and the difference on the samples both answered."""

from ktdeploy.core.eval.summary import Answer, SampleResult, below, summarize


def _r(i, tuned, base, ref="r"):
    res = SampleResult(id=str(i), prompt="p", reference=ref)
    res.answers["tuned"] = tuned
    res.answers["base"] = base
    return res


def _a(em, lat=1.0, tokens=10):
    return Answer(text="x", latency_s=lat, completion_tokens=tokens,
                  scores={"bleu-4": em, "rouge-1": em, "rouge-2": em, "rouge-l": em, "exact_match": em})


def test_delta_is_over_samples_both_sides_answered_and_failures_are_counted():
    rows = [_r(0, _a(100), _a(0)), _r(1, _a(50), Answer(error="timeout: no answer within 1 s", latency_s=1.0)),
            _r(2, Answer(error="refused: HTTP 500 x"), _a(20))]
    s = summarize(rows, meta={"url": "u"})
    assert s["url"] == "u" and s["samples"] == 3
    assert s["tuned"]["answered"] == 2 and s["tuned"]["failed"] == 1 and s["tuned"]["errors"] == {"refused": 1}
    assert s["tuned"]["metrics"]["exact_match"] == 75.0 and s["base"]["metrics"]["exact_match"] == 10.0
    assert s["delta"] == {"paired": 1, **dict.fromkeys(("bleu-4", "rouge-1", "rouge-2", "rouge-l", "exact_match"), 100.0)}
    assert s["tuned"]["tokens_per_s"] == 10.0 and s["tuned"]["latency_s"]["p50"] == 1.0
    assert rows[0].to_json()["delta"]["exact_match"] == 100.0 and "delta" not in rows[1].to_json()


def test_fail_below_judges_the_tuned_metric():
    s = summarize([_r(0, _a(40), _a(0))])
    assert below(s, "rouge-l", 50).startswith("tuned rouge-l 40.00 < ")
    assert below(s, "rouge-l", 40) is None
    assert "no rouge-l score" in below(summarize([_r(0, Answer(error="x"), _a(1))]), "rouge-l", 1)


def test_a_sample_without_reference_is_answered_but_not_scored():
    r = SampleResult(id="0", prompt="p", reference=None)
    r.answers["tuned"] = Answer(text="t", latency_s=0.5)
    s = summarize([r])
    assert s["no_reference"] == 1 and s["tuned"]["answered"] == 1 and s["tuned"]["scored"] == 0
    assert s["tuned"]["metrics"] == {} and "base" not in s and "delta" not in s
