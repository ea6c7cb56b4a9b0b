"""One notion of "the same answer" (dear.tasks.equivalence) and one tie rule (dear.vote), used by every vote."""

from __future__ import annotations

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MADProtocol
from dear.debate.trace import AgentTurn, DebateTrace
from dear.metrics import ScoredDebate, summarize
from dear.tasks import normalize_answer
from dear.tasks import equivalence as eq
from dear.tasks.equivalence import AnswerClasses, same_answer
from dear.tasks.types import Question
from dear.vote import tally, vote
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text

# (kind, a, b, same?) — raw answers, normalised first as the engine does
PAIRS = [
    ("math", "5/4", "1.25", True),
    ("math", "\\frac{5}{4}", "1.25", True),
    ("math", "\\dfrac{3}{4}", "\\frac34", True),
    ("math", "\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt2}", True),
    ("math", "3\\sqrt{2}", "\\sqrt{18}", True),
    ("math", "x = 3", "3", True),
    ("math", "\\{1, 2\\}", "\\{2, 1\\}", True),
    ("math", "2", "2.5", False),
    ("math", "\\frac{1}{3}", "\\frac{1}{4}", False),
    ("math", "x+1", "x-1", False),
    ("math", "\\pi", "3.14159", False),
    ("math", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", False),
    ("numeric", "1,000", "1000.00", True),
    ("numeric", "$18", "18", True),
    ("numeric", "0.5", "1/2", True),
    ("numeric", "2", "2.5", False),
    ("numeric", "18", "-18", False),
    ("choice", "(B)", "B", True),
    ("choice", "B", "C", False),
]


@pytest.mark.parametrize("kind,a,b,same", PAIRS, ids=[f"{k}:{a}|{b}" for k, a, b, _ in PAIRS])
def test_equivalent_forms_vote_together_and_others_do_not(kind, a, b, same):
    ka, kb = normalize_answer(a, kind), normalize_answer(b, kind)
    assert same_answer(ka, kb, kind) is same
    assert same_answer(kb, ka, kind) is same  # symmetric
    classes = AnswerClasses(kind)
    assert (classes.canonical(ka) == classes.canonical(kb)) is same


def test_no_answer_is_never_the_same_as_anything():
    assert not same_answer(None, None, "math")
    assert not same_answer("3", None, "numeric")
    assert AnswerClasses("math").canonical(None) is None


def test_an_unparsable_answer_stays_its_own_key():
    classes = AnswerClasses("math")
    keys = ["\\text{blue}", "}{", "\\text{red}", "3", "\\frac{6}{2}"]
    reps = [classes.canonical(k) for k in keys]
    assert reps[:4] == keys[:4]  # nothing merges with garbage or with a different word
    assert reps[4] == "3"


def test_an_undecided_comparison_counts_as_different_and_is_counted(monkeypatch):
    import sys

    monkeypatch.setattr(sys.modules["dear.tasks.grade"], "math_keys_equal", lambda a, b: None)  # as a sympy timeout reports it
    before = eq.STATS.undecided
    assert not same_answer("\\frac{7}{9}x^{11}", "0.777777777778x^{11}", "math")
    assert eq.STATS.undecided == before + 1


def test_classes_group_a_round_so_the_correct_answer_wins():
    # The MATH-500 prealgebra/1558 shape: two correct forms split the string vote, a wrong one tied with each.
    classes = AnswerClasses("math")
    keys = [classes.canonical(normalize_answer(a, "math")) for a in ("\\frac{5}{4}", "1.25", "\\frac{3}{2}")]
    t = tally(keys)
    assert not t.tie and t.top == 2 and t.leaders == ("\\frac{5}{4}",)


# ---------------------------------------------------------------- one tie rule
def test_tie_scores_are_expected_values():
    rng = np.random.default_rng(0)
    assert vote(["a", "a", "b"], [True, True, False], rng).score == 1.0
    assert vote(["a", "b"], [True, False], rng).score == 0.5
    assert vote(["a", "b", "c"], [False, True, False], rng).score == pytest.approx(1 / 3)
    assert vote(["a", "b", "c"], [False, False, False], rng).score == 0.0
    assert vote([None, None], [False, False], rng).score == 0.0
    assert vote(["a", None, "b", "b"], [True, False, False, False], rng).score == 0.0


def test_the_seeded_pick_is_kept_beside_the_score():
    picks = {vote(["a", "b"], [True, False], np.random.default_rng(s)).answer for s in range(20)}
    assert picks == {"a", "b"}  # the pick still draws; the score does not
    assert {vote(["a", "b"], [True, False], np.random.default_rng(s)).score for s in range(20)} == {0.5}


def test_summaries_use_the_expected_value_and_report_the_pick_apart():
    tied = ScoredDebate(answers=[["a", "b"]], correct=[[True, False]], final_correct=False, tie=True)
    won = ScoredDebate(answers=[["a", "a"]], correct=[[True, True]], final_correct=True)
    assert tied.score == 0.5 and won.score == 1.0
    s = summarize([tied, won], n_boot=50)
    assert s.accuracy.mean == 0.75 and s.accuracy_seeded.mean == 0.5
    assert s.to_row()["accuracy"] == 0.75 and s.to_row()["accuracy_seeded_pick"] == 0.5
    failed = ScoredDebate(answers=[["a", "a"]], correct=[[True, True]], final_correct=False, failed=True)
    assert failed.score == 0.0


def _turn(agent: int, key: str | None, correct: bool) -> AgentTurn:
    return AgentTurn(agent=agent, round=0, messages=[], text="", reasoning="r", conclusion="c", answer=key,
                     answer_key=key, correct=correct, grader="numeric", temperature=0.7, top_p=0.9, seed=0,
                     peers=[], prompt_tokens=1, completion_tokens=1, finish_reason="stop", latency_s=0.0)


def test_a_trace_written_before_scores_were_recorded_scores_its_last_round():
    tr = DebateTrace(debate_id="d", question_id="q", task="gsm8k", question="?", gold="1", kind="numeric",
                     model_ids=["m", "m"])
    tr.add_round([_turn(0, "1", True), _turn(1, "2", False)])
    assert tr.final_score is None and tr.final_expected == 0.5
    tr.failed = True
    assert tr.final_expected == 0.0


# ---------------------------------------------------------------- the engine uses both
def test_the_engine_groups_equivalent_answers_and_scores_ties():
    answers = {0: "\\frac{5}{4}", 1: "1.25", 2: "\\frac{3}{2}"}
    backend = FakeBackend(lambda r: answer_text(r.metadata["agent"], r.metadata["round"],
                                                answers[r.metadata["agent"]]))
    q = Question(id="q1", task="math500", question="What is 5/4?", gold="\\frac{5}{4}", kind="math")
    engine = DebateEngine(backend, DebateConfig(n_agents=3, n_rounds=1, seed=0))
    (d,) = engine.run([q], MADProtocol(3, 1))
    tr = d.trace
    assert [t.answer_key for t in tr.rounds[-1]] == ["\\frac{5}{4}", "\\frac{5}{4}", "\\frac{3}{2}"]
    assert tr.final_answer == "\\frac{5}{4}" and tr.final_correct and tr.final_score == 1.0 and not tr.tie
    assert tr.vote_counts == {"\\frac{5}{4}": 2, "\\frac{3}{2}": 1}
