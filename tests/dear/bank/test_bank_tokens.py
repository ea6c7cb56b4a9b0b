"""The bank world's tokens (issue 59 item 1): replayed samples count their recorded completion tokens as replayed
(`REPLAYED_TOKENS`), never as generated, so a progress line shows a bank world's tokens and says where they came
from; a live backend's samples count as generated, by the live backend."""

from __future__ import annotations

from dear.bank.backend import BankBackend
from dear.llm.base import GENERATED_TOKENS, REPLAYED_TOKENS, Backend, Completion, count_generated
from tests.dear.bank.test_bank_backend import _bank, _run


class CountingLive(Backend):
    """A live model that counts what it generates, as every generating backend does."""

    model_id = "live:counting"

    def generate(self, requests):
        return count_generated([Completion("Final answer: \\boxed{99}", 40, 10, "stop", 0.0) for _ in requests])


def test_replayed_samples_count_as_replayed_tokens_not_generated(tmp_path):
    generated, replayed = GENERATED_TOKENS.total(), REPLAYED_TOKENS.total()
    (d,) = _run(BankBackend(_bank(tmp_path), "gsm8k", "test"), n_agents=3)
    turns = d.trace.rounds[0]
    assert all(t.source.startswith("bank:") for t in turns)
    assert REPLAYED_TOKENS.total() - replayed == sum(t.completion_tokens for t in turns) > 0
    assert GENERATED_TOKENS.total() == generated


def test_samples_beyond_the_bank_count_as_generated_by_the_live_model(tmp_path):
    """Two stored samples and a third from the live model: 2 replayed, 1 generated, nothing counted twice."""
    generated, replayed = GENERATED_TOKENS.total(), REPLAYED_TOKENS.total()
    (d,) = _run(BankBackend(_bank(tmp_path, n=2), "gsm8k", "test", live=CountingLive()), n_agents=3)
    turns = d.trace.rounds[0]
    stored = [t for t in turns if t.source.startswith("bank:")]
    assert len(stored) == 2 and [t.source for t in turns].count("live:counting") == 1
    assert REPLAYED_TOKENS.total() - replayed == sum(t.completion_tokens for t in stored)
    assert GENERATED_TOKENS.total() - generated == 10
