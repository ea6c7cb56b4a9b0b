"""BackendWrapper (dear/llm/wrapper.py): what a wrapper passes through to the backend it wraps, and the wrappers
built on it (response cache, call log, shared batch)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dear.llm.base import Backend, ChatMessage, ChatRequest, Completion, serves
from dear.llm.cache import CachedBackend
from dear.llm.wrapper import BackendWrapper
from dear.serve.batching import SharedBatch
from train.call_log import CallLog


class Inner(Backend):
    """Test double: echoes each prompt, serves every question but "banned", counts words, records close."""

    def __init__(self):
        self.model_id = "inner-model"
        self.synthetic = True
        self.context_length = 4096
        self.calls: list[int] = []  # batch sizes
        self.closed = False

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.calls.append(len(requests))
        return [Completion(r.messages[-1].content, 1, 1, "stop", 0.0) for r in requests]

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def serves(self, task: str, question_id: str) -> bool:
        return question_id != "banned"

    def close(self) -> None:
        self.closed = True


class Short(Inner):
    """Returns one completion fewer than it was asked for."""

    def generate(self, requests):
        return super().generate(requests)[:-1]


class DuckTyped:
    """A backend by duck typing: no `serves`, no `count_tokens`."""

    model_id, synthetic, context_length = "duck", False, None

    def generate(self, requests):
        return [Completion("quack", 1, 1, "stop", 0.0) for _ in requests]


def req(text: str) -> ChatRequest:
    return ChatRequest((ChatMessage("user", text),))


def test_everything_passes_through_to_the_wrapped_backend():
    inner = Inner()
    wrapper = BackendWrapper(inner)
    assert (wrapper.model_id, wrapper.synthetic, wrapper.context_length) == ("inner-model", True, 4096)
    assert [c.text for c in wrapper.generate([req("a"), req("b")])] == ["a", "b"] and inner.calls == [2]
    assert wrapper.count_tokens("three short words") == 3
    assert wrapper.serves("gsm8k", "q1") and not wrapper.serves("gsm8k", "banned")
    assert serves(wrapper, "gsm8k", "q1") and not serves(wrapper, "gsm8k", "banned")
    wrapper.close()
    assert inner.closed


def test_the_identity_is_read_from_the_wrapped_backend_at_each_access():
    inner = Inner()
    wrapper = BackendWrapper(inner)
    inner.context_length = 8192  # e.g. learnt after connecting
    assert wrapper.context_length == 8192


def test_a_duck_typed_backend_without_serves_serves_every_question():
    wrapper = BackendWrapper(DuckTyped())  # type: ignore[arg-type]
    assert wrapper.serves("gsm8k", "anything") and wrapper.model_id == "duck" and wrapper.context_length is None


def test_fill_missing_asks_only_for_the_missing_requests_in_one_call():
    inner = Inner()
    wrapper = BackendWrapper(inner)
    requests = [req("a"), req("b"), req("c"), req("d")]
    known = Completion("stored", 0, 0, "stop", 0.0, cached=True)
    results: list[Completion | None] = [known, None, known, None]
    fresh = wrapper.fill_missing(requests, results)
    assert inner.calls == [2]
    assert [(i, c.text) for i, c in fresh] == [(1, "b"), (3, "d")]
    assert [c.text for c in results] == ["stored", "b", "stored", "d"]
    assert wrapper.fill_missing(requests, results) == [] and inner.calls == [2]  # nothing missing: no call


def test_fill_missing_names_a_backend_that_returns_too_few_completions():
    with pytest.raises(RuntimeError, match=r"Short returned 1 completions for 2 requests"):
        BackendWrapper(Short()).fill_missing([req("a"), req("b")], [None, None])


@pytest.fixture(params=["cache", "call_log", "shared_batch"])
def wrapped(request, tmp_path):
    """(inner, wrapper, whether closing the wrapper closes inner) for each wrapper built on BackendWrapper."""
    inner = Inner()
    if request.param == "cache":
        return inner, CachedBackend(inner, tmp_path / "c.sqlite"), True
    if request.param == "call_log":
        return inner, CallLog(inner), True
    return inner, SharedBatch(inner), False  # the server owns the backend the batch shares


def test_each_wrapper_keeps_the_wrapped_backends_identity_and_answers(wrapped):
    inner, wrapper, owns = wrapped
    assert isinstance(wrapper, BackendWrapper)
    assert (wrapper.model_id, wrapper.synthetic, wrapper.context_length) == ("inner-model", True, 4096)
    assert wrapper.count_tokens("two words") == 2
    assert not wrapper.serves("gsm8k", "banned") and wrapper.serves("gsm8k", "q1")
    assert [c.text for c in wrapper.generate([req("x"), req("y")])] == ["x", "y"]
    wrapper.close()
    assert inner.closed is owns
