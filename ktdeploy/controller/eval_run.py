"""`ktdeploy eval` and `ktdeploy chat`: the OpenAI-compatible API of a served model, through httpx.

One ``httpx.Client`` per evaluation, a timeout per request, bounded concurrency (a thread pool of ``concurrency``
workers). Retries are httpx's own transport retries, which repeat only a connection that was never made
(``ConnectError``/``ConnectTimeout``: nothing reached the server, so repeating is safe for any request); a request
the server received is never sent again — a generation is not idempotent. A refused, slow or malformed answer is
recorded on its sample and the run goes on. Answers are read up to ``MAX_BODY`` bytes. The API key comes from the
environment variable the recipe names (``deploy.serve.api_key_env``) and travels only in the Authorization header.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.errors import ConnectError, UsageError
from ktdeploy.core.eval.dataset import Sample
from ktdeploy.core.eval.score import score
from ktdeploy.core.eval.summary import Answer, SampleResult
from ktdeploy.core.safeio import parse_json, printable

MAX_BODY = 8 << 20              # one answer: far above any completion a max_tokens bound allows
CONNECT_RETRIES = 2
LOGPROB_UNSUPPORTED = (400, 404, 405, 422, 501)


@dataclass(frozen=True)
class Endpoint:
    """A served model: the API's base URL (``…/v1``), the model name requests carry, the key (never shown)."""

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_url(self.url)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Settings:
    max_tokens: int = 256
    temperature: float = 0.0
    timeout_s: float = 120.0
    concurrency: int = 4
    logprobs: bool = True          # ask for the reference's log-likelihood where the server gives it
    cache_dir: str | None = None   # jieba's dictionary cache (a private folder)


@dataclass
class Progress:
    done: int
    total: int
    elapsed_s: float
    failed: int

    @property
    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)


def check_url(url: str) -> None:
    """An http(s) URL with a host and no credentials in it (a key goes in a variable, never a URL); else UsageError."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port_ok = u.port is None or 0 < u.port < 65536
    except ValueError:
        u, port_ok = None, False
    if u is None or u.scheme not in ("http", "https") or not u.hostname or not port_ok or any(c in url for c in " \n\r\t"):
        raise UsageError(f"{printable(url, 120)} is not an http(s) URL of an API", key="--endpoint",
                         fix="Give the server's OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1.")
    if u.username or u.password:
        raise UsageError("the endpoint URL holds credentials", key="--endpoint",
                         fix="Drop them from the URL; name the key's variable with --api-key-env (or the recipe's "
                             "deploy.serve.api_key_env).")


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:   # a dependency of ktdeploy: only a broken install lacks it
        raise UsageError("httpx is not installed", fix="pip install httpx (a dependency of ktdeploy)") from None
    return httpx


def client(timeout_s: float) -> Any:
    httpx = _httpx()
    return httpx.Client(transport=httpx.HTTPTransport(retries=CONNECT_RETRIES),
                        timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)), follow_redirects=False)


def _read(resp: Any) -> bytes:
    body = b""
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) > MAX_BODY:
            raise ValueError(f"answer larger than {MAX_BODY >> 20} MiB")
    return body


def _failure(err: BaseException, timeout_s: float) -> str:
    httpx = _httpx()
    if isinstance(err, httpx.TimeoutException):
        return f"timeout: no answer within {timeout_s:g} s"
    if isinstance(err, httpx.TransportError):
        return f"connection: {printable(err, 160) or type(err).__name__}"
    return f"malformed: {printable(err, 160)}"


def post_json(c: Any, ep: Endpoint, path: str, body: dict[str, Any], timeout_s: float) -> tuple[int, Any]:
    """(HTTP status, the parsed JSON answer); raises httpx's errors or ValueError for an answer that is no JSON."""
    with c.stream("POST", ep.url.rstrip("/") + path, json=body, headers=ep.headers(), timeout=timeout_s) as resp:
        raw = _read(resp)
    if resp.status_code != 200:
        return resp.status_code, raw[:300].decode("utf-8", "replace")
    return 200, parse_json(raw)


def chat_body(ep: Endpoint, messages: Sequence[dict[str, str]], s: Settings, stream: bool = False) -> dict[str, Any]:
    return {"model": ep.model, "messages": list(messages), "max_tokens": s.max_tokens, "temperature": s.temperature,
            "stream": stream}


def parse_chat(data: Any) -> tuple[str, int | None]:
    """(the answer's text, completion tokens) from a chat completion; ValueError for anything else."""
    try:
        text = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].message.content in the answer") from None
    if not isinstance(text, str):
        raise ValueError("choices[0].message.content is not text")
    usage = data.get("usage") if isinstance(data, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return text, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None


def ask(c: Any, ep: Endpoint, messages: Sequence[dict[str, str]], s: Settings) -> Answer:
    t0 = time.perf_counter()
    try:
        code, data = post_json(c, ep, "/chat/completions", chat_body(ep, messages, s), s.timeout_s)
    except Exception as e:   # httpx's errors and a malformed answer: recorded on the sample, the run goes on
        return Answer(error=_failure(e, s.timeout_s), latency_s=round(time.perf_counter() - t0, 3))
    latency = round(time.perf_counter() - t0, 3)
    if code != 200:
        return Answer(error=f"refused: HTTP {code} {printable(data, 160)}", latency_s=latency)
    try:
        text, tokens = parse_chat(data)
    except ValueError as e:
        return Answer(error=f"malformed: {e}", latency_s=latency)
    return Answer(text=text, latency_s=latency, completion_tokens=tokens)


def reference_logprob(c: Any, ep: Endpoint, sample: Sample, s: Settings) -> tuple[float | None, bool]:
    """(mean token log-likelihood of the reference, the server gives logprobs). The legacy completions API with
    ``echo`` scores the prompt's own tokens: the user turn followed by the reference, as plain text (no chat
    template); the reference's tokens are those whose offset is past the prompt."""
    if sample.reference is None:
        return None, True
    prompt = sample.prompt_text()
    body = {"model": ep.model, "prompt": prompt + sample.reference, "echo": True, "logprobs": 1, "max_tokens": 1,
            "temperature": 0.0}
    try:
        code, data = post_json(c, ep, "/completions", body, s.timeout_s)
    except Exception:
        return None, True
    if code in LOGPROB_UNSUPPORTED:
        return None, False
    return mean_reference_logprob(data, len(prompt)), True


def mean_reference_logprob(data: Any, prompt_chars: int) -> float | None:
    """The mean of ``token_logprobs`` over the tokens at or past ``prompt_chars`` (OpenAI's completions format)."""
    try:
        lp = data["choices"][0]["logprobs"]
        pairs = list(zip(lp["text_offset"], lp["token_logprobs"], strict=False))
    except (KeyError, IndexError, TypeError):
        return None
    vals = [v for off, v in pairs if isinstance(off, int) and off >= prompt_chars and isinstance(v, int | float)]
    return round(sum(vals) / len(vals), 4) if vals else None


def _one(c: Any, sides: dict[str, Endpoint], sample: Sample, s: Settings, logprobs: dict[str, bool]) -> SampleResult:
    res = SampleResult(id=sample.id, prompt=sample.prompt_text(), reference=sample.reference)
    for side, ep in sides.items():
        a = ask(c, ep, sample.messages, s)
        if a.text is not None and sample.reference is not None:
            a.scores = score(a.text, sample.reference, s.cache_dir)
        if s.logprobs and logprobs.get(side, True) and a.text is not None:
            a.ref_logprob, logprobs[side] = reference_logprob(c, ep, sample, s)
        res.answers[side] = a
    return res


def evaluate(samples: Sequence[Sample], sides: dict[str, Endpoint], s: Settings,
             on_progress: Callable[[Progress], None] | None = None) -> list[SampleResult]:
    """Every sample against every side (``tuned``, and ``base`` when given), ``s.concurrency`` at a time; the results
    in the samples' order. Ctrl-C returns at once (exit 130, as every Ctrl-C): the workers are daemon threads, so a
    request still in flight (up to --timeout seconds) never holds the exit back, and they start nothing more."""
    out: dict[int, SampleResult] = {}
    logprobs: dict[str, bool] = {}
    todo: queue.SimpleQueue[tuple[int, Sample]] = queue.SimpleQueue()
    done: queue.SimpleQueue[tuple[int, SampleResult | None, BaseException | None]] = queue.SimpleQueue()
    for i, smp in enumerate(samples):
        todo.put((i, smp))
    stop = threading.Event()

    def work(c: Any) -> None:
        while not stop.is_set():
            try:
                i, smp = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, _one(c, sides, smp, s, logprobs), None))
            except BaseException as err:   # noqa: BLE001 - handed to the caller's thread, raised there
                done.put((i, None, err))

    t0, failed = time.monotonic(), 0
    with client(s.timeout_s) as c:
        for n in range(max(1, min(s.concurrency, len(samples)))):
            threading.Thread(target=work, args=(c,), name=f"ktdeploy-eval-{n}", daemon=True).start()
        try:
            while len(out) < len(samples):
                try:
                    i, r, err = done.get(timeout=0.5)   # a timeout: Ctrl-C is delivered between waits
                except queue.Empty:
                    continue
                if err is not None:
                    raise err
                assert r is not None
                out[i] = r
                failed += sum(1 for a in r.answers.values() if a.text is None)
                if on_progress is not None:
                    on_progress(Progress(done=len(out), total=len(samples), elapsed_s=time.monotonic() - t0,
                                         failed=failed))
        finally:
            stop.set()
    return [out[i] for i in range(len(samples))]


def list_models(ep: Endpoint, timeout_s: float = 30.0) -> list[str]:
    """GET /v1/models (idempotent): the names the server serves; [] when it does not say."""
    httpx = _httpx()
    with client(timeout_s) as c:
        try:
            resp = c.get(ep.url.rstrip("/") + "/models", headers=ep.headers())
        except httpx.TransportError as e:
            raise ConnectError(f"{ep.url}: {_failure(e, timeout_s)}",
                               fix="Check that the server runs (`ktdeploy status`) and the URL.") from None
        if resp.status_code != 200:
            return []
        try:
            data = parse_json(resp.content[:MAX_BODY])
            return [str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m]
        except (ValueError, KeyError, TypeError):
            return []


def stream_chat(ep: Endpoint, messages: Sequence[dict[str, str]], s: Settings) -> Iterator[str]:
    """The answer's text as the server streams it (server-sent events of chat.completion.chunk); a refused or broken
    stream raises UsageError with what the server said."""
    httpx = _httpx()
    with client(s.timeout_s) as c:
        try:
            with c.stream("POST", ep.url.rstrip("/") + "/chat/completions", json=chat_body(ep, messages, s, True),
                          headers=ep.headers()) as resp:
                if resp.status_code != 200:
                    detail = resp.read()[:300].decode("utf-8", "replace")
                    raise UsageError(f"{ep.url} refused the chat: HTTP {resp.status_code} {printable(detail, 160)}",
                                     fix="Check the model name (--model) and the API key (its variable).")
                for line in resp.iter_lines():
                    piece = _sse_piece(line)
                    if piece is None:
                        break
                    if piece:
                        yield piece
        except httpx.TransportError as e:
            raise ConnectError(f"{ep.url}: {_failure(e, s.timeout_s)}",
                               fix="Check that the server runs (`ktdeploy status`) and the URL.") from None


def _sse_piece(line: str) -> str | None:
    """One server-sent event line -> its text ('' for none); None at the stream's end ([DONE])."""
    if not line.startswith("data:"):
        return ""
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    try:
        delta = parse_json(payload)["choices"][0].get("delta") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    text = delta.get("content") if isinstance(delta, dict) else None
    return text if isinstance(text, str) else ""
