"""Program-of-thought (`pot`) agents in the debate engine (issue 58 item 1): the reply style, the program run in the
sandbox, what peers see of it, the trace, re-grading without running programs, confidence, and dear.infer."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np
import pytest

from dear.debate import (
    DebateConfig,
    DebateEngine,
    DebateTrace,
    MADProtocol,
    RoundControl,
    parse_profiles,
    pot,
    prompts,
    read_jsonl,
    write_jsonl,
)
from dear.debate.engine import grade_turn, graded_answer
from dear.debate.regrade import regrade_turn
from dear.llm.base import Backend, ChatRequest, Completion, TokenLogprobs
from dear.sandbox import OK, REFUSED, TIMEOUT, SandboxLimits
from dear.tasks.equivalence import AnswerClasses
from dear.tasks.types import Question

L = SandboxLimits(wall_seconds=3.0, cpu_seconds=2.0, memory_mb=128, max_output_bytes=4096)
Q = Question("q1", "gsm8k", "Tom has 6 boxes of 7 pens. How many pens?", "42", "numeric")
PROGRAM = "print(6*7)"
POT_REPLY = f"```python\n{PROGRAM}\n```"
COT_REPLY = "Reasoning: 6 boxes of 7 pens.\nConclusion: 42 pens.\nFinal answer: \\boxed{42}"
POOL = ("cot", "pot", "cot")  # agent 1 writes programs


class FakeBackend(Backend):
    """Fixed completions by (agent, round) through `script(request)`; records every batch."""

    def __init__(self, script: Callable[[ChatRequest], str], logprobs: bool = False):
        self.script = script
        self.model_id = "fake"
        self.calls: list[list[ChatRequest]] = []
        self.logprobs = logprobs

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            text = self.script(r)
            lp = None
            if self.logprobs:  # one "token" per character
                lp = TokenLogprobs(tuple(-0.1 for _ in text), tuple((-0.1,) for _ in text), tuple(1 for _ in text))
            out.append(Completion(text, 10, max(1, len(text) // 4), "stop", 0.01, logprobs=lp))
        return out


def by_style(pot_reply: Callable[[int, int], str] | str = POT_REPLY) -> Callable[[ChatRequest], str]:
    """cot agents answer 42 in the structured format; the pot agent (metadata style "pot") writes `pot_reply`."""

    def script(r: ChatRequest) -> str:
        if r.metadata.get("style") != "pot":
            return COT_REPLY
        return pot_reply(r.metadata["agent"], r.metadata["round"]) if callable(pot_reply) else pot_reply

    return script


def config(**kw) -> DebateConfig:
    return DebateConfig(**{"n_agents": 3, "n_rounds": 1, "max_tokens": 128, "agent_profiles": POOL,
                           "sandbox_limits": L, **kw})


def user_text(req: ChatRequest) -> str:
    return "\n".join(m.content for m in req.messages if m.role == "user")


# ---------------------------------------------------------------- style and config
def test_the_pot_style_is_registered_and_asks_for_a_program():
    style = prompts.reply_style("pot")
    assert style.forms == pot.PRINT_FORMS and not style.reasoning
    for kind in pot.PRINT_FORMS:
        q = Question("x", "t", "?", "", kind, ("a", "b") if kind == "choice" else None)
        assert style.instructions(q) == pot.instructions(kind)
        assert style.prompt_texts(q) == pot.prompt_texts(kind)
    user = prompts.round0_messages(Q, style="pot")[1].content
    assert pot.POT_STRUCTURE in user and pot.PRINT_FORMS["numeric"] in user and prompts.STRUCTURE not in user
    assert [p.style for p in parse_profiles("cot,pot,cot")] == list(POOL)  # --agent-profiles cot,pot,cot
    with pytest.raises(TypeError):
        style.forms["essay"] = "no"  # read-only


def test_config_validates_and_round_trips_the_sandbox_settings():
    cfg = config(show_programs=False)
    assert DebateConfig(**asdict(cfg)) == cfg  # asdict writes the limits as a mapping
    assert hash(cfg) == hash(DebateConfig(**asdict(cfg)))  # dear.serve keys engines by config
    assert DebateConfig().sandbox_limits == SandboxLimits() and DebateConfig().show_programs is True
    with pytest.raises(ValueError, match="sandbox_limits"):
        DebateConfig(sandbox_limits=5)
    with pytest.raises(ValueError, match="sandbox_limits"):
        DebateConfig(sandbox_limits={"wall_secs": 1})
    with pytest.raises(ValueError, match="positive"):
        DebateConfig(sandbox_limits={"wall_seconds": -1})
    with pytest.raises(ValueError, match="show_programs"):
        DebateConfig(show_programs="yes")


# ---------------------------------------------------------------- the program answers
def test_a_pot_agent_whose_program_prints_42_answers_42_and_is_graded_correct():
    be = FakeBackend(by_style())
    (d,) = DebateEngine(be, config()).run([Q], MADProtocol(3, 1))
    assert not d.failed, d.error
    r0 = d.trace.rounds[0]
    turn = r0[1]
    assert (turn.style, turn.answer, turn.answer_key, turn.correct) == ("pot", "42", "42", True)
    assert turn.grader != "none" and turn.text == POT_REPLY
    prog = turn.program
    assert prog["code"] == PROGRAM and prog["verdict"] == OK and prog["stdout"] == "42\n"
    assert prog["answer_text"] == "42" and prog["exit_status"] == 0 and prog["wall_seconds"] > 0 and prog["layers"]
    assert PROGRAM in turn.reasoning and turn.conclusion == "The program printed: 42"
    assert r0[0].program is None and r0[2].program is None  # cot turns carry no program
    # each agent is asked in its own style
    first = be.calls[0]
    assert pot.POT_STRUCTURE in user_text(first[1]) and pot.POT_STRUCTURE not in user_text(first[0])
    assert d.trace.final_answer == "42" and d.trace.final_correct
    assert all(t.correct for turns in d.trace.rounds for t in turns)


def test_the_programs_of_a_round_run_concurrently_and_each_keeps_its_own_output():
    """Three debates of three pot agents: nine programs in one round, each printing its own number."""
    questions = [Question(f"q{i}", "gsm8k", f"What is {i} + 40?", str(i + 40), "numeric") for i in range(3)]

    def script(r: ChatRequest) -> str:
        i = int(r.metadata["question_id"][1:])
        return f"```python\nprint({i} + 40 + {r.metadata['agent']} - {r.metadata['agent']})\n```"

    engine = DebateEngine(FakeBackend(script), config(agent_profiles=("pot",) * 3, n_rounds=0))
    debates = engine.start(questions)
    for i, d in enumerate(debates):
        assert [t.answer for t in d.trace.rounds[0]] == [str(i + 40)] * 3
        assert all(t.correct and t.program["verdict"] == OK for t in d.trace.rounds[0])


HOSTILE = ("```python\nimport subprocess\nsubprocess.run(['sh', '-c', 'echo pwned > /tmp/dear-pot-pwned'])\n"
           "print(42)\n```")
LOOPS = "```python\nprint(42)\nwhile True:\n    pass\n```"


def test_a_hostile_or_runaway_program_gives_no_answer_and_the_debate_goes_on():
    be = FakeBackend(by_style(lambda agent, rnd: HOSTILE if rnd == 0 else LOOPS))
    (d,) = DebateEngine(be, config(sandbox_limits=SandboxLimits(wall_seconds=1.5, cpu_seconds=1.0))).run(
        [Q], MADProtocol(3, 1))
    assert not d.failed and d.done and d.trace.error is None
    refused, looped = d.trace.rounds[0][1], d.trace.rounds[1][1]
    for turn, verdict in ((refused, REFUSED), (looped, TIMEOUT)):
        assert turn.answer is None and turn.answer_key is None and not turn.correct and turn.grader == "none"
        assert turn.error is None and turn.program["verdict"] == verdict and turn.program["answer_text"] is None
        assert "no answer" in turn.conclusion and verdict in turn.conclusion
    assert "subprocess" in refused.program["reason"]
    # the peers read that it gave no answer, and the cot agents' vote decides
    cot_round1 = user_text(be.calls[1][0])
    assert "The program gave no answer (refused" in cot_round1 and prompts.NO_ANSWER in cot_round1
    assert d.trace.final_answer == "42" and d.trace.vote_counts == {"42": 2}


# ---------------------------------------------------------------- what peers see
@pytest.mark.parametrize("layout", ["multiturn", "single"])
@pytest.mark.parametrize("show", [True, False])
def test_a_revise_round_shows_the_peers_program_only_with_show_programs(layout, show):
    be = FakeBackend(by_style())
    (d,) = DebateEngine(be, config(layout=layout, show_programs=show)).run([Q], MADProtocol(3, 1))
    assert not d.failed, d.error
    cot_req, pot_req = be.calls[1][0], be.calls[1][1]
    peer_view = user_text(cot_req)  # agent 0 (cot) reads agents 1 (pot) and 2
    assert "The program printed: 42" in peer_view and "\\boxed{42}" in peer_view
    assert (PROGRAM in peer_view) is show and (pot.NOT_SHOWN in peer_view) is (not show)
    # the pot agent always sees its own program, in its own style's revise request
    own_view = "\n".join(m.content for m in pot_req.messages)
    assert PROGRAM in own_view and pot.NOT_SHOWN not in own_view
    assert pot.POT_STRUCTURE in pot_req.messages[-1].content
    if layout == "single":
        assert pot.RECONSIDER_POT in pot_req.messages[-1].content
    # the trace keeps the program either way
    assert PROGRAM in d.trace.rounds[0][1].reasoning and d.trace.rounds[1][1].program["code"] == PROGRAM


def test_a_silent_pot_turn_keeps_its_program_and_answer():
    be = FakeBackend(by_style())
    engine = DebateEngine(be, config(silent=True))
    (d,) = engine.start([Q])
    mask = np.zeros((3, 3), dtype=bool)
    mask[0, 1] = True  # agent 0 reads the pot agent; agents 1 and 2 read nobody: silent
    engine.step([d], [RoundControl(mask, np.full(3, 0.7), np.full(3, 0.9))])
    kept = d.trace.rounds[1][1]
    assert kept.silent and kept.answer == "42" and kept.program == d.trace.rounds[0][1].program
    assert kept.reasoning == d.trace.rounds[0][1].reasoning and len(be.calls[1]) == 1


# ---------------------------------------------------------------- trace, re-grading, confidence
def test_the_trace_round_trips_with_its_program_and_a_cot_trace_has_no_program_key(tmp_path):
    (d,) = DebateEngine(FakeBackend(by_style()), config()).run([Q], MADProtocol(3, 1))
    path = tmp_path / "t.jsonl"
    write_jsonl([d.trace], path)
    (back,) = read_jsonl(path)
    assert back.to_dict() == d.trace.to_dict() and back.rounds[0][1].program == d.trace.rounds[0][1].program
    stored = json.loads(path.read_text())
    assert "program" in stored["rounds"][0][1] and "program" not in stored["rounds"][0][0]
    (plain,) = DebateEngine(FakeBackend(by_style()), config(agent_profiles=None)).run([Q], MADProtocol(3, 1))
    assert all("program" not in t for turns in plain.trace.to_dict()["rounds"] for t in turns)
    assert DebateTrace.from_json(plain.trace.to_json()).to_json() == plain.trace.to_json()


def test_re_grading_reads_the_stored_output_and_never_runs_a_program(monkeypatch):
    (d,) = DebateEngine(FakeBackend(by_style()), config()).run([Q], MADProtocol(3, 1))

    def no_run(*a, **k):
        raise AssertionError("a program ran while re-grading")

    monkeypatch.setattr(pot, "run_program", no_run)
    classes = AnswerClasses(Q.kind)
    for turns in d.trace.rounds:
        for t in turns:
            again = regrade_turn(t, Q, classes)
            assert (again.answer, again.answer_key, again.correct, again.program) == \
                (t.answer, t.answer_key, t.correct, t.program)
    turn = d.trace.rounds[0][1]
    wrong_gold = Question(Q.id, Q.task, Q.question, "41", Q.kind)
    assert regrade_turn(turn, wrong_gold, classes).correct is False  # graded again, from the stored output
    # a pot turn without a stored run answers nothing when programs may not run
    assert graded_answer(turn.text, "stop", None, Q, "pot", run_programs=False) == (None, None, False, "none")
    # the cot and direct styles are graded as before (no program)
    assert grade_turn(COT_REPLY, "stop", None, Q, "cot").astuple()[:3] == ("42", "42", True)
    assert grade_turn(COT_REPLY, "stop", None, Q, "cot").program is None


def test_a_failed_call_of_a_pot_agent_runs_nothing(monkeypatch):
    monkeypatch.setattr(pot, "run_program", lambda *a, **k: pytest.fail("ran a program of a failed call"))
    g = grade_turn("", "error", "boom", Q, "pot")
    assert g.astuple() == (None, None, False, "none") and g.program is None


def test_a_pot_turns_confidence_has_no_answer_span():
    engine = DebateEngine(FakeBackend(by_style(), logprobs=True), config(logprobs=1, n_rounds=0))
    (d,) = engine.start([Q])
    cot, pot_turn = d.trace.rounds[0][0], d.trace.rounds[0][1]
    assert cot.confidence["answer_mean"] is not None  # "42" is in the cot text
    assert pot_turn.confidence["answer_mean"] is None and pot_turn.confidence["mean_logprob"] is not None


# ---------------------------------------------------------------- the synthetic backend and dear.infer
def test_the_sim_backend_refuses_pot_agents_clearly():
    from dear.sim import SimBackend

    with pytest.raises(ValueError, match="synthetic backend .* write no programs"):
        DebateEngine(SimBackend(seed=0), config())
    DebateEngine(SimBackend(seed=0), config(agent_profiles=("cot", "direct", "cot")))  # the other styles run


@pytest.fixture
def exported(tmp_path):
    import torch

    from dear.export import export_policy
    from dear.policy import JointPolicy, PolicyConfig

    torch.manual_seed(0)
    return export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "policy", encoder="hashing",
                         training={"n_rounds": 1, "synthetic": True, "llm": "sim"})


def test_dear_infer_runs_a_cot_pot_cot_pool_and_refuses_it_on_the_sim(exported, tmp_path):
    from dear.infer import RegulatedDebater, main

    with RegulatedDebater(exported, FakeBackend(by_style()), seed=0, n_rounds=1,
                          agent_profiles=parse_profiles("cot,pot,cot"), sandbox_limits=L) as debater:
        assert debater.config.sandbox_limits == L
        result = debater.ask("Tom has 6 boxes of 7 pens. How many pens?", kind="integer", gold="42")
    assert not result.failed and result.answer == "42" and result.correct
    assert result.trace.rounds[0][1].program["stdout"] == "42\n"
    # dear.serve: every method's engine is built once from the debater's config, so its sandbox limits are the
    # server's (the defaults: `python -m dear.serve` takes no limits and a request names none)
    from dear.sandbox import DEFAULT_LIMITS
    from dear.serve.methods import build_methods

    backend = FakeBackend(by_style())
    with RegulatedDebater(exported, backend, n_rounds=1, agent_profiles=parse_profiles("cot,pot,cot")) as server:
        methods = build_methods(server, backend)
    assert {m.config.sandbox_limits for m in methods.values()} == {DEFAULT_LIMITS}

    import argparse

    from dear.serve.__main__ import checked_profiles

    a = argparse.Namespace(agent_profiles=parse_profiles("cot,pot,cot"), llm="sim", policy="p")
    with pytest.raises(ValueError, match="synthetic backend 'sim'"):  # refused before the server starts
        checked_profiles(a, 3)
    assert checked_profiles(argparse.Namespace(**{**vars(a), "llm": "smoke"}), 3) == a.agent_profiles
    with pytest.raises(ValueError, match="agent 1's profile 'sim:pot' .* synthetic backend"):
        main(["--policy", str(exported), "--llm", "sim", "--question", "1+1?", "--agent-profiles", "cot,pot,cot",
              "--out", str(tmp_path / "t.jsonl")])


# ---------------------------------------------------------------- the real smoke model (plumbing only)
@pytest.mark.slow
def test_a_pot_debate_runs_end_to_end_on_the_smoke_model():
    """SmolLM2-135M writes nonsense programs; only the plumbing is checked: every turn ran or was refused in the
    sandbox, nothing raised, and the trace holds each pot turn's program."""
    from dear.llm.registry import make_backend

    with make_backend("smoke", n_threads=1, n_parallel=3, n_ctx=2048) as be:
        engine = DebateEngine(be, config(max_tokens=48))
        (d,) = engine.run([Q], MADProtocol(3, 1))
    assert d.done and not d.failed, d.error
    assert len(d.trace.rounds) == 2
    for turns in d.trace.rounds:
        assert [t.style for t in turns] == list(POOL)
        prog = turns[1].program
        assert prog is not None and prog["verdict"] in ("ok", "refused", "error", "timeout", "memory", "blocked",
                                                        "output-limit")
        assert (turns[1].answer is None) or prog["verdict"] == OK
        assert turns[0].program is None and turns[2].program is None
    assert DebateTrace.from_json(d.trace.to_json()).rounds[0][1].program == d.trace.rounds[0][1].program
