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
