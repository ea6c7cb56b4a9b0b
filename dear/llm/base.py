"""The one backend interface: a batch of chat requests in, one completion per request out."""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    temperature: float = 0.7
    top_p: float = 0.9
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Conversation key: requests with the same session continue one conversation (a debate agent's turns).
    # Backends that keep a KV cache per slot route them to the same slot so the shared prefix is not recomputed.
    session: str | None = None
    # Structured facts about the debate turn (debate id, agent, round, the answers shown in the prompt).
    # Real LLM backends ignore it; the synthetic debater backend reads it instead of re-parsing prompts.
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Ask for the sampled tokens' log-probabilities: None = don't; k >= 0 = each token's log-probability and its
    # k most likely alternatives (`Completion.logprobs`). Not part of the response-cache key.
    logprobs: int | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """The model's own log-probabilities of a completion, token by token, before sampling filters (temperature,
    top-p): `chosen[i]` of the sampled token, `top[i]` the k highest of the vocabulary (descending; may include
    the sampled one), `nbytes[i]` the token's UTF-8 length, which places it in the text."""

    chosen: tuple[float, ...]
    top: tuple[tuple[float, ...], ...]
    nbytes: tuple[int, ...]

    def __post_init__(self):
        if not len(self.chosen) == len(self.top) == len(self.nbytes):
            raise ValueError(f"TokenLogprobs: chosen, top and nbytes differ in length "
                             f"({len(self.chosen)}, {len(self.top)}, {len(self.nbytes)})")

    @classmethod
    def from_openai(cls, content: Sequence[dict[str, Any]]) -> TokenLogprobs:
        """From an OpenAI-style `choices[0].logprobs.content` list (llama.cpp, vLLM serve, hosted APIs)."""
        chosen, top, nbytes = [], [], []
        for entry in content:
            chosen.append(float(entry["logprob"]))
            top.append(tuple(float(t["logprob"]) for t in entry.get("top_logprobs") or ()))
            raw = entry.get("bytes")
            nbytes.append(len(raw) if raw is not None else len(str(entry.get("token", "")).encode("utf-8")))
        return cls(tuple(chosen), tuple(top), tuple(nbytes))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenLogprobs:
        return cls(tuple(d["chosen"]), tuple(tuple(t) for t in d["top"]), tuple(d["nbytes"]))


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "error" | backend-specific
    latency_s: float
    error: str | None = None  # set when the backend gave up on this request (after retries)
    cached: bool = False  # served from the response cache (dear/llm/cache.py): nothing was generated
    reused_prompt_tokens: int = 0  # prompt tokens whose KV state the server reused (prefix cache)
    # The tokens' log-probabilities when the request asked for them and the server sent them; None otherwise
    # (a caller that asked tells "not sent" from this None: it never stands for a made-up number).
    logprobs: TokenLogprobs | None = None
    # A confidence record that comes with the completion (a bank replays the stored one; dear/confidence.py).
    confidence: dict[str, Any] | None = None
    # Where the completion came from when not the backend's own model: e.g. "bank:<shelf>#<index>" (a replayed
    # real sample) or a live model's id behind a bank world; None = the backend's model generated it.
    source: str | None = None
    # A program-of-thought reply's sandbox run as stored with it (`dear.debate.pot.PotRun.to_dict()`): a bank replays
    # the run its sample was graded by, so the program is not run again; None = run it (or not a `pot` reply).
    program: dict[str, Any] | None = None

    def __post_init__(self):
        if isinstance(self.logprobs, dict):  # a response-cache entry (dataclasses.asdict) read back
            self.logprobs = TokenLogprobs.from_dict(self.logprobs)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt tokens the server actually had to read (not reused from its KV cache)."""
        return max(0, self.prompt_tokens - self.reused_prompt_tokens)


class TokenMeter:
    """A thread-safe running count of generated (completion) tokens.

    Backends add to the process-wide `GENERATED_TOKENS` as tokens come back (llama.cpp per streamed token, HTTP
    per completion, batch backends per batch), so a progress display can show tokens and tokens/s while
    requests are still in flight instead of only when a batch ends. Served-from-cache completions add nothing.
    A backend that replays stored samples (a sample bank) adds their completion tokens to `REPLAYED_TOKENS`
    instead: no model generated them, but they are the work a debate did, so a display counts them apart.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    def add(self, tokens: int) -> None:
        if tokens:
            with self._lock:
                self._total += int(tokens)

    def total(self) -> int:
        with self._lock:
            return self._total


GENERATED_TOKENS = TokenMeter()  # every backend in this process counts here
REPLAYED_TOKENS = TokenMeter()  # completion tokens of stored samples replayed in this process (dear/bank)


def count_generated(completions: Sequence[Completion]) -> list[Completion]:
    """Add the completion tokens of `completions` to `GENERATED_TOKENS`; returns them unchanged."""
    GENERATED_TOKENS.add(sum(c.completion_tokens for c in completions if not c.cached))
    return list(completions)


class BackendError(RuntimeError):
    """A backend could not be built or used (missing model, no CUDA, bad URL...)."""


class Backend(abc.ABC):
    """Generate completions for a batch of chat requests.

    Implementations decode the whole batch together where they can (parallel slots, continuous
    batching, concurrent HTTP). A request that fails after the backend's own retries comes back as a
    Completion with `error` set; it never raises for one bad request, so other debates can finish.
    A backend that generates adds its completion tokens to `GENERATED_TOKENS` as they come back.
    """

    model_id: str = "unknown"
    synthetic: bool = False  # True only for the synthetic debater backend (`sim`)
    context_length: int | None = None  # tokens, when known

    @abc.abstractmethod
    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]: ...

    def count_tokens(self, text: str) -> int:
        """Token count with the backend's tokenizer where it has one; ~4 chars/token otherwise."""
        return max(1, len(text) // 4)

    def score(self, requests: Sequence[ChatRequest], texts: Sequence[str]) -> list[Completion]:
        """Teacher forcing: the model's log-probabilities of each stored `texts[i]` as the reply to `requests[i]`
        (its messages; `logprobs` = alternatives per token), nothing sampled. A Completion per text, `logprobs`
        set, or `error` set when the text could not be scored. Backends that cannot force a reply raise."""
        raise BackendError(f"{self.model_id} cannot score stored text (teacher forcing needs a llama.cpp backend, "
                           "local or smoke, or vLLM in-process)")

    def serves(self, task: str, question_id: str) -> bool:
        """Whether this backend can debate the question (a sample bank holds only its banked questions); a model
        answers anything."""
        return True

    def close(self) -> None:  # noqa: B027 (an optional hook: most backends hold nothing to free)
        """Free the backend's resources (model, server, connections)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serves(backend: object, task: str, question_id: str) -> bool:
    """`backend.serves(task, question_id)`, True for a duck-typed backend without the method (it answers anything)."""
    method = getattr(backend, "serves", None)
    return True if method is None else bool(method(task, question_id))
