"""Building blocks of the evaluation harness: debates from a stored round 0, the truncation rule, narrow
HCR/BCR, read density, the density-matched random mask and the policy's training-world label."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MADProtocol, prompts
from dear.llm.base import Backend, ChatRequest, Completion
from dear.metrics import ScoredDebate, conformity, conformity_narrow, summarize
from dear.tasks.types import Question
from eval import methods as M


class Scripted(Backend):
    """`script(request) -> (text, finish_reason)`; counts the requests it answered."""

    model_id = "scripted"

    def __init__(self, script):
        self.script = script
        self.requests: list[ChatRequest] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.requests += requests
        out = []
        for r in requests:
            text, finish = self.script(r)
            out.append(Completion(text, 10, len(text.split()), finish, 0.0))
        return out


def q(i: int = 0, gold: str = "7", kind: str = "numeric") -> Question:
    return Question(id=f"q{i}", task="gsm8k", question=f"What is 3 + {i + 4}?", gold=gold, kind=kind)


def marked(agent: int, rnd: int, ans: str) -> tuple[str, str]:
    return f"Reasoning: agent {agent} round {rnd}.\nConclusion: it is {ans}.\nFinal answer: \\boxed{{{ans}}}", "stop"


# ---------------------------------------------------------------- truncation
def test_truncated_completion_without_marked_answer_is_no_answer():
    cut = "Reasoning: 3 + 4 = 7, then we double-check 12"
    assert prompts.extract(cut, q()) == "12"  # untruncated: the last-number fallback
    assert prompts.extract(cut, q(), truncated=True) is None
    math_cut = "Reasoning: we simplify\n\\frac{1}{2} + x"
    mq = q(kind="math", gold="x")
    assert prompts.extract(math_cut, mq) is not None and prompts.extract(math_cut, mq, truncated=True) is None
    # marked answers still count when the cut came later
    assert prompts.extract("Final answer: \\boxed{7}\nLet me also check 12", q(), truncated=True) == "7"
    assert prompts.extract("So the answer is 7.\nAnother way: 3 + 4 = 12", q(), truncated=True) == "7"


def test_engine_applies_truncation_rule():
    be = Scripted(lambda r: ("Reasoning: 3 + 4 = 7 so 7", "length") if r.metadata["agent"] == 0
                  else marked(r.metadata["agent"], 0, "7"))
    (d,) = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=0)).start([q()])
    assert d.trace.rounds[0][0].answer is None and d.trace.rounds[0][0].finish_reason == "length"
    assert d.trace.rounds[0][1].answer == "7"


# ---------------------------------------------------------------- start_from_round0
def test_start_from_round0_continues_the_stored_answers_without_regenerating_them():
    answers = {0: "7", 1: "7", 2: "9"}
    be = Scripted(lambda r: marked(r.metadata["agent"], r.metadata["round"], answers[r.metadata["agent"]]))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=0))
    (stored,) = eng.start([q()])
    n_before = len(be.requests)
    mad = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1))
    (d,) = mad.start_from_round0([q()], [stored.trace.rounds[0]])
    assert len(be.requests) == n_before and d.round == 0 and not d.done  # round 0 was not generated
    mad.step([d], MADProtocol(3, 1).controls([d]))
    assert d.finished
    assert [r.metadata["round"] for r in be.requests[n_before:]] == [1, 1, 1]
    assert [t.text for t in d.trace.rounds[0]] == [t.text for t in stored.trace.rounds[0]]
    assert d.trace.prompt_tokens == 6 * 10  # round 0 is charged to the method too
    # round 0 only: finished at once, with the plurality of the stored answers
    (m,) = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=0)).start_from_round0([q()], [stored.trace.rounds[0]])
    assert m.finished and m.trace.final_answer == "7" and m.trace.final_correct
    # wrong width or order is refused with the debate named
    with pytest.raises(ValueError, match=r"round0_turns of gsm8k/q0/.*agents 0..2 in order"):
        DebateEngine(be, DebateConfig(n_agents=3)).start_from_round0([q()], [stored.trace.rounds[0][:2]])
    with pytest.raises(ValueError, match="round0_turns has 2 entries for 1 questions"):
        DebateEngine(be, DebateConfig(n_agents=3)).start_from_round0([q()], [[], []])


def test_start_from_round0_with_a_failed_turn_fails_the_debate():
    stored = DebateEngine(Scripted(lambda r: marked(r.metadata["agent"], 0, "7")),
                          DebateConfig(n_agents=2, n_rounds=0)).start([q()])[0].trace.rounds[0]
    stored[1].error = "HTTP 503"
    (d,) = DebateEngine(Scripted(lambda r: marked(0, 1, "7")), DebateConfig(n_agents=2)).start_from_round0(
        [q()], [stored])
    assert d.failed and "HTTP 503" in d.error and d.trace.failed


# ---------------------------------------------------------------- narrow HCR / BCR and read density
def test_narrow_conformity_counts_only_readers_and_adoption():
    # round 0: agent 0 correct ("4") in the minority, agents 1-2 share the wrong "5"
    answers = [["4", "5", "5"], ["5", "5", "5"]]
    correct = [[True, False, False], [False, False, False]]
    # today's HCR counts the case whether or not agent 0 read anyone
    assert conformity(answers, correct).hcr.num == 1
    read = [[0, 0, 0], [2, 2, 2]]
    assert conformity_narrow(answers, correct, read).hcr == conformity(answers, correct).hcr
    # agent 0 read nobody: not a conformity case in the narrow reading
    assert conformity_narrow(answers, correct, [[0, 0, 0], [0, 2, 2]]).hcr.den == 0
    # wrong at r+1, but not by adopting the plurality's answer: a case, not harmful
    other = [["4", "5", "5"], ["6", "5", "5"]]
    assert conformity(other, correct).hcr.num == 1
    assert conformity_narrow(other, correct, read).hcr.num == 0 and conformity_narrow(other, correct, read).hcr.den == 1
    # BCR narrow: a wrong minority that adopts the correct plurality
    answers_b = [["9", "4", "4"], ["4", "4", "4"]]
    correct_b = [[False, True, True], [True, True, True]]
    assert conformity_narrow(answers_b, correct_b, read).bcr.num == 1


def test_summary_reads_truncation_density_and_narrow_rates():
    recs = [ScoredDebate(answers=[["4", "5", "5"], ["5", "5", "5"]],
                         correct=[[True, False, False], [False, False, False]], final_correct=False,
                         peers_read=[[0, 0, 0], [2, 1, 0]],
                         truncated=[[False, True, False], [True, False, False]], question_id="a"),
            ScoredDebate(answers=[["4", None, "4"], ["4", "4", "4"]],
                         correct=[[True, False, True], [True, True, True]], final_correct=True,
                         peers_read=[[0, 0, 0], [1, 1, 1]],
                         truncated=[[False, True, False], [False, False, False]], question_id="b")]
    s = summarize(recs, n_boot=50)
    assert (s.truncated.num, s.truncated.den) == (3, 12)
    assert (s.truncated_no_answer.num, s.truncated_no_answer.den) == (1, 3)
    assert s.read_density == pytest.approx([((2 + 1 + 0) / 3 / 2 + 1 / 2) / 2])
    assert (s.hcr_narrow.num, s.hcr_narrow.den) == (1, 1)
    row = s.to_row()
    assert row["truncation_num"] == 3 and row["hcr_narrow_den"] == 1 and "read_density_r1" in row
    with pytest.raises(ValueError, match="peers_read does not have the answers' shape"):
        ScoredDebate(answers=[["4"]], correct=[[True]], final_correct=True, peers_read=[[0, 0]])


# ---------------------------------------------------------------- density-matched random mask
class _Inner:
    n_rounds = 2
    name = "dear-random-mask"
    records: dict = {}

    def __init__(self):
        from dear.policy import JointPolicy, PolicyConfig

        self.policy = JointPolicy(PolicyConfig(n_agents=3, selection_mode="random"))
        self.seen: list[float] = []

    def controls(self, debates):
        self.seen.append(self.policy.config.random_p)
        return []


class _D:
    def __init__(self, r):
        self.round = r


def test_density_matched_sets_the_round_density():
    inner = _Inner()
    proto = M.DensityMatched(inner, [0.25, 0.75])
    proto.controls([_D(0), _D(0)])
    proto.controls([_D(1)])
    assert inner.seen == [0.25, 0.75]
    with pytest.raises(ValueError, match="debates at different rounds"):
        proto.controls([_D(0), _D(1)])
    with pytest.raises(ValueError, match="1 round densities for 2 exchange rounds"):
        M.DensityMatched(_Inner(), [0.5])


def test_random_mask_realized_density_follows_p():
    from dear.policy import JointPolicy, PolicyConfig

    pol = JointPolicy(PolicyConfig(n_agents=3, selection_mode="random", random_p=0.2, seed=1))
    obs = np.zeros((4000, 21), dtype=np.float32)
    act = pol.act(obs, np.zeros((4000, 3, 3)), np.ones((4000, 3)))
    assert float(act.pairs.mean()) == pytest.approx(0.2, abs=0.02)


# ---------------------------------------------------------------- training world
def test_training_world():
    assert M.training_world({"llm": "sim"}) == "sim-trained"
    assert M.training_world({"llm": "sim", "sim_params": "results/sim_fit/params.json"}) == "sim-fitted"
    assert M.training_world({"llm": "sim", "sim_params": {"temp_penalty": 2.0}}) == "sim-trained"
    assert M.training_world({"llm": "local"}) == "local-trained"
    assert M.training_world({"llm": "sim", "world": "fitted-gsm8k"}) == "fitted-gsm8k"
    assert M.training_world({}) == "unknown-trained"
