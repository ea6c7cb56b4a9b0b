"""A debate that starts from fewer samples than agents (DebateConfig.start_width): the other seats wait with no call
and no answer until a fresh turn, and sample n is the very request a full round 0 sends to agent n."""

from __future__ import annotations

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine
from dear.debate.engine import RoundControl
from dear.debate.picture import turn_kind
from tests.dear.debate.test_baselines_as_settings import QUESTIONS, by_seed
from tests.dear.debate.test_debate_engine import FakeBackend


def engine(start_width: int | None, n_rounds: int = 2, decision: str = "all-answers"):
    backend = FakeBackend(by_seed)
    return DebateEngine(backend, DebateConfig(n_agents=3, n_rounds=n_rounds, seed=5, start_width=start_width,
                                              decision=decision)), backend


def control(kinds, mask=None, stop=False) -> RoundControl:
    m = np.zeros((3, 3), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    return RoundControl(mask=m, temperature=np.full(3, 0.7), top_p=np.full(3, 0.9), kinds=tuple(kinds), stop=stop)


def test_round0_sends_only_the_first_samples_and_seats_the_rest_waiting():
    eng, backend = engine(1)
    (d,) = eng.start(QUESTIONS[:1])
    assert [len(call) for call in backend.calls] == [1]
    first, *rest = d.trace.rounds[0]
    assert not first.waiting and first.answer_key is not None
    assert all(t.waiting and t.answer_key is None and t.prompt_tokens == t.completion_tokens == 0 for t in rest)
    assert [turn_kind(t) for t in d.trace.rounds[0]] == ["sample", "waiting", "waiting"]
    assert d.n_samples == 1 and d.vote("all-answers").counts == {first.answer_key: 1}


def test_waiting_agents_join_with_the_samples_a_full_round0_would_draw():
    eng, backend = engine(1)
    (d,) = eng.start(QUESTIONS[:1])
    # agent 1 draws fresh; agent 2 is asked to revise but has no answer: it joins with a fresh sample too
    eng.step([d], [control(("keep", "fresh", "revise"))])
    wide_engine, wide_backend = engine(None, n_rounds=0)
    wide_engine.start(QUESTIONS[:1])
    joined = {(r.seed, r.messages) for call in backend.calls for r in call}
    assert joined == {(r.seed, r.messages) for call in wide_backend.calls for r in call}
    assert [t.fresh for t in d.trace.rounds[1]] == [False, True, True] and d.n_samples == 3
    assert [(t.round, t.agent) for t in d.voters("all-answers")] == [(0, 0), (1, 1), (1, 2)]


def test_a_waiting_agent_that_keeps_stays_waiting_and_nobody_reads_it():
    eng, backend = engine(1)
    (d,) = eng.start(QUESTIONS[:1])
    reads_everyone = np.ones((3, 3), dtype=bool) & ~np.eye(3, dtype=bool)
    eng.step([d], [control(("revise", "keep", "keep"), mask=reads_everyone)])
    assert d.trace.rounds[1][0].peers == [] and all(t.waiting for t in d.trace.rounds[1][1:])
    assert len(backend.calls[-1]) == 1 and d.n_samples == 1


def test_start_width_must_seat_at_least_one_agent_and_at_most_all():
    for bad in (0, 4):
        with pytest.raises(ValueError, match="start_width"):
            DebateConfig(n_agents=3, start_width=bad)
    assert DebateConfig(n_agents=3).round0_width == 3 and DebateConfig(n_agents=3, start_width=2).round0_width == 2


def test_a_sample_budget_turns_fresh_turns_past_it_into_keeps():
    backend = FakeBackend(by_seed)
    eng = DebateEngine(backend, DebateConfig(n_agents=3, n_rounds=3, seed=5, start_width=1, max_samples=4,
                                             decision="all-answers"))
    (d,) = eng.start(QUESTIONS[:1])
    eng.step([d], [control(("fresh", "fresh", "keep"))])  # samples 2 and 3 (agent 1 joins, agent 0 redraws)
    eng.step([d], [control(("fresh", "fresh", "revise"))])  # only one more fits: agent 0's; 1 keeps, 2 waits
    assert d.n_samples == 4 and sum(len(call) for call in backend.calls) == 4
    assert [t.fresh for t in d.trace.rounds[2]] == [True, False, False] and d.trace.rounds[2][2].waiting
    eng.step([d], [control(("fresh", "fresh", "fresh"))])  # the budget is spent: nobody draws
    assert d.n_samples == 4 and sum(len(call) for call in backend.calls) == 4
    with pytest.raises(ValueError, match="max_samples must be >= round 0's 3 answers"):
        DebateConfig(n_agents=3, max_samples=2)


def test_a_round_budget_serves_the_askers_in_a_seat_order_that_rotates():
    backend = FakeBackend(by_seed)
    eng = DebateEngine(backend, DebateConfig(n_agents=3, n_rounds=5, seed=5, start_width=1, fresh_per_round=1,
                                             decision="all-answers"))
    (d,) = eng.start(QUESTIONS[:1])
    eng.step([d], [control(("fresh", "keep", "fresh"))])  # round 1's order starts at seat 1: agent 2 joins
    assert d.n_samples == 2 and [t.fresh for t in d.trace.rounds[1]] == [False, False, True]
    assert d.trace.rounds[1][1].waiting
    eng.step([d], [control(("fresh", "revise", "fresh"))])  # round 2 starts at seat 2: agent 2 redraws; 1 waits
    assert d.n_samples == 3 and [t.fresh for t in d.trace.rounds[2]] == [False, False, True]
    assert d.trace.rounds[2][1].waiting
    eng.step([d], [control(("fresh", "fresh", "fresh"))])  # round 3 starts at seat 0
    eng.step([d], [control(("fresh", "fresh", "fresh"))])  # round 4 at seat 1: the waiting agent joins
    assert [t.fresh for t in d.trace.rounds[3]] == [True, False, False]
    assert [t.fresh for t in d.trace.rounds[4]] == [False, True, False] and not d.trace.rounds[4][1].waiting
    eng.step([d], [control(("keep", "keep", "keep"))])  # nobody asks, nobody draws
    assert d.n_samples == 5 and sum(len(call) for call in backend.calls) == 5
    with pytest.raises(ValueError, match="fresh_per_round must be >= 1"):
        DebateConfig(n_agents=3, fresh_per_round=0)


def test_shared_prompt_numbers_every_sample_from_sample_0s_seed():
    """DebateConfig.shared_prompt: round-0 agent n and the n-th fresh sample both take sample 0's seed + n, so a wide
    round 0 is one run of requests that differ only in seeds counting up by one (llama.cpp reads its prompt once)."""
    backend = FakeBackend(by_seed)
    eng = DebateEngine(backend, DebateConfig(n_agents=3, n_rounds=2, seed=5, start_width=1, shared_prompt=True))
    (d,) = eng.start(QUESTIONS[:1])
    eng.step([d], [control(("keep", "fresh", "fresh"))])
    eng.step([d], [control(("fresh", "keep", "keep"))])
    seeds = [r.seed for call in backend.calls for r in call]
    assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2, seeds[0] + 3]
    wide = FakeBackend(by_seed)
    DebateEngine(wide, DebateConfig(n_agents=3, n_rounds=0, seed=5, shared_prompt=True)).start(QUESTIONS[:1])
    requests = wide.calls[0]
    assert [r.seed for r in requests] == seeds[:3]
    from dear.llm.local import shared_prompt_runs
    assert shared_prompt_runs(requests, limit=9) == [[0, 1, 2]]
    default = FakeBackend(by_seed)
    DebateEngine(default, DebateConfig(n_agents=3, n_rounds=0, seed=5)).start(QUESTIONS[:1])
    assert shared_prompt_runs(default.calls[0], limit=9) == [[0], [1], [2]]  # derived seeds: one request each
