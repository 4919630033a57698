"""controller/eval_run.py against a real HTTP server on 127.0.0.1 (tests/fakes/openai_server.py) that misbehaves on
purpose where LlamaFactory's own server (tests/integration/test_eval_api.py) cannot: refusals, malformed answers,
answers past the timeout, a server that goes away mid-run. Each failure is recorded on its sample; the run goes on."""

from __future__ import annotations

import threading
import time

import pytest

from ktdeploy.controller.eval_run import Endpoint, Settings, evaluate, list_models, mean_reference_logprob, stream_chat
from ktdeploy.core.eval.dataset import Sample
from ktdeploy.core.eval.summary import summarize
from tests.fakes.openai_server import OpenAIDouble

SAMPLES = [Sample(id=f"d:{i}", messages=({"role": "user", "content": f"word{i}"},), reference=f"word{i}")
           for i in range(8)]


@pytest.fixture
def server():
    made: list[OpenAIDouble] = []

    def make(**kw):
        made.append(OpenAIDouble(**kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def _settings(tmp_path, **kw):
    return Settings(**{"concurrency": 3, "timeout_s": 5.0, "logprobs": False, "cache_dir": str(tmp_path), **kw})


def test_every_sample_is_asked_of_both_sides_with_their_model_names(server, tmp_path):
    srv = server()
    seen = []
    res = evaluate(SAMPLES, {"tuned": Endpoint(srv.url, "m:lora", "k3y"), "base": Endpoint(srv.url, "m")},
                   _settings(tmp_path), on_progress=seen.append)
    assert [r.id for r in res] == [s.id for s in SAMPLES]
    assert sorted(b["model"] for b in srv.requests) == ["m"] * 8 + ["m:lora"] * 8
    assert all(r.answers["tuned"].scores["exact_match"] == 100.0 for r in res)
    assert [p.done for p in seen] == list(range(1, 9)) and seen[-1].eta_s == 0
    assert all(b["temperature"] == 0.0 and b["max_tokens"] == 256 for b in srv.requests)


def test_a_refused_request_is_recorded_and_the_run_goes_on(server, tmp_path):
    srv = server(mode="refuse-odd")
    res = evaluate(SAMPLES, {"tuned": Endpoint(srv.url, "m")}, _settings(tmp_path, concurrency=1))
    errors = [r.answers["tuned"].error for r in res]
    assert sum(e is not None for e in errors) == 4 and all(e.startswith("refused: HTTP 500") for e in errors if e)
    s = summarize(res)
    assert s["tuned"]["failed"] == 4 and s["tuned"]["scored"] == 4 and s["tuned"]["metrics"]["exact_match"] == 100.0


def test_a_malformed_answer_is_recorded_as_malformed(server, tmp_path):
    srv = server(mode="malformed")
    res = evaluate(SAMPLES[:2], {"tuned": Endpoint(srv.url, "m")}, _settings(tmp_path))
    assert all(r.answers["tuned"].error == "malformed: no choices[0].message.content in the answer" for r in res)


def test_an_answer_slower_than_the_timeout_fails_that_sample_only_and_is_sent_once(server, tmp_path):
    srv = server(mode="slow", delay=3.0)
    t0 = time.monotonic()
    res = evaluate(SAMPLES[:2], {"tuned": Endpoint(srv.url, "m")}, _settings(tmp_path, timeout_s=0.5))
    assert time.monotonic() - t0 < 2.5
    assert all(r.answers["tuned"].error == "timeout: no answer within 0.5 s" for r in res)
    assert len(srv.requests) == 2   # a request the server received is never sent again


def test_a_server_gone_mid_run_fails_the_rest_and_the_run_ends(server, tmp_path):
    srv = server(mode="slow", delay=0.2)
    stopper = threading.Timer(0.5, srv.stop)
    stopper.start()
    res = evaluate(SAMPLES, {"tuned": Endpoint(srv.url, "m")}, _settings(tmp_path, concurrency=1))
    stopper.join()
    errors = [r.answers["tuned"].error for r in res]
    assert errors[0] is None and errors[-1] is not None and errors[-1].startswith("connection:")
    assert len(res) == len(SAMPLES)


def test_stream_chat_and_models(server):
    srv = server(model="served")
    assert list_models(Endpoint(srv.url, "")) == ["served"]
    s = Settings(timeout_s=5.0)
    assert "".join(stream_chat(Endpoint(srv.url, "served"), [{"role": "user", "content": "hello you"}], s)) == "hello you"
    assert srv.requests[-1]["stream"] is True


def test_the_key_travels_in_the_authorization_header_only():
    ep = Endpoint("http://x/v1", "m", "s3cret")
    assert ep.headers() == {"Authorization": "Bearer s3cret"} and "s3cret" not in repr(ep)


def test_reference_logprob_is_the_mean_over_the_references_tokens():
    data = {"choices": [{"logprobs": {"text_offset": [0, 3, 6, 8], "token_logprobs": [None, -1.0, -0.5, -1.5]}}]}
    assert mean_reference_logprob(data, 6) == -1.0
    assert mean_reference_logprob({"choices": []}, 0) is None


@pytest.mark.parametrize("url", ["notaurl", "ftp://h/v1", "http:///v1", "http://h:99999/v1", "http://u:p@h/v1",
                                 "http://h/v1\nX"])
def test_an_endpoint_that_is_no_http_url_or_holds_credentials_is_a_usage_error(url):
    from ktdeploy.core.errors import UsageError

    with pytest.raises(UsageError) as e:
        Endpoint(url, "m")
    assert e.value.key == "--endpoint"


def test_a_server_that_never_answers_is_exit_3_after_the_files_are_written(tmp_path):
    import socket

    from ktdeploy.controller.eval_stage import run_eval
    from ktdeploy.core.errors import ConnectError
    from ktdeploy.core.eval.dataset import Loaded

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again: nothing listens there
    with pytest.raises(ConnectError) as e:
        run_eval(Loaded(samples=SAMPLES[:2]), {"tuned": Endpoint(f"http://127.0.0.1:{port}/v1", "m")},
                 _settings(tmp_path), tmp_path, {})
    assert e.value.exit_code == 3 and (tmp_path / "samples.jsonl").is_file()
    with pytest.raises(ConnectError):
        list_models(Endpoint(f"http://127.0.0.1:{port}/v1", ""))
