"""The debate engine and CLI against the real smoke model (SmolLM2-135M through llama.cpp). Marked slow."""

from __future__ import annotations

import json

import pytest

from dear import tasks
from dear.debate import DebateConfig, DebateEngine, DebateTrace, MADProtocol, read_jsonl, summarize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_backend():
    from dear.llm.registry import make_backend

    be = make_backend("smoke", n_parallel=3, n_ctx=2048)
    yield be
    be.close()


def test_real_two_round_three_agent_debate(smoke_backend):
    questions = tasks.load("gsm8k", n=1, seed=0)
    engine = DebateEngine(smoke_backend, DebateConfig(n_agents=3, n_rounds=2, max_tokens=48, seed=0))
    (d,) = engine.run(questions, MADProtocol(3, 2))
    tr = d.trace
    assert d.done and not d.failed, tr.error
    assert len(tr.rounds) == 3 and all(len(r) == 3 for r in tr.rounds)
    assert engine.stats.generate_calls == 3
    for turns in tr.rounds:
        for t in turns:
            assert t.error is None and t.text
            assert t.prompt_tokens > 50 and 0 < t.completion_tokens <= 48
            assert t.reasoning and t.conclusion
    # Round-1 prompts carry the peers' previous answers (full mask): both, in the newest user turn (the default
    # multiturn layout appends them to the agent's own conversation).
    assert tr.rounds[1][0].messages[-1]["content"].count("One agent's answer:") == 2
    assert tr.prompt_tokens == sum(t.prompt_tokens for r in tr.rounds for t in r)
    # Later rounds read peers' answers, so their prompts are longer than round 0's.
    assert tr.rounds[1][0].prompt_tokens > tr.rounds[0][0].prompt_tokens
    back = DebateTrace.from_json(json.dumps(tr.to_dict()))
    assert back == tr
    s = summarize([d])
    assert s.tokens_per_question == tr.total_tokens > 0


def test_cli_runs_and_second_run_is_served_from_cache(tmp_path, capsys):
    from dear.debate.__main__ import main

    argv = ["--task", "gsm8k", "--n", "1", "--protocol", "mad", "--llm", "smoke", "--n-agents", "2",
            "--n-rounds", "1", "--max-tokens", "32", "--cache", str(tmp_path / "c.sqlite"),
            "--out", str(tmp_path / "t.jsonl")]
    main(argv)
    first = capsys.readouterr().out
    assert "accuracy" in first and "tokens/question" in first and "cache hits        0/4" in first
    main(argv)
    second = capsys.readouterr().out
    assert "cache hits        4/4" in second
    (tr,) = read_jsonl(tmp_path / "t.jsonl")
    assert len(tr.rounds) == 2 and all(t.cached for r in tr.rounds for t in r)


def test_real_debate_with_every_turn_kind_a_stop_and_the_all_answers_vote(smoke_backend):
    """One real debate per new action: fresh samples and kept answers (self-consistency with 5 samples), a
    revision after a fresh sample, and a stop (the round-0 majority as a debate stopped before its first exchange;
adaptive SC adds samples while no answer has a second vote, and the smoke model's answers rarely parse)."""
    import numpy as np

    from dear.debate import RoundControl
    from dear.vote import tally
    from dear.debate.protocols import SamplingRuleProtocol, Protocol, SelfConsistencyProtocol, StopWhenUnanimousProtocol

    questions = tasks.load("gsm8k", n=1, seed=0)
    engine = DebateEngine(smoke_backend, DebateConfig(n_agents=3, n_rounds=2, max_tokens=32, seed=0))
    (sc,) = engine.run(questions, SelfConsistencyProtocol(3, 5))
    assert not sc.failed and sc.n_samples == 5 and sc.decision == "all-answers"
    assert [t.fresh for t in sc.trace.rounds[1]] == [True, True, False]
    assert sc.trace.rounds[1][2].silent and sc.trace.rounds[1][2].completion_tokens == 0
    fresh = sc.trace.rounds[1][0]
    assert fresh.messages == sc.trace.rounds[0][0].messages and fresh.completion_tokens > 0  # the question alone
    assert sum(sc.trace.vote_counts.values()) == sum(t.answer_key is not None for t in sc.voters("all-answers"))

    class FreshThenRevise(Protocol):
        n_rounds = 2

        def controls(self, debates):
            mask = np.zeros((3, 3), dtype=bool)
            mask[0, 1] = debates[0].round == 1
            kinds = ("fresh", "keep", "keep") if debates[0].round == 0 else ("revise", "keep", "keep")
            return [RoundControl(mask, 0.7, 0.9, kinds=kinds) for _ in debates]

    (d,) = engine.run(questions, FreshThenRevise())
    revise = d.trace.rounds[2][0]
    assert not d.failed and revise.peers == [1] and not revise.fresh and revise.completion_tokens > 0
    assert revise.messages[2]["content"] == d.trace.rounds[1][0].text  # continues the fresh sample's conversation

    (stopped,) = engine.run(questions, StopWhenUnanimousProtocol(3, 2, always=True))
    assert len(stopped.trace.rounds) == 1 and stopped.done and stopped.trace.final_score is not None
    (adaptive,) = engine.run(questions, SamplingRuleProtocol("adaptive-sc-2", 3, max_samples=5))
    keys = [t.answer_key for t in adaptive.voters("all-answers")]
    assert adaptive.n_samples == len(keys) <= 5 and (tally(keys).top >= 2 or adaptive.n_samples == 5)
