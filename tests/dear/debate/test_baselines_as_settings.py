"""The strong baselines are settings of the extended regulator's actions (turn kinds, a stop, a decision rule):
each protocol here reproduces the baseline's decisions exactly, against a scripted backend whose answer depends
only on the request (its seed), as a real model's sample does."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MADProtocol, MajorityProtocol
from dear.debate.protocols import SamplingRuleProtocol, SelfConsistencyProtocol, StopWhenUnanimousProtocol
from dear.tasks.types import Question
from dear.vote import tally
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text

QUESTIONS = [Question(id=f"q{k}", task="gsm8k", question=f"What is {k} + 1?", gold="3", kind="numeric")
             for k in range(12)]


def by_seed(request) -> str:
    """An answer that depends only on the request's content and seed (3 is right)."""
    h = zlib.crc32(f"{request.seed}|{request.messages[-1].content}".encode())
    return answer_text(request.metadata["agent"], request.metadata["round"], str(3 + h % 3))


def run(protocol, n_agents: int = 3, n_rounds: int | None = None):
    backend = FakeBackend(by_seed)
    engine = DebateEngine(backend, DebateConfig(n_agents=n_agents, n_rounds=n_rounds or 0, seed=5))
    return engine.run(QUESTIONS, protocol), backend


def test_sc9_as_fresh_samples_is_a_round0_of_nine_agents():
    wide, wide_backend = run(MajorityProtocol(), n_agents=9)
    sc, sc_backend = run(SelfConsistencyProtocol(3, 9), n_agents=3)
    wide_requests = {(r.seed, r.messages) for call in wide_backend.calls for r in call}
    sc_requests = {(r.seed, r.messages) for call in sc_backend.calls for r in call}
    assert sc_requests == wide_requests  # the same 9 requests per question: stored samples and caches serve it
    for a, b in zip(wide, sc):
        assert b.trace.vote_counts == a.trace.vote_counts
        assert b.trace.final_score == a.trace.final_score and b.n_samples == 9
        assert [t.fresh for t in b.trace.rounds[1]] == [True] * 3 and len(b.trace.rounds) == 3


@pytest.mark.parametrize("agree", [2, 3])
def test_adaptive_sc_is_the_sampling_rule_on_the_same_samples(agree):
    wide, _ = run(MajorityProtocol(), n_agents=9)
    adaptive, _ = run(SamplingRuleProtocol(f"adaptive-sc-{agree}", 3, max_samples=9), n_agents=3)
    for a, b in zip(wide, adaptive):
        keys = [t.answer_key for t in a.trace.rounds[0]]
        n = 3  # the rule, on the stored order of the nine samples
        while tally(keys[:n]).top < agree and n < 9:
            n += 1
        expected = tally(keys[:n])
        assert b.n_samples == n
        assert b.trace.vote_counts == expected.counts
        assert b.trace.final_score == expected.score({"3": True})


def test_mad_stop_is_mad_that_stops_at_unanimity():
    mad, _ = run(MADProtocol(3, 2), n_rounds=2)
    stop, _ = run(StopWhenUnanimousProtocol(3, 2), n_rounds=2)
    stopped = 0
    for a, b in zip(mad, stop):
        for r, turns in enumerate(b.trace.rounds):  # the rounds it ran are MAD's
            assert [t.text for t in turns] == [t.text for t in a.trace.rounds[r]]
        unanimous = [r for r, turns in enumerate(a.trace.rounds) if len({t.answer_key for t in turns}) == 1]
        assert len(b.trace.rounds) == (unanimous[0] + 1 if unanimous else 3)
        stopped += len(b.trace.rounds) < 3
    assert stopped > 0


def test_round0_majority_is_a_debate_stopped_before_its_first_exchange():
    majority, _ = run(MajorityProtocol(), n_agents=3)
    stopped, backend = run(StopWhenUnanimousProtocol(3, 2, always=True), n_rounds=2)
    assert len(backend.calls) == 1  # round 0 only
    for a, b in zip(majority, stopped):
        assert b.trace.vote_counts == a.trace.vote_counts and b.trace.final_score == a.trace.final_score


def test_keep_and_fresh_turns():
    sc, backend = run(SelfConsistencyProtocol(3, 4), n_agents=3)
    for d in sc:
        last = d.trace.rounds[1]
        assert [t.fresh for t in last] == [True, False, False]
        assert [t.silent for t in last] == [False, True, True] and last[1].text == d.trace.rounds[0][1].text
        assert last[1].completion_tokens == 0 and d.n_samples == 4
        # all-answers: a kept answer does not vote twice
        assert sum(d.trace.vote_counts.values()) == 4
    bad = np.zeros((3, 3), dtype=bool)
    from dear.debate import RoundControl

    with pytest.raises(ValueError, match="kinds"):
        RoundControl(bad, 0.7, 0.9, kinds=("fresh", "nap", "keep"))


def test_a_revision_after_a_fresh_sample_continues_the_fresh_conversation():
    """Multiturn layout: an agent that drew a fresh sample and then revises sees the fresh sample as its own
    previous answer, not its round-0 conversation."""
    from dear.debate import RoundControl
    from dear.debate.protocols import Protocol

    class FreshThenRevise(Protocol):
        n_rounds = 2

        def controls(self, debates):
            kinds = ("fresh", "keep", "keep") if debates[0].round == 0 else ("revise", "keep", "keep")
            mask = np.zeros((3, 3), dtype=bool)
            mask[0, 1] = debates[0].round == 1
            return [RoundControl(mask, 0.7, 0.9, kinds=kinds) for _ in debates]

    debates, backend = run(FreshThenRevise(), n_rounds=2)
    d = debates[0]
    revise = next(r for r in backend.calls[-1] if r.metadata["debate_id"] == d.debate_id and r.metadata["agent"] == 0)
    assert revise.messages[2].content == d.trace.rounds[1][0].text  # the fresh sample is the assistant turn
    assert d.trace.rounds[0][0].text not in [m.content for m in revise.messages]
