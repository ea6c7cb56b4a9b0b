"""The multi-turn exchange layout, session keys, restoring a stored round 0 and concurrent debates."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MADProtocol, prompts
from dear.debate.protocols import FixedMaskProtocol
from dear.llm.base import Completion
from dear.llm.local import SlotAffinity, parse_chat_response
from dear import tasks
from dear.sim import SimBackend
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text, gsm


def _run(layout: str, n_rounds: int = 2, mask=None, backend=None):
    be = backend or FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=n_rounds, layout=layout))
    proto = MADProtocol(3, n_rounds) if mask is None else FixedMaskProtocol(mask, n_rounds)
    (d,) = eng.run([gsm(0)], proto)
    return be, d


def test_multiturn_conversation_extends_the_previous_call_by_own_answer_and_peers():
    be, d = _run("multiturn")
    for agent in range(3):
        r0, r1, r2 = (be.calls[k][agent] for k in range(3))
        # Each call's prompt is the previous call's prompt + its own answer (verbatim) + one new user turn:
        # the prefix a KV-cache slot already holds.
        for prev, nxt, k in ((r0, r1, 0), (r1, r2, 1)):
            assert nxt.messages[: len(prev.messages)] == prev.messages
            own = nxt.messages[len(prev.messages)]
            assert own.role == "assistant" and own.content == d.trace.rounds[k][agent].text
            assert nxt.messages[-1].role == "user" and len(nxt.messages) == len(prev.messages) + 2
        assert [m.role for m in r2.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        peers_turn = r1.messages[-1].content
        assert peers_turn.startswith(prompts.PEERS_INTRO) and peers_turn.count("One agent's answer:") == 2
        assert "Janet has 0 ducks" in peers_turn  # Du et al. restate the problem
        others = [j for j in range(3) if j != agent]
        assert all(f"reasoning-of-agent-{j}-round-0" in peers_turn for j in others)
        assert f"reasoning-of-agent-{agent}-round-0" not in peers_turn


def test_multiturn_without_peers_asks_to_double_check():
    be, _ = _run("multiturn", n_rounds=1, mask=np.zeros((3, 3), dtype=bool))
    assert all(r.messages[-1].content.startswith(prompts.ALONE) for r in be.calls[1])


def test_single_layout_is_one_fresh_user_message():
    be, _ = _run("single")
    assert all([m.role for m in r.messages] == ["system", "user"] for call in be.calls for r in call)
    assert "Your previous answer:" in be.calls[2][0].messages[-1].content


def test_requests_carry_one_session_per_debate_agent():
    be, d = _run("multiturn")
    sessions = {(r.session, r.metadata["agent"]) for call in be.calls for r in call}
    assert sessions == {(f"{d.debate_id}/agent{a}", a) for a in range(3)}


def test_layout_is_validated():
    with pytest.raises(ValueError, match="layout"):
        DebateConfig(layout="threaded")


def test_multiturn_overflow_cuts_the_oldest_peer_reasoning_first():
    long = "step " * 150

    def script(r):
        a, k = r.metadata["agent"], r.metadata["round"]
        return f"Reasoning: {long} reasoning-of-agent-{a}-round-{k}\nConclusion: c{a}{k}.\nFinal answer: \\boxed{{18}}"

    be = FakeBackend(script, context_length=1500)
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, max_tokens=128, layout="multiturn"))
    (d,) = eng.run([gsm(0)], MADProtocol(3, 2))
    last = be.calls[2][0]
    text = "".join(m.content for m in last.messages[3:])  # the peers' turns
    assert d.trace.rounds[2][0].truncated_peers >= 1
    assert "reasoning-of-agent-1-round-0" not in text  # round 0's peer reasoning went first
    assert "reasoning-of-agent-2-round-1" in text  # the newest peer reasoning stays
    assert sum(be.count_tokens(m.content) + 8 for m in last.messages) + last.max_tokens <= 1500


def _sim_engine(layout: str) -> DebateEngine:
    return DebateEngine(SimBackend(seed=3), DebateConfig(n_agents=3, n_rounds=2, layout=layout))


def test_a_stored_round0_continues_like_an_uninterrupted_run_in_the_multiturn_layout():
    qs = tasks.load("synthetic", n=4, seed=1)
    full = _sim_engine("multiturn").run(qs, MADProtocol(3, 2))
    round0 = _sim_engine("multiturn").start(qs)
    eng = _sim_engine("multiturn")
    resumed = eng.start_from_round0(qs, [d.trace.rounds[0] for d in round0], protocol="mad")
    while active := [d for d in resumed if not d.done]:
        eng.step(active, MADProtocol(3, 2).controls(active))
    for a, b in zip(full, resumed):
        assert a.trace.answer_keys() == b.trace.answer_keys()
        assert a.trace.final_answer == b.trace.final_answer


def test_run_concurrent_matches_run_and_overlaps_debates():
    qs = tasks.load("synthetic", n=6, seed=2)
    sequential = _sim_engine("multiturn").run(qs, MADProtocol(3, 2))

    class Overlap(SimBackend):
        def __init__(self):
            super().__init__(seed=3)
            self.active, self.peak, self.lock = 0, 0, threading.Lock()

        def generate(self, requests):
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            try:
                threading.Event().wait(0.02)
                return super().generate(requests)
            finally:
                with self.lock:
                    self.active -= 1

    be = Overlap()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, layout="multiturn"))
    done = []
    concurrent = eng.run_concurrent(qs, MADProtocol(3, 2), max_in_flight=3, on_done=done.append)
    assert [d.trace.answer_keys() for d in concurrent] == [d.trace.answer_keys() for d in sequential]
    assert len(done) == 6 and be.peak == 3
    assert eng.stats.requests == 6 * 3 * 3
    with pytest.raises(ValueError, match="max_in_flight"):
        eng.run_concurrent(qs, MADProtocol(3, 2), max_in_flight=0)


def test_a_stop_during_run_concurrent_finishes_debates_in_flight_and_starts_no_queued_one():
    """A stop (raised by the first debate's `on_done`) waits for the debates in flight, whose `on_done` still
    records them, and cancels the queued ones. Sim debates take milliseconds, so a worker may finish a few more
    before the main thread cancels: the test asks that the queue was not run out, not for an exact count."""
    qs = tasks.load("synthetic", n=24, seed=2)
    eng = _sim_engine("multiturn")
    done = []

    def stop_after_first(debate):
        done.append(debate)
        if len(done) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        eng.run_concurrent(qs, MADProtocol(3, 2), max_in_flight=2, on_done=stop_after_first)
    assert 1 <= len(done) < len(qs) and eng.stats.requests < len(qs) * 3 * 3


def test_slot_affinity_keeps_sessions_and_evicts_the_least_recently_used():
    slots = SlotAffinity(2)
    a = slots.acquire("a")
    b = slots.acquire("b")
    assert {a, b} == {0, 1}
    assert slots.acquire("c") is None  # every slot busy: llama.cpp chooses
    slots.release(a)
    slots.release(b)
    assert slots.acquire("a") == a  # same session, same slot
    slots.release(a)
    c = slots.acquire("c")  # evicts b, the least recently used
    assert c == b
    slots.release(c)
    assert slots.acquire("b") == a  # b lost its slot; it takes the LRU one (a's)
    assert slots.acquire(None) is None


def test_reused_prompt_tokens_are_read_from_the_response():
    base = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 5}}
    assert parse_chat_response(base, 0.1).reused_prompt_tokens == 0
    openai_style = {**base, "usage": {**base["usage"], "prompt_tokens_details": {"cached_tokens": 64}}}
    c = parse_chat_response(openai_style, 0.1)
    assert (c.reused_prompt_tokens, c.computed_prompt_tokens) == (64, 36)
    assert parse_chat_response({**base, "timings": {"cache_n": 80}}, 0.1).reused_prompt_tokens == 80
    assert Completion("", 10, 0, "stop", 0.0, reused_prompt_tokens=12).computed_prompt_tokens == 0


def test_answer_text_helper_still_parses():
    assert prompts.parse_sections(answer_text(0, 1, "7")).final == "\\boxed{7}"


def test_layout_comparison_runs_resumes_and_reports_on_the_sim_backend(tmp_path, capsys):
    from eval import layouts

    args = ["--task", "synthetic", "--llm", "sim", "--n", "4", "--chunk", "2", "--out", str(tmp_path / "lay")]
    assert layouts.main(args) == 0
    rows = (tmp_path / "lay" / "arms.jsonl").read_text().splitlines()
    assert len(rows) == 4 * len(layouts.ARMS)
    summary = (tmp_path / "lay" / "summary.md").read_text()
    assert "n = 4 questions" in summary and "Reading: **" in summary
    for arm in layouts.ARMS:
        assert f"| {arm.name} |" in summary
    assert "synthetic" in (tmp_path / "lay" / "summary.csv").read_text().splitlines()[0]
    # The same command again finds everything done and makes no new rows; a bigger --n continues.
    assert layouts.main(args) == 0
    assert len((tmp_path / "lay" / "arms.jsonl").read_text().splitlines()) == len(rows)
    assert layouts.main([*args[:-2], "--out", str(tmp_path / "lay"), "--n", "6"]) == 0
    assert len((tmp_path / "lay" / "arms.jsonl").read_text().splitlines()) == 6 * len(layouts.ARMS)
    # Every arm continued the one stored round 0.
    import json

    round0 = {json.loads(x)["question_id"]: json.loads(x)["rounds"][0]
              for x in (tmp_path / "lay" / "round0.jsonl").read_text().splitlines()}
    for line in (tmp_path / "lay" / "arms.jsonl").read_text().splitlines():
        trace = json.loads(line)["trace"]
        assert [t["text"] for t in trace["rounds"][0]] == [t["text"] for t in round0[trace["question_id"]]]
    with pytest.raises(ValueError, match="other settings"):
        layouts.main([*args, "--max-tokens", "99"])


@pytest.mark.slow
def test_real_llama_cpp_keeps_each_agent_on_its_slot_and_reuses_its_conversation():
    """Smoke GGUF through llama.cpp: in the multi-turn layout every agent's exchange call finds its whole previous
    conversation in its slot's KV cache (the prefix property plus SlotAffinity), for two debates at once."""
    from dear.llm.registry import make_backend

    with make_backend("smoke", n_parallel=6, n_ctx=2048) as be:
        eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, max_tokens=24, layout="multiturn"))
        debates = eng.run(tasks.load("gsm8k", n=2, seed=0), MADProtocol(3, 2))
    for d in debates:
        rounds = d.trace.rounds
        for r in (1, 2):
            for t in rounds[r]:
                previous = rounds[r - 1][t.agent]
                # The previous prompt and (up to re-tokenisation at the turn boundary) the previous answer.
                assert t.reused_prompt_tokens >= previous.prompt_tokens, (r, t.agent)
                assert t.reused_prompt_tokens <= previous.prompt_tokens + previous.completion_tokens + 2
    assert eng.stats.reused_prompt_tokens > 0


def test_silent_turns_leave_no_exchange_in_the_multiturn_conversation():
    """With DebateConfig.silent an agent that reads nobody makes no call; its next real call must extend the
    conversation it actually had (no phantom assistant/user pair for the silent round)."""
    mask_r1 = np.zeros((3, 3), dtype=bool)  # round 1: nobody reads anybody -> every agent silent
    full = ~np.eye(3, dtype=bool)

    class TwoPhase(FixedMaskProtocol):
        def controls(self, debates):
            return [RoundControl(mask_r1 if d.round == 0 else full, 0.7, 0.9) for d in debates]

    from dear.debate import RoundControl

    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, layout="multiturn", silent=True))
    (d,) = eng.run([gsm(0)], TwoPhase(full, 2))
    assert all(t.silent for t in d.trace.rounds[1])
    assert len(be.calls) == 2  # round 0 and round 2: round 1 made no call
    r0, r2 = be.calls[0][0], be.calls[1][0]
    assert [m.role for m in r2.messages] == ["system", "user", "assistant", "user"]
    assert r2.messages[:2] == r0.messages


def test_a_silent_turn_keeps_a_cut_answer_unanswered_in_the_engine_and_in_a_regrade():
    """A round-0 text cut at the token limit without a marked answer is no answer; the agent's silent turns repeat
    that text, and must keep it unanswered (parsed as an uncut text, its last number would become an answer)."""
    from dear.debate.regrade import regrade_trace

    cut = "Reasoning: 3 ducks lay 6 eggs, so 18 is"

    def script(r):
        if r.metadata["agent"] == 0:
            return Completion(cut, 10, 384, "length", 0.01)
        return answer_text(r.metadata["agent"], r.metadata["round"], "7")

    reads_nobody = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0]], dtype=bool)
    eng = DebateEngine(FakeBackend(script), DebateConfig(n_agents=3, n_rounds=2, silent=True))
    (d,) = eng.run([gsm(0)], FixedMaskProtocol(reads_nobody, 2, 0.7, 0.9))
    assert prompts.extract(cut, gsm(0), truncated=False) == "18"  # what a re-parse of the text would find
    for r in range(3):
        t = d.trace.rounds[r][0]
        assert (t.silent, t.answer, t.answer_key, t.correct) == (r > 0, None, None, False)
    assert d.trace.final_answer == "7"
    again = regrade_trace(d.trace, gsm(0), engine_seed=0)
    assert [t.answer for turns in again.rounds for t in turns] == [t.answer for turns in d.trace.rounds for t in turns]
    # a trace the earlier engine graded (its silent turns parsed the cut text) is mended by a re-grade
    from dataclasses import replace

    earlier = replace(d.trace, rounds=[[replace(t, answer="18", answer_key="18", correct=True) if t.silent else t
                                        for t in turns] for turns in d.trace.rounds],
                      vote_counts={"7": 2, "18": 1})  # the vote it took over those answers
    mended = regrade_trace(earlier, gsm(0), engine_seed=0)
    assert [t.answer for t in mended.rounds[2]] == [None, "7", "7"] and not mended.rounds[2][0].correct
