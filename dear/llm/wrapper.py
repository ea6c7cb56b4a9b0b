"""`BackendWrapper`: the base of backends that wrap another backend and change only part of what it does.

The response cache (dear/llm/cache.py), the call log of a rollout chunk (train/call_log.py) and the server's
shared batch (dear/serve/batching.py) each add one thing around a backend. This base passes the rest through, so a
wrapper states only what it changes:
- identity: `model_id`, `synthetic` and `context_length` are the wrapped backend's, read at each access (a wrapper
  never holds a stale copy);
- `generate`, `score`, `count_tokens` and `close` call the wrapped backend's (closing the wrapper closes the backend it
  wraps: it owns it, unless a subclass's `close` says otherwise);
- `fill_missing(requests, results)`: for a wrapper that answers some requests itself (the cache, the call log),
  the rest from the wrapped backend in one call;
- `serves` asks the wrapped backend through `dear.llm.base.serves` (a duck-typed backend without the method
  serves every question).
"""

from __future__ import annotations

from collections.abc import Sequence

from dear.llm.base import Backend, ChatRequest, Completion, serves


class BackendWrapper(Backend):
    """A backend that passes everything through to `inner` (see the module docstring); subclass it and override
    what the wrapper changes."""

    def __init__(self, inner: Backend):
        self.inner = inner

    @property
    def model_id(self) -> str:  # type: ignore[override]
        return self.inner.model_id

    @property
    def synthetic(self) -> bool:  # type: ignore[override]
        return self.inner.synthetic

    @property
    def context_length(self) -> int | None:  # type: ignore[override]
        return self.inner.context_length

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        return self.inner.generate(requests)

    def fill_missing(self, requests: Sequence[ChatRequest],
                     results: list[Completion | None]) -> list[tuple[int, Completion]]:
        """Ask the wrapped backend, in one call, for the requests whose entry in `results` is None (a wrapper that
        answers some requests itself, from a cache or a log) and put its completions there; returns them as
        (index, completion) pairs, [] without a call when nothing is missing. RuntimeError naming the wrapped
        backend when it returns another number of completions than it was asked for."""
        missing = [i for i, c in enumerate(results) if c is None]
        if not missing:
            return []
        fresh = self.inner.generate([requests[i] for i in missing])
        if len(fresh) != len(missing):
            raise RuntimeError(f"{type(self.inner).__name__} returned {len(fresh)} completions for "
                               f"{len(missing)} requests")
        for i, completion in zip(missing, fresh):
            results[i] = completion
        return list(zip(missing, fresh))

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def score(self, requests: Sequence[ChatRequest], texts: Sequence[str]) -> list[Completion]:
        return self.inner.score(requests, texts)

    def serves(self, task: str, question_id: str) -> bool:
        return serves(self.inner, task, question_id)

    def close(self) -> None:
        """Closes the wrapped backend."""
        self.inner.close()
