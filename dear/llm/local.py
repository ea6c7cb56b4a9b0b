"""llama.cpp in-process through the `xllamacpp` wheel: one server, several parallel slots.

Every request of a batch is submitted at once from its own thread (the xllamacpp handler blocks but
releases the GIL), so llama.cpp decodes all slots together in one continuous batch. Requests are streamed
and gathered back into one response, so that `close()` can cancel the ones still decoding.

A `repeatable` backend instead decodes one request at a time, in submission order, in its one slot and without
reusing any earlier prompt's KV cache: llama.cpp's numerics follow the batch it decodes in (which slots are active)
and the cached state a prompt starts from, and both follow the timing of the requests otherwise. Each text then
depends only on its request, the model and the thread count (`choose_threads`).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dear.llm.base import GENERATED_TOKENS, Backend, BackendError, ChatRequest, Completion, TokenLogprobs

log = logging.getLogger(__name__)

# llama.cpp's server samples with top_k=40 and min_p=0.05 unless told otherwise; vLLM and OpenAI-style
# APIs apply only temperature and top_p. Switching the extra filters off keeps backends comparable.
DEFAULT_EXTRA_SAMPLING: dict[str, Any] = {"top_k": 0, "min_p": 0.0}


@dataclass(frozen=True)
class ThreadChoice:
    """The llama.cpp thread count and what it was chosen from."""

    threads: int
    cores: int  # cores this process may run on
    load: float | None  # the machine's 1-minute load average at the choice (None: the OS does not say)
    override: str | None = None  # what set the count instead of the default (every core), e.g. "DEAR_LLAMA_THREADS=1"

    @property
    def busy(self) -> bool:
        """The default count while other work already holds at least a core: threads will share cores."""
        return self.override is None and self.load is not None and round(self.load) >= 1 \
            and self.threads > self.cores - round(self.load)

    def warning(self) -> str | None:
        """One line when the machine was busy at the choice (`busy`), naming the setting that avoids the slowdown."""
        if not self.busy:
            return None
        return (f"warning: the machine is busy (load {self.load:.1f} on {self.cores} cores): llama.cpp's "
                f"{self.threads} threads share cores with other work and may decode up to ~10x slower; "
                f"DEAR_LLAMA_THREADS={max(1, self.cores - round(self.load))} avoids that (the texts of a seed depend "
                f"on the count)")

    def describe(self) -> str:
        """The line for the start of a run, followed by `warning()`'s line when the machine was busy."""
        load = "unknown" if self.load is None else f"{self.load:.1f}"
        noun = "thread" if self.threads == 1 else "threads"
        if self.override:
            return f"llama.cpp: {self.threads} {noun} ({self.override}; {self.cores} cores, load {load})"
        line = (f"llama.cpp: {self.threads} {noun} ({self.cores} cores, load {load}; every usable core, whatever the "
                f"load; set DEAR_LLAMA_THREADS to override)")
        warning = self.warning()
        return f"{line}\n{warning}" if warning else line


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def choose_threads(n_threads: int | None = None) -> ThreadChoice:
    """`n_threads` if given, else DEAR_LLAMA_THREADS if set, else every usable core: a fixed default.

    llama.cpp's numerics follow its thread count, so the same seed gives other texts at another count; the count
    therefore never follows the machine's load (it once did: a run started while a core was busy decoded other
    texts than the same run on a quiet machine). The price: llama.cpp threads spin at barriers, so threads that
    share a core with other busy processes slow each other down ~10x (measured: 2 threads 1.3 tok/s vs 1 thread
    13.7 tok/s at load 15 on 2 cores). The choice records the load it saw, and `describe()` adds a warning line
    that names DEAR_LLAMA_THREADS when the load was high.
    """
    cores, load = usable_cores(), load_average()
    if n_threads:
        return ThreadChoice(max(1, int(n_threads)), cores, load, override=f"n_threads={n_threads}")
    env = os.environ.get("DEAR_LLAMA_THREADS")
    if env:
        try:
            threads = max(1, int(env))
        except ValueError:
            raise ValueError(f"DEAR_LLAMA_THREADS must be an integer, got {env!r}") from None
        return ThreadChoice(threads, cores, load, override=f"DEAR_LLAMA_THREADS={env}")
    return ThreadChoice(max(1, cores), cores, load)


def request_payload(request: ChatRequest, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI-style chat-completions body for one request (shared with the HTTP backend)."""
    body: dict[str, Any] = {
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_tokens,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
    if request.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = int(request.logprobs)
    if extra:
        body.update(extra)
    return body


def token_grammar(ids: Sequence[int]) -> str:
    """A GBNF grammar that allows exactly this token sequence (llama.cpp's `<[id]>` token terminals), so a greedy
    decode under it reproduces a stored reply token by token."""
    return "root ::= " + " ".join(f"<[{int(i)}]>" for i in ids)


def parse_chat_response(data: Any, latency_s: float) -> Completion:
    """An OpenAI-style chat-completions response (or llama.cpp error object) to a Completion."""
    if not isinstance(data, dict):
        return _error_completion(f"unexpected response type {type(data).__name__}", latency_s)
    if "error" in data:
        err = data["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return _error_completion(f"server error: {message}", latency_s)
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        finish_reason = choice.get("finish_reason") or "stop"
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        return _error_completion(f"malformed response, missing {exc!r}: {str(data)[:200]}", latency_s)
    usage = data.get("usage") or {}
    return Completion(
        text=text,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        finish_reason=finish_reason,
        latency_s=latency_s,
        reused_prompt_tokens=reused_prompt_tokens(data),
        logprobs=token_logprobs(choice),
    )


def token_logprobs(choice: dict[str, Any]) -> TokenLogprobs | None:
    """The OpenAI-style `logprobs.content` of a choice, None when the server sent none or sent it malformed."""
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not content:
        return None
    try:
        return TokenLogprobs.from_openai(content)
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("ignoring malformed logprobs (%s)", exc)
        return None


def reused_prompt_tokens(data: dict[str, Any]) -> int:
    """Prompt tokens served from the server's KV cache: OpenAI's `usage.prompt_tokens_details.cached_tokens`
    (llama.cpp and vLLM fill it), else llama.cpp's `timings.cache_n`; 0 when the server says neither."""
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    if value is None:
        value = (data.get("timings") or {}).get("cache_n", 0)
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _error_completion(message: str, latency_s: float) -> Completion:
    return Completion(
        text="",
        prompt_tokens=0,
        completion_tokens=0,
        finish_reason="error",
        latency_s=latency_s,
        error=message,
    )


CANCELLED = "cancelled: the backend is closing"


@dataclass
class _StreamedChoice:
    """One choice's part of a stream: its text pieces, token log-probabilities, finish reason, usage and timings."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # each streamed token's OpenAI-style entry
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    streamed_tokens: int = 0  # counted into GENERATED_TOKENS as they arrive; its usage corrects the total


class _StreamedChat:
    """Collects a streamed chat completion (llama.cpp's OpenAI-style chunks) into the response a non-streamed call
    returns, one per choice (`n` of them: a request for several samples, llama.cpp's `n_cmpl`, streams its choices
    interleaved, each chunk naming its `index`); `on_chunk` returns True, which ends the stream, once `closing` is
    set. llama.cpp sends each choice's usage and timings in a chunk without choices right after that choice's
    finishing chunk, so they go to the choice that finished last."""

    def __init__(self, closing: threading.Event, n: int = 1):
        self._closing = closing
        self._choices = [_StreamedChoice() for _ in range(n)]
        self._last_finished: _StreamedChoice | None = None
        self._error: Any = None
        self.cancelled = False

    def on_chunk(self, chunk: Any) -> bool:
        if not isinstance(chunk, dict):
            self._error = {"message": f"unexpected chunk type {type(chunk).__name__}"}
            return True
        if "error" in chunk or ("message" in chunk and "choices" not in chunk):
            self._error = chunk.get("error", chunk)  # llama.cpp's error body, or xllamacpp's own wrapper
            return True
        for c in chunk.get("choices") or ():
            index = c.get("index") or 0
            if not 0 <= index < len(self._choices):
                self._error = {"message": f"a chunk of choice {index}, but {len(self._choices)} were asked for"}
                return True
            choice = self._choices[index]
            delta = c.get("delta") or {}
            if delta.get("content"):
                choice.parts.append(delta["content"])
                choice.streamed_tokens += 1  # llama.cpp streams one token per chunk
                GENERATED_TOKENS.add(1)
            choice.logprobs.extend((c.get("logprobs") or {}).get("content") or ())
            if c.get("finish_reason"):
                choice.finish_reason = c["finish_reason"]
                self._last_finished = choice
        if self._last_finished is not None:
            self._last_finished.usage = chunk.get("usage") or self._last_finished.usage
            self._last_finished.timings = chunk.get("timings") or self._last_finished.timings
        if self._closing.is_set():
            self.cancelled = True
            return True
        return False

    def streamed_tokens(self, index: int = 0) -> int:
        """The tokens of choice `index` counted into GENERATED_TOKENS while it streamed."""
        return self._choices[index].streamed_tokens

    def response(self, index: int = 0) -> dict[str, Any]:
        """The non-streamed response body of choice `index` (or llama.cpp's error object)."""
        if self._error is not None:
            return {"error": self._error}
        streamed = self._choices[index]
        if streamed.finish_reason is None:
            return {"error": {"message": "the stream ended without a finish reason"}}
        choice: dict[str, Any] = {"message": {"content": "".join(streamed.parts)},
                                  "finish_reason": streamed.finish_reason}
        if streamed.logprobs:
            choice["logprobs"] = {"content": streamed.logprobs}
        body: dict[str, Any] = {"choices": [choice], "usage": streamed.usage or {}}
        if streamed.timings is not None:
            body["timings"] = streamed.timings
        return body


def shared_prompt_runs(requests: Sequence[ChatRequest], limit: int) -> list[list[int]]:
    """The batch's requests in runs that llama.cpp can sample from one request (`n_cmpl`: the prompt is read once and
    its KV state copied to the other slots, child j sampling with the first request's seed + j): adjacent requests
    equal in everything but the seed and the session (a slot hint; each agent has its own), whose seeds count up by
    one, at most `limit` to a run. Every other request
    is a run of its own. A debate engine sends such runs when `DebateConfig.shared_prompt` numbers round 0's seeds
    so."""
    runs: list[list[int]] = []
    for i, r in enumerate(requests):
        if runs and len(runs[-1]) < limit:
            first = requests[runs[-1][0]]
            if (r.seed is not None and first.seed is not None and r.seed == first.seed + len(runs[-1])
                    and replace(r, seed=first.seed, session=first.session) == first):
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs


# llama.cpp's draftless speculative decoding types (`--spec-type`), by the name the server's CLI uses.
SPECULATIVE_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def configure_speculative(params, xllamacpp, kind: str | None, draft_max: int,
                          ngram_size: tuple[int, int] | None) -> None:
    """Switch on draftless speculative decoding of type `kind` in llama.cpp's CommonParams (None: leave it off)."""
    if kind is None:
        return
    if kind not in SPECULATIVE_TYPES:
        raise ValueError(f"speculative must be one of {SPECULATIVE_TYPES} or None, got {kind!r}")
    if draft_max < 1:
        raise ValueError(f"draft_max must be >= 1, got {draft_max}")
    spec = params.speculative
    enum = xllamacpp.common_speculative_type
    spec.types = [getattr(enum, "COMMON_SPECULATIVE_TYPE_" + kind.upper().replace("-", "_"))]
    spec.draft.n_max = draft_max
    if ngram_size is not None:
        n, m = ngram_size
        if n < 1 or m < 1:
            raise ValueError(f"ngram_size must be two positive integers (n, m), got {ngram_size!r}")
        target = spec.ngram_mod if kind == "ngram-mod" else {
            "ngram-simple": spec.ngram_simple, "ngram-map-k": spec.ngram_map_k,
            "ngram-map-k4v": spec.ngram_map_k4v}.get(kind)
        if target is None:
            raise ValueError(f"ngram_size does not apply to speculative={kind!r}")
        if kind == "ngram-mod":
            target.n_match, target.n_max = n, m
        else:
            target.size_n, target.size_m = n, m


def _check_options(path: Path, n_parallel: int, n_ctx: int, repeatable: bool) -> None:
    if not path.is_file():
        raise BackendError(f"GGUF model file not found: {path}")
    if n_parallel < 1 or n_ctx < 16:
        raise ValueError(f"n_parallel must be >= 1 and n_ctx >= 16, got n_parallel={n_parallel}, n_ctx={n_ctx}")
    if repeatable and n_parallel != 1:
        raise ValueError(f"repeatable decodes one request at a time: n_parallel must be 1, got {n_parallel} "
                         f"(drop the parallel setting or turn repeatable off)")


def _set_params(params, path: Path, threads: int, n_parallel: int, n_ctx: int, n_batch: int, poll: int | None,
                cache_prompt: bool, repeatable: bool) -> None:
    """The model, slots, context, batch, threads and caching of llama.cpp's CommonParams."""
    params.model.path = str(path)
    params.n_parallel = n_parallel
    params.n_ctx = n_ctx * n_parallel  # split evenly across slots (kv_unified is off)
    params.n_batch = n_batch
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    if poll is not None:  # llama.cpp --poll: 0 sleeps at thread barriers instead of spinning
        params.cpuparams.poll = poll
        params.cpuparams_batch.poll = poll
    params.cache_prompt = cache_prompt
    if repeatable:
        params.cache_ram_mib = 0  # nor restore a state saved from an earlier request (llama.cpp's RAM cache)
    params.warmup = False


@dataclass
class ServerTimings:
    """Where the server's slots spent their time so far, summed over calls (llama.cpp `timings`): milliseconds
    reading prompts and generating, and the tokens of each. Slots run side by side, so the sums are slot-time:
    divided by wall time x slots they give how busy the slots were. With speculative decoding: draft tokens
    proposed and accepted (`timings.draft_n[_accepted]`)."""

    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    prompt_tokens: int = 0
    predicted_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, timings: dict[str, Any]) -> None:
        with self._lock:
            self.prompt_ms += float(timings.get("prompt_ms") or 0.0)
            self.predicted_ms += float(timings.get("predicted_ms") or 0.0)
            self.prompt_tokens += int(timings.get("prompt_n") or 0)
            self.predicted_tokens += int(timings.get("predicted_n") or 0)
            self.drafted += int(timings.get("draft_n") or 0)
            self.accepted += int(timings.get("draft_n_accepted") or 0)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")


class SlotAffinity:
    """Keeps each conversation session on one llama.cpp slot, so its next turn finds the shared prefix in that
    slot's KV cache and only the new messages are read.

    A session keeps its slot until another session evicts it; a new session takes the least recently used idle
    slot. When every slot is busy the request goes without a slot id and llama.cpp picks one itself.
    """

    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self._slot_of: dict[str, int] = {}
        self._owner: list[str | None] = [None] * n_slots
        self._last_used = [0] * n_slots
        self._busy: set[int] = set()
        self._clock = 0
        self._lock = threading.Lock()

    def acquire(self, session: str | None) -> int | None:
        """The slot for this session's request (marked busy until `release`), or None."""
        if session is None:
            return None
        with self._lock:
            slot = self._slot_of.get(session)
            if slot is None or slot in self._busy:
                idle = [s for s in range(self.n_slots) if s not in self._busy]
                if not idle:
                    return None
                slot = min(idle, key=self._last_used.__getitem__)
                self._move(session, slot)
            self._busy.add(slot)
            self._clock += 1
            self._last_used[slot] = self._clock
            return slot

    def release(self, slot: int | None) -> None:
        if slot is not None:
            with self._lock:
                self._busy.discard(slot)

    def _move(self, session: str, slot: int) -> None:
        evicted = self._owner[slot]
        if evicted is not None:
            del self._slot_of[evicted]
        previous = self._slot_of.get(session)
        if previous is not None:
            self._owner[previous] = None
        self._owner[slot] = session
        self._slot_of[session] = slot


class LocalLlamaBackend(Backend):
    """A GGUF model served in-process by llama.cpp with `n_parallel` slots of `n_ctx` tokens each.

    Args:
        model_path: any GGUF file.
        n_parallel: decoding slots; set it to the number of requests per round (debates x agents) or less.
        n_ctx: context per slot (the KV cache holds n_parallel * n_ctx tokens).
        n_threads: CPU threads for decoding (default: `choose_threads()`: DEAR_LLAMA_THREADS, else every usable
            core, whatever the load).
        n_batch: prompt-processing batch size.
        cache_prompt: let a slot reuse the KV cache of a shared prompt prefix; requests that carry a `session`
            then keep one slot across turns (`SlotAffinity`).
        extra_sampling: extra llama.cpp sampling fields sent with every request.
        verbosity: llama.cpp log level (0 quiet ... 3 info).
        model_id: name used in traces and cache keys (default: llamacpp:<file name>).
        poll: llama.cpp busy-wait level 0..100 at thread barriers (default 50); 0 helped only a little in our oversubscribed test.
        speculative: draftless speculative decoding, one of SPECULATIVE_TYPES (llama.cpp `--spec-type`): drafts
            come from n-grams already in the slot's context (a debate agent re-reading its own or its peers'
            answers repeats much of them), and the model verifies a draft in one batched step. Each position is
            still sampled from the model's own distribution (a draft token is kept only where it equals the
            sampled one), so answers keep their distribution; only the speed changes. None = off.
        draft_max: at most this many draft tokens per step (`--draft-max`).
        ngram_size: (n, m) for the ngram-* types: look up the last n tokens, draft the m that followed them.
        progress_chunks: stream llama.cpp's prompt-progress reports too, so that `close()` can cancel a slot that
            is still reading its prompt (False: only at its first token; bench/bench_stop.py compares the two).
        repeatable: decode one request at a time in submission order (needs n_parallel=1; concurrent `generate`
            calls wait for each other) and never start a prompt from an earlier one's KV cache, so that a seeded
            request gives the same text whatever else is in flight (same model and thread count). Slower than
            parallel slots: bench/bench_repeatable.py measures the ratio.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        n_parallel: int = 4,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        cache_prompt: bool = True,
        extra_sampling: dict[str, Any] | None = None,
        verbosity: int = 0,
        model_id: str | None = None,
        poll: int | None = None,
        speculative: str | None = None,
        draft_max: int = 16,
        ngram_size: tuple[int, int] | None = None,
        progress_chunks: bool = True,
        repeatable: bool = False,
    ):
        path = Path(model_path)
        _check_options(path, n_parallel, n_ctx, repeatable)
        try:
            import xllamacpp
        except ImportError as exc:
            raise BackendError(
                "xllamacpp is not installed; install the `local` extra: pip install -e .[local]"
            ) from exc

        choice = choose_threads(n_threads)
        print(choice.describe(), file=sys.stderr, flush=True)  # the one setting that can make a run ~10x slower
        if repeatable:
            print("llama.cpp: repeatable (one request at a time, no prompt-cache reuse): a seed's texts depend only "
                  "on the request, the model and the thread count", file=sys.stderr, flush=True)
            cache_prompt = False  # a prompt's start state would depend on which request came before it
        params = xllamacpp.CommonParams()
        _set_params(params, path, choice.threads, n_parallel, n_ctx, n_batch, poll, cache_prompt, repeatable)
        configure_speculative(params, xllamacpp, speculative, draft_max, ngram_size)
        params.verbosity = verbosity
        # The server also listens on 127.0.0.1 (we use it for /tokenize); a random key keeps it private.
        self._api_key = secrets.token_hex(16)
        params.api_keys = [self._api_key]
        params.hostnames = ["127.0.0.1"]
        params.port = 0

        started = time.perf_counter()
        try:
            self._server = xllamacpp.Server(params)
        except Exception as exc:  # xllamacpp raises plain RuntimeError/ValueError on load failures
            raise BackendError(f"llama.cpp could not load {path}: {exc}") from exc
        log.info(
            "loaded %s in %.1fs (%d slots x %d ctx)",
            path.name,
            time.perf_counter() - started,
            n_parallel,
            n_ctx,
        )

        self.model_path = path
        self.model_id = model_id or f"llamacpp:{path.name}"
        self.context_length = n_ctx
        self.n_parallel = n_parallel
        self.speculative = speculative
        self.repeatable = repeatable
        self._serial = threading.Lock()  # a repeatable backend's generate calls run one after another
        self.server_timings = ServerTimings()
        self._cache_prompt = cache_prompt
        self._extra = dict(DEFAULT_EXTRA_SAMPLING if extra_sampling is None else extra_sampling)
        self._progress_chunks = progress_chunks
        # Two submitters per slot keep the server's queue primed when a slot finishes early.
        self._pool = ThreadPoolExecutor(max_workers=2 * n_parallel, thread_name_prefix="llamacpp")
        self._slots = SlotAffinity(n_parallel)
        self._closing = threading.Event()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._http = self._http_client()
        self._wait_until_ready()

    def _http_client(self):
        import httpx

        return httpx.Client(
            base_url=self._server.listening_address,
            headers={"Authorization": f"Bearer {self._api_key}"},
            timeout=30,
        )

    def _wait_until_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the server's HTTP thread answers /health.

        Destroying an xllamacpp Server before its HTTP thread is up can hang forever in ~Server (a thread
        join), e.g. a backend built and closed at once; waiting for /health here makes close() safe.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._http.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BackendError(
                    f"llama.cpp server for {self.model_path} did not become ready in {timeout_s}s"
                )
            time.sleep(0.01)

    def _one(self, request: ChatRequest, extra: dict[str, Any] | None = None) -> Completion:
        return self._samples(request, 1, extra)[0]

    def _samples(self, request: ChatRequest, n: int, extra: dict[str, Any] | None = None) -> list[Completion]:
        """`n` samples of one request: the request itself, and for n > 1 llama.cpp's `n_cmpl` children, which read
        no prompt of their own (the parent's KV state is copied) and sample with seeds request.seed + 1, + 2, ..."""
        if self._closing.is_set():
            return [_error_completion(CANCELLED, 0.0)] * n
        body = request_payload(request, {**self._extra, **(extra or {})})
        body["cache_prompt"] = self._cache_prompt
        if n > 1:
            body["n_cmpl"] = n
        # Streamed, so close() can cancel a request inside llama.cpp: the callback's True ends the stream and
        # the server cancels the task. The text and usage are gathered back into one response.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        # Progress chunks while the prompt is read give the callback a say then too: without them a stop waits
        # for every slot to finish reading its prompt (bench/bench_stop.py).
        body["return_progress"] = self._progress_chunks
        stream = _StreamedChat(self._closing, n)
        slot = self._slots.acquire(request.session) if self._cache_prompt and n == 1 else None
        if slot is not None:
            body["id_slot"] = slot
        started = time.perf_counter()
        with self._in_flight_lock:
            self._in_flight += n
        try:
            self._server.handle_chat_completions(body, stream.on_chunk)
        except Exception as exc:  # noqa: BLE001 - a bad request raises instead of returning an error object
            return [_error_completion(f"llama.cpp: {type(exc).__name__}: {exc}", time.perf_counter() - started)] * n
        finally:
            self._slots.release(slot)
            with self._in_flight_lock:
                self._in_flight -= n
        latency = time.perf_counter() - started
        if stream.cancelled:
            return [_error_completion(CANCELLED, latency)] * n
        completions = []
        for index in range(n):
            data = stream.response(index)
            timings = data.get("timings") or {}
            c = parse_chat_response(data, latency)
            if index:  # a child read no prompt: the parent's KV state was copied to it
                timings = {**timings, "prompt_n": 0, "prompt_ms": 0.0}
                c = replace(c, reused_prompt_tokens=c.prompt_tokens)
            self.server_timings.add(timings)
            if c.ok:  # the exact count replaces the streamed estimate; a failed choice keeps its estimate
                GENERATED_TOKENS.add(c.completion_tokens - stream.streamed_tokens(index))
            completions.append(c)
        return completions

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Every request at once, each from its own thread; a run of requests that differ only in seeds counting up
        by one (`shared_prompt_runs`) goes as one request for that many samples, so its prompt is read once."""
        if self._server is None:
            raise BackendError("LocalLlamaBackend is closed")
        if self.repeatable:  # the next request goes only once the previous one has returned
            with self._serial:
                return [self._one(r) for r in requests]
        runs = shared_prompt_runs(requests, self.n_parallel)
        out: list[Completion | None] = [None] * len(requests)
        for run, completions in zip(runs, self._pool.map(lambda run: self._samples(requests[run[0]], len(run)), runs)):
            for i, c in zip(run, completions):
                out[i] = c
        return out  # type: ignore[return-value]

    def score(self, requests: Sequence[ChatRequest], texts: Sequence[str]) -> list[Completion]:
        """Teacher forcing (`Backend.score`): each text's tokens (the tokenizer's own split of it) are forced by a
        grammar of token ids and decoded greedily, so llama.cpp reports the log-probabilities it would have
        reported had it sampled them (before temperature and top-p, as in `generate`). Costs what generating the
        text costs. Decoded one request at a time (one slot) it is exact; several grammar-forced replies decoding
        together once returned a token 12 nats off (results/confidence-scoring-check), so score with one slot. A reply that comes back other than the stored text is an error Completion, never a record."""
        if len(requests) != len(texts):
            raise ValueError(f"score: {len(requests)} requests for {len(texts)} texts")
        if any(r.logprobs is None for r in requests):
            raise ValueError("score: every request must ask for log-probabilities (ChatRequest.logprobs = k)")
        if self._server is None:
            raise BackendError("LocalLlamaBackend is closed")
        if self.repeatable:
            with self._serial:
                return [self._score_one(r, t) for r, t in zip(requests, texts)]
        return list(self._pool.map(self._score_one, requests, texts))

    def _score_one(self, request: ChatRequest, text: str) -> Completion:
        ids = self._tokenize(text)
        if not ids:
            return _error_completion("nothing to score: the stored text has no tokens", 0.0)
        forced = replace(request, temperature=0.0, top_p=1.0, max_tokens=len(ids), stop=(), seed=0)
        c = self._one(forced, {"grammar": token_grammar(ids)})
        if c.ok and c.text != text:
            return _error_completion(f"the forced reply differs from the stored text ({len(c.text)} vs {len(text)} "
                                     "characters)", c.latency_s)
        return c

    def _tokenize(self, text: str) -> list[int]:
        """The model tokenizer's ids for `text` (llama.cpp's /tokenize on the private local port; no BOS)."""
        if self._http is None:
            raise BackendError("LocalLlamaBackend is closed")
        response = self._http.post("/tokenize", json={"content": text, "add_special": False})
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def count_tokens(self, text: str) -> int:
        """Exact count with the model's tokenizer (llama.cpp's /tokenize on the private local port)."""
        return len(self._tokenize(text))

    def close(self) -> None:
        """Stop: queued requests are dropped, those inside llama.cpp are cancelled at their next streamed chunk
        (a token, or a prompt-progress report while a slot reads its prompt), and each returns an error Completion."""
        self._closing.set()
        with self._in_flight_lock:
            in_flight = self._in_flight
        if in_flight:
            log.info("closing: cancelling %d request(s) in flight in llama.cpp", in_flight)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._http is not None:
            self._http.close()
            self._http = None
        self._server = None  # the C++ destructor stops the main loop and frees the model
