"""Any OpenAI-compatible `/v1/chat/completions` server (vLLM serve, SGLang, llama.cpp server, Ollama, hosted APIs).

A batch is sent as concurrent async requests (bounded by a semaphore). Transient failures (429, 5xx, connection
errors, timeouts) are retried with exponential backoff and jitter, honouring Retry-After; other 4xx are final.
A request that still fails comes back as a Completion with `error` set.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from dear.llm.base import Backend, BackendError, ChatRequest, Completion
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


class OpenAICompatBackend(Backend):
    """Chat completions over HTTP.

    Args:
        base_url: the API root including `/v1`, e.g. http://127.0.0.1:8000/v1.
        model: model name sent with each request; default: the first model listed by GET /models.
        api_key: sent as a Bearer token.
        max_concurrency: requests in flight at once.
        timeout_s: per-attempt timeout (connect, read, write).
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
        timeout_s: float = 120.0,
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
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self._extra = dict(extra_body or {})
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tokenize_ok: bool | None = None  # learnt on first count_tokens call
        self.context_length = context_length
        if model is None:
            model, reported_ctx = self._discover_model()
            self.context_length = context_length or reported_ctx
        self.model = model
        self.model_id = f"openai:{model}"

    # --- set-up -------------------------------------------------------------------------------------------

    def _discover_model(self) -> tuple[str, int | None]:
        url = f"{self.base_url}/models"
        try:
            response = httpx.get(url, headers=self._headers, timeout=self.timeout_s)
            response.raise_for_status()
            models = response.json()["data"]
            first = models[0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise BackendError(
                f"could not list models at {url} ({type(exc).__name__}: {exc}); "
                "pass the model name explicitly, e.g. openai:http://host:port/v1#model-name"
            ) from exc
        ctx = first.get("max_model_len") or (first.get("meta") or {}).get("n_ctx_train")
        return str(first["id"]), (int(ctx) if ctx else None)

    # --- the batch call ----------------------------------------------------------------------------------

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        if not requests:
            return []
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agenerate(requests))
        # Called from inside a running event loop (a notebook, an async engine): run ours in a thread.
        with ThreadPoolExecutor(max_workers=1) as ex:
            return ex.submit(asyncio.run, self.agenerate(requests)).result()

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Async form of `generate` for callers that already run an event loop."""
        semaphore = asyncio.Semaphore(self.max_concurrency)
        limits = httpx.Limits(
            max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
        )
        async with httpx.AsyncClient(headers=self._headers, timeout=self.timeout_s, limits=limits) as client:

            async def bounded(request: ChatRequest) -> Completion:
                async with semaphore:
                    return await self._one(client, request)

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
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                response = await client.post(url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error = f"{type(exc).__name__}: {exc or 'timed out'}"
            else:
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
                        return completion
                else:
                    last_error = f"HTTP {response.status_code}: {response.text[:300]}"
                    if response.status_code not in RETRY_STATUS:
                        break  # a request the server will never accept: retrying cannot help
                    retry_after = _retry_after_s(response)
            if attempt < self.max_retries:
                delay = self._backoff_s(attempt, retry_after)
                log.debug("retry %d/%d in %.2fs after %s", attempt + 1, self.max_retries, delay, last_error)
                await asyncio.sleep(delay)
        latency = time.perf_counter() - started
        log.warning("request to %s failed after %d attempt(s): %s", url, attempt + 1, last_error)
        return Completion(
            text="",
            prompt_tokens=0,
            completion_tokens=0,
            finish_reason="error",
            latency_s=latency,
            error=f"{last_error} (after {attempt + 1} attempt(s))",
        )

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
            response = httpx.post(
                f"{root}/tokenize",
                json={"content": text, "prompt": text, "model": self.model, "add_special_tokens": False},
                headers=self._headers,
                timeout=self.timeout_s,
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
