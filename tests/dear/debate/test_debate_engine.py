"""Debate engine, prompts, votes, protocols and traces against a scripted fake backend (fast, no model)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from dear.debate import (
    DebateConfig,
    DebateEngine,
    DebateTrace,
    MADProtocol,
    MajorityProtocol,
    RandomMaskProtocol,
    RoundControl,
    make_protocol,
    prompts,
    read_jsonl,
    summarize,
    write_jsonl,
)
from dear.vote import vote
from dear.llm.base import Backend, ChatRequest, Completion
from dear.tasks.types import Question


def answer_text(agent: int, rnd: int, answer: str) -> str:
    return (
        f"Reasoning: reasoning-of-agent-{agent}-round-{rnd}. Some steps.\n"
        f"Conclusion: conclusion-of-agent-{agent}-round-{rnd}.\n"
        f"Final answer: \\boxed{{{answer}}}"
    )


class FakeBackend(Backend):
    """Scripted backend: records every batch; `script(request) -> text or Completion`."""

    def __init__(self, script: Callable[[ChatRequest], str | Completion] | None = None,
                 context_length: int | None = None, model_id: str = "fake"):
        self.script = script or (lambda r: answer_text(r.metadata["agent"], r.metadata["round"], "18"))
        self.context_length = context_length
        self.model_id = model_id
        self.calls: list[list[ChatRequest]] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            res = self.script(r)
            if isinstance(res, Completion):
                out.append(res)
                continue
            prompt = "".join(m.content for m in r.messages)
            out.append(Completion(res, self.count_tokens(prompt), self.count_tokens(res), "stop", 0.01))
        return out


def gsm(i: int = 0, gold: str = "18") -> Question:
    return Question(id=f"q{i}", task="gsm8k", question=f"Janet has {i} ducks. How many eggs?", gold=gold,
                    kind="numeric")


def user_prompt(req: ChatRequest) -> str:
    return req.messages[-1].content


# ------------------------------------------------------------------ engine
def test_round0_prompt_and_metadata():
    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2))
    debates = eng.start([gsm(0)])
    (batch,) = be.calls
    assert len(batch) == 3
    req = batch[0]
    assert req.messages[0].role == "system" and req.messages[1].role == "user"
    assert "Janet has 0 ducks" in user_prompt(req)
    assert "Reasoning:" in user_prompt(req) and "Conclusion:" in user_prompt(req)
    md = req.metadata
    assert md["debate_id"] == debates[0].debate_id and md["question_id"] == "q0"
    assert md["agent"] == 0 and md["round"] == 0 and md["own_answer"] is None and md["peer_answers"] == []
    assert md["question_text"] == gsm(0).question
    assert debates[0].answers == ["18"] * 3 and debates[0].round == 0 and not debates[0].done
    turn = debates[0].trace.rounds[0][1]
    assert turn.correct and turn.reasoning.startswith("reasoning-of-agent-1-round-0")
    assert turn.conclusion == "conclusion-of-agent-1-round-0."


def test_mask_changes_what_each_prompt_contains():
    be = FakeBackend(lambda r: answer_text(r.metadata["agent"], r.metadata["round"], str(10 + r.metadata["agent"])))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1, layout="single"))  # the single layout's wording
    debates = eng.start([gsm(0, gold="10")])
    mask = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 0]], dtype=bool)
    eng.step(debates, [RoundControl(mask, np.full(3, 0.7), np.full(3, 0.9))])
    r1 = be.calls[1]
    p0, p1, p2 = (user_prompt(r) for r in r1)
    # Own previous answer always shown.
    for i, p in enumerate((p0, p1, p2)):
        assert f"reasoning-of-agent-{i}-round-0" in p
    assert "reasoning-of-agent-1-round-0" in p0 and "Agent 2:" in p0
    assert "reasoning-of-agent-2-round-0" not in p0 and "Agent 3:" not in p0
    assert "reasoning-of-agent-0-round-0" not in p1 and "reasoning-of-agent-2-round-0" not in p1
    assert "Answers from other agents" not in p1
    assert "reasoning-of-agent-0-round-0" in p2 and "reasoning-of-agent-1-round-0" in p2
    assert [r.metadata["peer_answers"] for r in r1] == [["11"], [], ["10", "11"]]
    assert [r.metadata["own_answer"] for r in r1] == ["10", "11", "12"]
    tr = debates[0].trace
    assert [t.peers for t in tr.rounds[1]] == [[1], [], [0, 1]]
    np.testing.assert_array_equal(tr.masks()[1], mask)
    assert not tr.masks()[0].any()
    assert debates[0].done and tr.final_answer in {"10", "11", "12"} and tr.tie


def test_advance_batches_new_and_running_debates_in_one_call():
    """What the server does between requests: round 0 of a newly admitted debate and round 1 of a running one
    go out in one generate call, and each gets exactly what start()/step() alone would have sent."""
    cfg = DebateConfig(n_agents=3, n_rounds=2, seed=5)
    ctl = RoundControl(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=bool), np.full(3, 0.3), np.full(3, 0.8))
    be = FakeBackend()
    eng = DebateEngine(be, cfg)
    running = eng.start([gsm(0)])
    new = eng.create([gsm(1)])
    assert new[0].round == -1 and not new[0].trace.rounds
    eng.advance(new, running, [ctl])
    assert len(be.calls) == 2 and len(be.calls[1]) == 6
    assert [r.metadata["round"] for r in be.calls[1]] == [0, 0, 0, 1, 1, 1]
    assert new[0].round == 0 and running[0].round == 1
    alone = FakeBackend()
    eng_alone = DebateEngine(alone, cfg)
    eng_alone.step(eng_alone.start([gsm(0)]), [ctl])
    eng_alone.start([gsm(1)])
    assert sorted((r.seed, r.messages) for r in be.calls[1]) == sorted(
        (r.seed, r.messages) for r in alone.calls[1] + alone.calls[2])
    with pytest.raises(ValueError, match="already run round 0"):
        eng.advance(new, [], [])
    with pytest.raises(ValueError, match="has not run round 0"):
        eng.advance([], eng.create([gsm(2)]), [ctl])


def test_per_request_sampling_and_seeds_reach_backend():
    be = FakeBackend()
    cfg = DebateConfig(n_agents=3, n_rounds=1, temperature0=0.3, top_p0=0.8, max_tokens=77, seed=5)
    eng = DebateEngine(be, cfg)
    debates = eng.start([gsm(0), gsm(1)])
    assert all(r.temperature == 0.3 and r.top_p == 0.8 and r.max_tokens == 77 for r in be.calls[0])
    ctl = RoundControl(~np.eye(3, dtype=bool), np.array([0.1, 0.5, 1.2]), np.array([0.5, 0.75, 1.0]))
    eng.step(debates, [ctl, ctl])
    r1 = be.calls[1]
    assert [r.temperature for r in r1] == [0.1, 0.5, 1.2, 0.1, 0.5, 1.2]
    assert [r.top_p for r in r1] == [0.5, 0.75, 1.0, 0.5, 0.75, 1.0]
    seeds = [r.seed for batch in be.calls for r in batch]
    assert len(set(seeds)) == len(seeds)  # distinct per (debate, agent, round)
    t = debates[0].trace.rounds[1][2]
    assert (t.temperature, t.top_p) == (1.2, 1.0)
    # Deterministic: a second engine sends the same seeds; another config seed changes them.
    be2 = FakeBackend()
    eng2 = DebateEngine(be2, cfg)
    eng2.step(eng2.start([gsm(0), gsm(1)]), [ctl, ctl])
    assert [r.seed for batch in be2.calls for r in batch] == seeds
    be3 = FakeBackend()
    DebateEngine(be3, DebateConfig(n_agents=3, n_rounds=1, seed=6)).start([gsm(0), gsm(1)])
    assert [r.seed for r in be3.calls[0]] != seeds[:6]


def test_one_generate_call_per_round_for_all_debates():
    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2))
    debates = eng.run([gsm(i) for i in range(4)], MADProtocol(3, 2))
    assert len(be.calls) == 3 and [len(c) for c in be.calls] == [12, 12, 12]
    assert eng.stats.generate_calls == 3 and eng.stats.requests == 36
    assert all(d.done and not d.failed and d.round == 2 for d in debates)
    s = summarize(debates)
    assert s.accuracy == 1.0 and s.failed == 0 and s.turns == 36
    assert s.prompt_tokens == sum(r.prompt_tokens for d in debates for rr in d.trace.rounds for r in rr) > 0


def test_heterogeneous_backends_one_call_each():
    a, b = FakeBackend(model_id="model-a"), FakeBackend(model_id="model-b")
    eng = DebateEngine({"a": a, "b": b}, DebateConfig(n_agents=3, n_rounds=1, agent_backends=("a", "b", "a")))
    debates = eng.run([gsm(0), gsm(1)], MADProtocol(3, 1))
    assert len(a.calls) == 2 and len(b.calls) == 2
    assert [r.metadata["agent"] for r in a.calls[0]] == [0, 2, 0, 2]
    assert [r.metadata["agent"] for r in b.calls[1]] == [1, 1]
    assert debates[0].trace.model_ids == ["model-a", "model-b", "model-a"]
    assert [t.model_id for t in debates[0].trace.rounds[1]] == ["model-a", "model-b", "model-a"]
    with pytest.raises(ValueError, match="agent_backends"):
        DebateEngine({"a": a, "b": b}, DebateConfig(n_agents=3))
    with pytest.raises(ValueError, match="unknown backend keys"):
        DebateEngine({"a": a}, DebateConfig(n_agents=2, agent_backends=("a", "zz")))


def test_failed_completion_fails_only_that_debate():
    def script(r: ChatRequest):
        if r.metadata["question_id"] == "q1" and r.metadata["round"] == 1 and r.metadata["agent"] == 1:
            return Completion("", 0, 0, "error", 0.0, error="HTTP 500 after 3 retries")
        return answer_text(r.metadata["agent"], r.metadata["round"], "18")

    be = FakeBackend(script)
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2))
    debates = eng.run([gsm(0), gsm(1), gsm(2)], MADProtocol(3, 2))
    bad = debates[1]
    assert bad.failed and bad.done and "HTTP 500" in bad.error and bad.round == 1
    assert bad.trace.failed and not bad.trace.final_correct and bad.trace.final_answer is None
    assert bad.trace.rounds[1][1].error == "HTTP 500 after 3 retries"  # recorded, not dropped
    assert len(bad.trace.rounds) == 2
    assert [len(c) for c in be.calls] == [9, 9, 6]  # round 2 only for the two healthy debates
    assert all(d.trace.final_correct and len(d.trace.rounds) == 3 for d in (debates[0], debates[2]))
    s = summarize(debates)
    assert s.failed == 1 and s.correct == 2


def test_backend_exception_marks_debates_failed_without_crash(caplog):
    class Broken(FakeBackend):
        def generate(self, requests):
            raise ConnectionError("server went away")

    eng = DebateEngine(Broken(), DebateConfig(n_agents=2, n_rounds=1))
    with caplog.at_level(logging.WARNING):
        debates = eng.run([gsm(0), gsm(1)], MADProtocol(2, 1))
    assert all(d.failed and "server went away" in d.error for d in debates)
    assert summarize(debates).failed == 2
    assert "2 of 2 debates failed" in caplog.text


def test_no_parsable_answer_is_recorded_as_wrong():
    def script(r):
        return "I am not sure about this one." if r.metadata["agent"] == 0 else answer_text(1, 0, "18")

    eng = DebateEngine(FakeBackend(script), DebateConfig(n_agents=3, n_rounds=0))
    (d,) = eng.run([gsm(0)], MajorityProtocol())
    t = d.trace.rounds[0][0]
    assert t.answer is None and t.answer_key is None and not t.correct and t.grader == "none" and t.error is None
    assert t.reasoning and t.conclusion  # never empty: they feed the encoder
    assert t.text == "I am not sure about this one."
    assert d.trace.final_answer == "18" and d.trace.final_correct and d.trace.vote_counts == {"18": 2}
    assert summarize([d]).no_answer_turns == 1


def test_all_no_answer_votes_none():
    eng = DebateEngine(FakeBackend(lambda r: ""), DebateConfig(n_agents=3, n_rounds=0))
    (d,) = eng.run([gsm(0)], MajorityProtocol())
    assert d.trace.final_answer is None and not d.trace.final_correct and not d.trace.tie
    assert all(t.conclusion == prompts.NO_ANSWER and t.reasoning == prompts.NO_ANSWER for t in d.trace.rounds[0])


def test_vote_ties_are_seeded_and_counted():
    def script(r):
        return answer_text(r.metadata["agent"], 0, str(r.metadata["agent"] + 1))

    qs = [gsm(i, gold="1") for i in range(40)]
    runs = []
    for _ in range(2):
        eng = DebateEngine(FakeBackend(script), DebateConfig(n_agents=3, n_rounds=0, seed=1))
        runs.append(eng.run(qs, MajorityProtocol()))
    winners = [d.trace.final_answer for d in runs[0]]
    assert winners == [d.trace.final_answer for d in runs[1]]  # reproducible
    assert set(winners) == {"1", "2", "3"}  # the RNG really picks, not always the first
    assert all(d.trace.tie for d in runs[0]) and summarize(runs[0]).ties == 40
    assert all(d.trace.final_correct == (d.trace.final_answer == "1") for d in runs[0])
    assert runs[0][0].vote() == runs[0][0].vote()  # vote() is a pure function of the state


def test_vote_function():
    rng = np.random.default_rng(0)
    v = vote(["5", None, "5", "7"], [True, False, True, False], rng)
    assert v.answer == "5" and v.correct and not v.tie and v.counts == {"5": 2, "7": 1}
    v = vote([None, None], [False, False], rng)
    assert v.answer is None and not v.correct and v.counts == {}


def test_context_overflow_truncates_peer_reasoning(caplog):
    long = "step " * 400  # ~500 tokens at 4 chars/token

    def script(r):
        a = r.metadata["agent"]
        return f"Reasoning: {long} reasoning-of-agent-{a}\nConclusion: conclusion-of-agent-{a}.\nFinal answer: \\boxed{{18}}"

    be = FakeBackend(script, context_length=1200)
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1, max_tokens=256))
    with caplog.at_level(logging.WARNING):
        (d,) = eng.run([gsm(0)], MADProtocol(3, 1))
    assert "context overflow" in caplog.text
    turns = d.trace.rounds[1]
    assert all(t.truncated_peers >= 1 for t in turns)
    p0 = user_prompt(be.calls[1][0])
    assert prompts.OMITTED in p0
    # Peers keep their conclusions and final answers even when their reasoning is cut.
    assert "conclusion-of-agent-1." in p0 and "conclusion-of-agent-2." in p0
    assert "reasoning-of-agent-1" not in p0  # first listed peer cut first
    est = sum(be.count_tokens(m["content"]) + 8 for m in turns[0].messages)
    assert est + turns[0].max_tokens <= 1200
    assert not d.failed and eng.stats.truncations == 3


def test_overflow_that_cannot_fit_still_sends_and_never_crashes(caplog):
    be = FakeBackend(context_length=40)
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=1, max_tokens=64))
    with caplog.at_level(logging.WARNING):
        (d,) = eng.run([gsm(0)], MADProtocol(2, 1))
    assert not d.failed and len(d.trace.rounds) == 2
    assert all(r.max_tokens == 16 for r in be.calls[1])  # shrunk to the floor, the backend decides


def test_step_validation():
    eng = DebateEngine(FakeBackend(), DebateConfig(n_agents=3, n_rounds=1))
    debates = eng.start([gsm(0)])
    with pytest.raises(ValueError, match="controls"):
        eng.step(debates, [])
    with pytest.raises(ValueError, match="n_agents"):
        eng.step(debates, [RoundControl.full(2)])
    eng.step(debates, [RoundControl.full(3)])
    assert debates[0].done
    n_calls = len(eng.backends["default"].calls)
    eng.step(debates, [RoundControl.full(3)])  # finished debates are skipped, no empty backend call
    assert len(eng.backends["default"].calls) == n_calls


# ------------------------------------------------------------------ RoundControl / config
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mask": np.ones((3, 3), bool)}, "mask"),
        ({"mask": np.zeros((3, 2), bool)}, "mask"),
        ({"mask": np.full((3, 3), 2)}, "mask"),
        ({"temperature": np.array([0.7, np.nan, 0.7])}, "temperature"),
        ({"temperature": np.array([0.7, 0.7])}, "temperature"),
        ({"temperature": np.array([0.7, -0.1, 0.7])}, "temperature"),
        ({"top_p": np.array([0.9, 0.0, 0.9])}, "top_p"),
        ({"top_p": np.array([0.9, 1.1, 0.9])}, "top_p"),
    ],
)
def test_round_control_validation(kwargs, field):
    base = {"mask": ~np.eye(3, dtype=bool), "temperature": np.full(3, 0.7), "top_p": np.full(3, 0.9)}
    base.update(kwargs)
    with pytest.raises(ValueError, match=f"RoundControl.{field}"):
        RoundControl(**base)


def test_round_control_accepts_int_mask_and_scalars():
    c = RoundControl(np.array([[0, 1], [1, 0]]), 0.5, 0.8)
    assert c.mask.dtype == bool and c.temperature.tolist() == [0.5, 0.5] and c.top_p.tolist() == [0.8, 0.8]


def test_debate_config_validation():
    with pytest.raises(ValueError, match="n_agents"):
        DebateConfig(n_agents=0)
    with pytest.raises(ValueError, match="agent_backends"):
        DebateConfig(n_agents=3, agent_backends=("a",))
    with pytest.raises(ValueError, match="top_p0"):
        DebateConfig(top_p0=0.0)


# ------------------------------------------------------------------ protocols
def test_protocols():
    cfg = DebateConfig(n_agents=3, n_rounds=2)
    mad = make_protocol("mad", cfg)
    (c,) = mad.controls([None])
    np.testing.assert_array_equal(c.mask, ~np.eye(3, dtype=bool))
    assert mad.n_rounds == 2 and c.temperature.tolist() == [0.7] * 3 and c.top_p.tolist() == [0.9] * 3
    assert make_protocol("majority", cfg).n_rounds == 0
    assert not make_protocol("self", cfg).controls([None])[0].mask.any()
    assert isinstance(make_protocol("random:0.25", cfg), RandomMaskProtocol)
    fixed = make_protocol("fixed", cfg, mask=np.array([[0, 1, 1], [0, 0, 0], [0, 0, 0]]))
    assert fixed.controls([None])[0].mask.sum() == 2
    with pytest.raises(ValueError, match="unknown protocol"):
        make_protocol("nope", cfg)
    with pytest.raises(ValueError, match="mask"):
        make_protocol("fixed", cfg)


def test_majority_protocol_runs_round0_only():
    be = FakeBackend()
    debates = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2)).run([gsm(0)], MajorityProtocol())
    assert len(be.calls) == 1 and debates[0].done and len(debates[0].trace.rounds) == 1
    assert debates[0].trace.protocol == "majority"


def test_random_mask_protocol_seeded_and_varies():
    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1))
    debates = eng.start([gsm(i) for i in range(20)])
    proto = RandomMaskProtocol(p=0.5, seed=3, n_agents=3, n_rounds=1)
    a, b = proto.controls(debates), proto.controls(debates)
    assert all((x.mask == y.mask).all() for x, y in zip(a, b))
    assert len({x.mask.tobytes() for x in a}) > 1
    assert not any(np.diag(x.mask).any() for x in a)
    assert not RandomMaskProtocol(p=0.0).controls(debates[:1])[0].mask.any()
    with pytest.raises(ValueError, match="p must be"):
        RandomMaskProtocol(p=1.5)


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    "text, reasoning, conclusion, final",
    [
        ("Reasoning: a then b.\nConclusion: It is 4.\nFinal answer: \\boxed{4}", "a then b.", "It is 4.", "\\boxed{4}"),
        ("**Reasoning:** a.\n**Conclusion:** c.\n**Final answer:** \\boxed{4}", "a.", "c.", "\\boxed{4}"),
        ("### Reasoning\nno colon here. So 4.\nFinal Answer: 4", "### Reasoning\nno colon here. So 4.", "So 4.", "4"),
        ("Just text. The answer is \\boxed{7}.", "Just text. The answer is \\boxed{7}.", "The answer is \\boxed{7}.", None),
        ("Final answer: \\boxed{3}", "Final answer: \\boxed{3}", "Final answer: \\boxed{3}", "\\boxed{3}"),
        ("", prompts.NO_ANSWER, prompts.NO_ANSWER, None),
        ("Reasoning: x\nConclusion: draft.\nConclusion: better.\nFinal answer: 1\nFinal answer: 2 trailing\nmore",
         "x", "better.", "2 trailing"),
    ],
)
def test_parse_sections(text, reasoning, conclusion, final):
    p = prompts.parse_sections(text)
    assert (p.reasoning, p.conclusion, p.final) == (reasoning, conclusion, final)


# ------------------------------------------------------------------ traces
def test_trace_json_round_trip(tmp_path):
    eng = DebateEngine(FakeBackend(), DebateConfig(n_agents=3, n_rounds=1))
    debates = eng.run([gsm(0), gsm(1)], MADProtocol(3, 1))
    tr = debates[0].trace
    back = DebateTrace.from_json(json.dumps(json.loads(tr.to_json())))
    assert back == tr
    assert back.correctness().shape == (2, 3) and back.correctness().all()
    assert back.answer_keys() == [["18"] * 3, ["18"] * 3]
    assert back.tokens_per_round().sum() == tr.total_tokens
    path = tmp_path / "t.jsonl"
    assert write_jsonl([d.trace for d in debates], path) == 2
    assert read_jsonl(path) == [d.trace for d in debates]
    with pytest.raises(ValueError, match="unknown keys"):
        DebateTrace.from_dict({**tr.to_dict(), "bogus": 1})
