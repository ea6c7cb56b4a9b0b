"""dear/confidence.py: the summaries on hand-computed cases, the compact per-token arrays, traces with and without
confidence, and a real smoke-model generation through the embedded llama.cpp path."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from dear.confidence import (TAIL, WINDOW, TokenArrays, answer_span, confidence_dict, record_of, resummarise,
                             summarise)
from dear.debate.trace import AgentTurn, DebateTrace
from dear.llm.base import ChatMessage, ChatRequest, Completion, TokenLogprobs


def _lp(chosen, top, nbytes=None):
    return TokenLogprobs(tuple(chosen), tuple(tuple(t) for t in top), tuple(nbytes or [1] * len(chosen)))


def test_summaries_on_a_hand_computed_case():
    # 4 one-byte tokens "ab42"; values exact in float16
    lp = _lp([-0.5, -1.0, -0.25, -2.0], [[-0.5, -1.5], [-0.5, -1.0], [-0.25, -2.25], [-1.0, -2.0]])
    rec = summarise(TokenArrays.from_logprobs(lp), answer_span("ab42", "42"), k=2)
    assert rec.mean_logprob == pytest.approx(-0.9375)
    # token confidence c_i = -mean(top-2) = 1.0, 0.75, 1.25, 1.5; one window (4 < WINDOW): the mean
    assert rec.lowest_group == pytest.approx(1.125) and WINDOW > 4
    assert rec.tail_mean == pytest.approx(-0.9375)  # all 4 tokens are within the tail
    assert rec.answer_mean == pytest.approx(-1.125)  # tokens "4" and "2"
    assert rec.margin == pytest.approx((1.0 + 0.5 + 2.0 + 1.0) / 4)


def test_lowest_group_is_the_worst_window_and_tail_the_last_tokens():
    n = WINDOW + TAIL
    chosen = [-0.1] * n
    chosen[5] = -5.0
    top = [[c, c - 1.0] for c in chosen]  # c_i = -(2c - 1)/2 = 0.5 - c
    rec = summarise(TokenArrays.from_logprobs(_lp(chosen, top)), None, k=2)
    arr = np.array(chosen, dtype=np.float16).astype(float)
    conf = 0.5 - arr
    assert rec.lowest_group == pytest.approx(min(conf[i:i + WINDOW].mean() for i in range(n - WINDOW + 1)), abs=1e-3)
    assert rec.tail_mean == pytest.approx(arr[-TAIL:].mean(), abs=1e-4)
    assert rec.answer_mean is None


def test_answer_span_is_in_bytes_and_takes_the_last_occurrence():
    assert answer_span("x=42, so 42", "42") == (9, 11)
    assert answer_span("é 7", "7") == (3, 4)  # é is two bytes
    assert answer_span("no answer", None) is None and answer_span("abc", "9") is None


def test_missing_log_probabilities_are_a_marker_never_a_number():
    assert confidence_dict(None, "text", "1", "server sent none") == {"missing": "server sent none"}
    assert record_of({"missing": "server sent none"}) is None and record_of(None) is None


def test_stored_arrays_resummarise_to_the_stored_record():
    rng = np.random.default_rng(0)
    chosen = -rng.exponential(0.5, 60)
    top = [sorted([c, c - 1.0, c - 2.5], reverse=True) for c in chosen]
    text = "a" * 57 + " 12"
    stored = json.loads(json.dumps(confidence_dict(_lp(chosen, top), text, "12", "-")))
    assert resummarise(stored, text, "12") == record_of(stored)
    assert len(stored["per_token"]["logprob"]) < 3 * 60  # 2 bytes a token, base64


def _turn(**kw) -> AgentTurn:
    base = dict(agent=0, round=0, messages=[], text="42", reasoning="r", conclusion="c", answer="42",
                answer_key="42", correct=True, grader="exact", temperature=0.7, top_p=0.9, seed=1, peers=[],
                prompt_tokens=3, completion_tokens=1, finish_reason="stop", latency_s=0.1)
    return AgentTurn(**{**base, **kw})


def test_traces_round_trip_with_and_without_confidence():
    conf = confidence_dict(_lp([-0.5], [[-0.5, -1.0]], [2]), "42", "42", "-")
    trace = DebateTrace("d", "q", "gsm8k", "Q?", "42", "numeric", ["m"], rounds=[[_turn(), _turn(confidence=conf)]])
    d = json.loads(trace.to_json())
    assert "confidence" not in d["rounds"][0][0]  # a turn without confidence is written as before
    back = DebateTrace.from_json(trace.to_json())
    assert back.rounds[0][0].confidence is None and back.rounds[0][1].confidence == conf
    assert record_of(back.rounds[0][1].confidence).answer_mean == pytest.approx(-0.5)


def test_a_cached_completion_keeps_its_log_probabilities():
    """The response cache stores `asdict(completion)` and rebuilds it with `Completion(**fields)`."""
    c = Completion("hi", 3, 1, "stop", 0.1, logprobs=_lp([-0.5], [[-0.5, -1.0]], [2]))
    back = Completion(**json.loads(json.dumps(asdict(c))))
    assert back.logprobs == c.logprobs and Completion(**{**asdict(c), "logprobs": None}).logprobs is None


# --- the real embedded path (llama.cpp in-process), on the smoke model ---------------------------------------


@pytest.fixture(scope="module")
def smoke(smoke_backend):
    return smoke_backend


def test_local_llama_returns_log_probabilities_when_asked(smoke):
    prompt = (ChatMessage("user", "What is 6 times 7?"),)
    asked, plain = smoke.generate([ChatRequest(prompt, seed=3, max_tokens=12, logprobs=4),
                                   ChatRequest(prompt, seed=3, max_tokens=12)])
    assert plain.logprobs is None and asked.text == plain.text  # asking changes nothing that was sampled
    lp = asked.logprobs
    # The log-probabilities cover the returned text exactly; the usage count may add the end-of-generation token and
    # a matched stop string, which the server streams no log-probability for.
    assert sum(lp.nbytes) == len(asked.text.encode("utf-8")) and all(len(t) == 4 for t in lp.top)
    assert 0 < len(lp.chosen) <= asked.completion_tokens
    # the sampled token is never more likely than the most likely one
    assert all(c <= t[0] + 1e-6 for c, t in zip(lp.chosen, lp.top))


def test_a_debate_that_asks_records_confidence_on_every_turn(smoke):
    from dear import tasks
    from dear.debate.engine import DebateConfig, DebateEngine
    from dear.debate.protocols import MajorityProtocol

    (q,) = tasks.load("gsm8k", "test", n=1)
    cfg = DebateConfig(n_agents=2, n_rounds=0, max_tokens=24, logprobs=2)
    (d,) = DebateEngine(smoke, cfg).run([q], MajorityProtocol())
    for turn in d.trace.rounds[0]:
        rec = record_of(turn.confidence)
        assert 0 < rec.n_tokens <= turn.completion_tokens and rec.k == 2 and rec.mean_logprob < 0
        assert int(TokenArrays.decode(turn.confidence["per_token"]).nbytes.sum()) == len(turn.text.encode("utf-8"))
        assert resummarise(turn.confidence, turn.text, turn.answer) == rec
    (plain,) = DebateEngine(smoke, DebateConfig(n_agents=1, n_rounds=0, max_tokens=8)).run([q], MajorityProtocol())
    assert plain.trace.rounds[0][0].confidence is None
