"""Any OpenAI-compatible `/v1/chat/completions` server (vLLM serve, SGLang, llama.cpp server, Ollama, hosted APIs).

A batch is sent as concurrent async requests (bounded by a semaphore). Transient failures (429, 5xx, connection
errors, timeouts) are retried with exponential backoff and jitter, honouring Retry-After; other 4xx are final.
A request that still fails comes back as a Completion with `error` set.

Bounded waits. Each attempt has a connect timeout (`connect_timeout_s`, 10 s) and a read timeout that scales
with the request's `max_tokens` (`read_timeout_base_s + read_timeout_per_token_s * max_tokens`: 97 s at 512
tokens), and one request's attempts and backoffs together stop at `total_timeout_s` (default: its read timeout
+ 30 s, so 127 s at 512 tokens). A server that accepts connections but never replies therefore gives a clear
error within about 2 minutes, and once one request got no reply at all, the requests of the batch still
waiting for a slot fail at once instead of each waiting again. Model listing and /tokenize use short timeouts
(`connect_timeout_s`, `list_timeout_s`) and say what happened: refused, timed out, or a bad response.

Connections. One backend holds one `httpx.AsyncClient` (chat calls, keep-alive, at most `max_concurrency`
connections) on its own event loop in a daemon thread, and one `httpx.Client` for the short calls; both live
until `close()`. Every `generate` call, from any thread, reuses their connections instead of opening new ones,
which matters against a remote `vllm serve` fleet (TLS handshakes, connection limits).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from dear.llm.base import GENERATED_TOKENS, Backend, BackendError, ChatRequest, Completion
from dear.llm.local import parse_chat_response, request_payload

log = logging.getLogger(__name__)

# 408 (request timeout) counts as a timeout; every other 4xx is final.
RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


def _retry_after_s(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


_NO_REPLY = "server never replied:"


class _LoopThread:
    """An asyncio event loop running in a daemon thread: the home of the backend's AsyncClient (a client is
    bound to the loop it was created on, and `asyncio.run` would make a new loop on every call)."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro):
        """Run `coro` on the loop and wait for its result (from any thread but the loop's own)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def _failed(error: str, latency_s: float) -> Completion:
    return Completion(text="", prompt_tokens=0, completion_tokens=0, finish_reason="error", latency_s=latency_s,
                      error=error)


class OpenAICompatBackend(Backend):
    """Chat completions over HTTP.

    Args:
        base_url: the API root including `/v1`, e.g. http://127.0.0.1:8000/v1.
        model: model name sent with each request; default: the first model listed by GET /models.
        api_key: sent as a Bearer token.
        max_concurrency: requests in flight at once.
        connect_timeout_s: longest wait for a TCP connection.
        read_timeout_base_s, read_timeout_per_token_s: the read timeout of an attempt is
            base + per_token * request.max_tokens (the server must generate up to max_tokens first).
        timeout_s: a fixed read timeout for every attempt instead of the max_tokens-scaled one.
        total_timeout_s: longest time one request may take over all its attempts and backoffs;
            None = its read timeout + 30 s.
        list_timeout_s: read timeout of the short calls (GET /models, POST /tokenize).
        max_retries: retries after the first attempt for transient failures.
        backoff_base_s, backoff_max_s: delay before retry k is base * 2**k capped at max, with jitter.
        retry_after_max_s: longest Retry-After we honour (longer values are capped).
        context_length: overrides what the server reports (vLLM reports max_model_len).
        extra_body: extra fields sent with every request (e.g. {"top_k": 0} for servers that take it).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        connect_timeout_s: float = 10.0,
        read_timeout_base_s: float = 20.0,
        read_timeout_per_token_s: float = 0.15,
        timeout_s: float | None = None,
        total_timeout_s: float | None = None,
        list_timeout_s: float = 15.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 20.0,
        retry_after_max_s: float = 60.0,
        context_length: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_concurrency < 1 or max_retries < 0:
            raise ValueError(
                f"need max_concurrency >= 1 and max_retries >= 0, got {max_concurrency}, {max_retries}"
            )
        for name, value in (("connect_timeout_s", connect_timeout_s), ("read_timeout_base_s", read_timeout_base_s),
                            ("list_timeout_s", list_timeout_s), ("timeout_s", timeout_s),
                            ("total_timeout_s", total_timeout_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if read_timeout_per_token_s < 0:
            raise ValueError(f"read_timeout_per_token_s must be >= 0, got {read_timeout_per_token_s!r}")
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_base_s = read_timeout_base_s
        self.read_timeout_per_token_s = read_timeout_per_token_s
        self.timeout_s = timeout_s
        self.total_timeout_s = total_timeout_s
        self.list_timeout_s = list_timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self._extra = dict(extra_body or {})
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tokenize_ok: bool | None = None  # learnt on first count_tokens call
        self._http = httpx.Client(headers=self._headers, timeout=self._short_timeout())
        self._loop = _LoopThread("openai-compat")
        self._client = self._loop.run(self._make_async_client())
        self.context_length = context_length
        try:
            if model is None:
                model, reported_ctx = self._discover_model()
                self.context_length = context_length or reported_ctx
        except BaseException:
            self.close()
            raise
        self.model = model
        self.model_id = f"openai:{model}"

    async def _make_async_client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        # Created on the loop thread, with the semaphore that bounds requests in flight over all callers.
        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        return httpx.AsyncClient(headers=self._headers, limits=limits)

    def close(self) -> None:
        """Close the connections and stop the event-loop thread (idempotent)."""
        if self._client is not None:
            self._loop.run(self._client.aclose())
            self._client = None
            self._loop.stop()
        if self._http is not None:
            self._http.close()
            self._http = None

    # --- timeouts -----------------------------------------------------------------------------------------

    def read_timeout(self, max_tokens: int) -> float:
        """Read timeout of one attempt of a request for up to `max_tokens` tokens."""
        if self.timeout_s is not None:
            return float(self.timeout_s)
        return self.read_timeout_base_s + self.read_timeout_per_token_s * max(0, int(max_tokens))

    def request_budget(self, max_tokens: int) -> float:
        """Longest one request may take, all attempts and backoffs included."""
        if self.total_timeout_s is not None:
            return float(self.total_timeout_s)
        return self.read_timeout(max_tokens) + 30.0

    def _short_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.list_timeout_s, connect=self.connect_timeout_s)

    # --- set-up -------------------------------------------------------------------------------------------

    def _discover_model(self) -> tuple[str, int | None]:
        url = f"{self.base_url}/models"
        hint = "; or pass the model name explicitly, e.g. openai:http://host:port/v1#model-name"
        try:
            response = self._http.get(url)
        except httpx.ConnectTimeout:
            raise BackendError(f"could not list models at {url}: no connection within {self.connect_timeout_s:g}s "
                               f"(connect_timeout_s); is the host reachable?") from None
        except httpx.ConnectError as exc:
            raise BackendError(f"could not list models at {url}: connection refused or failed ({exc}); "
                               f"is the server running on that port?") from None
        except httpx.TimeoutException:
            raise BackendError(f"could not list models at {url}: the server accepted the connection but sent no "
                               f"reply within {self.list_timeout_s:g}s (list_timeout_s); is it stuck or still "
                               f"loading?") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"could not list models at {url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise BackendError(f"could not list models at {url}: HTTP {response.status_code}: "
                               f"{response.text[:200]!r}{hint}")
        try:
            first = response.json()["data"][0]
            model_name = str(first["id"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"could not list models at {url}: bad response, not an OpenAI model list "
                               f"({type(exc).__name__}: {exc}): {response.text[:200]!r}{hint}") from None
        ctx = first.get("max_model_len") or (first.get("meta") or {}).get("n_ctx_train")
        return model_name, (int(ctx) if ctx else None)

    # --- the batch call ----------------------------------------------------------------------------------

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        if not requests:
            return []
        if self._client is None:
            raise BackendError(f"OpenAICompatBackend for {self.base_url} is closed")
        return self._loop.run(self._batch(requests))

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Async form of `generate` for callers that run their own event loop (the work runs on ours)."""
        if self._client is None:
            raise BackendError(f"OpenAICompatBackend for {self.base_url} is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._batch(requests), self._loop.loop))

    async def _batch(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        unresponsive: list[str] = []  # set once a request got no reply at all: the rest of the batch fails fast
        client = self._client

        async def bounded(request: ChatRequest) -> Completion:
            async with self._semaphore:
                if unresponsive:
                    return _failed(f"not sent: {unresponsive[0]}", 0.0)
                completion = await self._one(client, request)
                if completion.error and completion.error.startswith(_NO_REPLY):
                    unresponsive.append(f"the server gave no reply to an earlier request of this batch "
                                        f"({completion.error})")
                return completion

        return list(await asyncio.gather(*(bounded(r) for r in requests)))

    def _backoff_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_max_s)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # "equal jitter": spread out retry storms

    async def _one(self, client: httpx.AsyncClient, request: ChatRequest) -> Completion:
        body = request_payload(request, self._extra)
        body["model"] = self.model
        url = f"{self.base_url}/chat/completions"
        started = time.perf_counter()
        read_s, budget_s = self.read_timeout(request.max_tokens), self.request_budget(request.max_tokens)
        deadline = started + budget_s
        last_error = "no attempt made"
        replied = False  # any HTTP response at all (else the server is silent or unreachable)
        attempts = 0
        for attempt in range(self.max_retries + 1):
            attempt_s = min(read_s, deadline - time.perf_counter())
            if attempt_s <= 0.05:
                break
            attempts += 1
            retry_after = None
            timeout = httpx.Timeout(attempt_s, connect=min(self.connect_timeout_s, attempt_s))
            try:
                # wait_for bounds the whole attempt, even a server that trickles bytes without finishing
                response = await asyncio.wait_for(client.post(url, json=body, timeout=timeout), attempt_s)
            except httpx.ConnectTimeout:
                last_error = f"ConnectTimeout: no connection within {min(self.connect_timeout_s, attempt_s):.3g}s"
            except (httpx.TimeoutException, asyncio.TimeoutError):
                last_error = (f"ReadTimeout: connected, but no reply within {attempt_s:.3g}s (read timeout "
                              f"for max_tokens={request.max_tokens})")
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc or 'connection failed'}"
            else:
                replied = True
                if response.status_code == 200:
                    try:
                        data = response.json()
                    except ValueError:
                        last_error = f"HTTP 200 with a body that is not JSON: {response.text[:200]!r}"
                    else:
                        completion = parse_chat_response(data, time.perf_counter() - started)
                        if completion.ok and not data.get("usage"):
                            log.warning("%s returned no usage; token counts estimated", self.base_url)
                            completion.prompt_tokens = sum(self.estimate(m.content) for m in request.messages)
                            completion.completion_tokens = self.estimate(completion.text)
                        GENERATED_TOKENS.add(completion.completion_tokens)
                        return completion
                else:
                    last_error = f"HTTP {response.status_code}: {response.text[:300]}"
                    if response.status_code not in RETRY_STATUS:
                        break  # a request the server will never accept: retrying cannot help
                    retry_after = _retry_after_s(response)
            if attempt < self.max_retries:
                delay = min(self._backoff_s(attempt, retry_after), max(0.0, deadline - time.perf_counter()))
                log.debug("retry %d/%d in %.2fs after %s", attempt + 1, self.max_retries, delay, last_error)
                await asyncio.sleep(delay)
        latency = time.perf_counter() - started
        log.warning("request to %s failed after %d attempt(s): %s", url, attempts, last_error)
        out_of_time = time.perf_counter() >= deadline - 0.05
        error = f"{last_error} (after {attempts} attempt(s) in {latency:.1f}s"
        if out_of_time:
            error += (f"; gave up at the {budget_s:.3g}s limit of one request: raise total_timeout_s / "
                      f"read_timeout_per_token_s for a slower server")
        error += ")"
        if not replied and out_of_time and "ReadTimeout" in last_error:
            error = f"{_NO_REPLY} {url}: {error}"
        return _failed(error, latency)

    # --- tokens ---------------------------------------------------------------------------------------------

    @staticmethod
    def estimate(text: str) -> int:
        return max(1, len(text) // 4)

    def count_tokens(self, text: str) -> int:
        """The server's tokenizer when it has a /tokenize route (llama.cpp, vLLM), else ~4 chars/token."""
        if self._tokenize_ok is False:
            return self.estimate(text)
        root = self.base_url.removesuffix("/v1")
        try:
            response = self._http.post(
                f"{root}/tokenize",
                json={"content": text, "prompt": text, "model": self.model, "add_special_tokens": False},
            )
            response.raise_for_status()
            data = response.json()
            count = int(data["count"]) if "count" in data else len(data["tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            if self._tokenize_ok is None:
                log.info("%s has no usable /tokenize; token counts are estimated", root)
            self._tokenize_ok = False
            return self.estimate(text)
        self._tokenize_ok = True
        return count
