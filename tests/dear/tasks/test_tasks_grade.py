"""Graders: tricky pairs per answer kind, the grader that decided, threads, pathological inputs, gold self-checks."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dear.tasks import GradeResult, Question, grade, load
from dear.tasks.grade import _too_risky


def q(gold: str, kind: str, choices: tuple[str, ...] | None = None) -> Question:
    return Question(id="t", task="test", question="?", gold=gold, kind=kind, choices=choices)


# (prediction, gold, correct)
NUMERIC = [
    ("1,000", "1000", True),
    ("$1000.00", "1000", True),
    ("1000", "1,000", True),
    ("18.0", "18", True),
    ("-9867630", "-9867630", True),
    ("-9867630.0", "-9867630", True),
    ("9867630", "-9867630", False),
    ("3244047.1", "3244047.1", True),
    ("14053029.67", "14053029.6667", True),  # gold rounded to the decimals the prediction shows
    ("14053029.7", "14053029.6667", True),
    ("14053030", "14053029.6667", False),  # rounding to an integer is not the answer
    ("0.00168", "0.0016791648", True),
    ("0.0017", "0.0016791648", True),
    ("0.002", "0.0016791648", True),
    ("0.001", "0.0016791648", False),
    ("2.13", "2.125", True),  # half up, not banker's rounding
    ("\\frac{1}{2}", "0.5", True),
    ("1/4", "0.25", True),
    ("6277334001", "6277334000", False),  # no relative slack for integer golds
    ("50%", "50", True),
    ("x = 3", "3", True),
    ("18 eggs", "18", True),
    ("eighteen", "18", False),
]

INTEGER = [
    ("025", "25", True),
    ("25", "025", True),
    ("25.0", "025", True),
    ("\\boxed{073}", "073", True),
    ("73", "073", True),
    ("25.5", "25", False),
    ("26", "025", False),
    ("1,000", "1000", True),
    ("-25", "25", False),
    ("x = 204", "204", True),
    ("204 minutes", "204", True),
    ("\\frac{50}{2}", "025", True),
    ("abc", "25", False),
]

CHOICE = [
    ("B", "B", True),
    ("b", "B", True),
    ("(B)", "B", True),
    ("\\text{(B)}", "B", True),
    ("\\textbf{B}", "B", True),
    ("**B**", "B", True),
    ("B) Paris", "B", True),
    ("B.", "B", True),
    ("Option B", "B", True),
    ("C", "B", False),
    ("(c)", "B", False),
    ("blue", "B", True),  # the option text maps to its letter
    ("red", "B", False),
]

MATH = [
    ("\\frac12", "\\frac{1}{2}", True),
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("1/2", "\\dfrac12", True),
    ("1,000", "1000", True),
    ("x = 3", "3", True),
    ("3", "x=3", True),
    ("[1, 2)", "[1,2)", True),
    ("(1,2)", "[1,2]", False),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt2}", True),
    ("3\\sqrt{13}", "\\sqrt{117}", True),
    ("90^\\circ", "90", True),
    ("90", "90^\\circ", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("Evelyn", "\\text{Evelyn}", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "(x+1)^2", False),
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\end{pmatrix}",
        True,
    ),
    ("5", "6", False),
]


@pytest.mark.parametrize("pred,gold,correct", NUMERIC)
def test_numeric_pairs(pred, gold, correct):
    r = grade(pred, q(gold, "numeric"))
    assert (r.correct, r.grader) == (correct, "numeric"), r


@pytest.mark.parametrize("pred,gold,correct", INTEGER)
def test_integer_pairs(pred, gold, correct):
    r = grade(pred, q(gold, "integer"))
    assert (r.correct, r.grader) == (correct, "integer"), r


@pytest.mark.parametrize("pred,gold,correct", CHOICE)
def test_choice_pairs(pred, gold, correct):
    r = grade(pred, q(gold, "choice", ("red", "blue", "green")))
    assert (r.correct, r.grader) == (correct, "choice"), r


@pytest.mark.parametrize("pred,gold,correct", MATH)
def test_math_pairs(pred, gold, correct):
    r = grade(pred, q(gold, "math"))
    assert r.correct == correct, r
    assert r.grader in ("math-verify", "string")
    if correct:
        assert r.grader == "math-verify" or pred.startswith("Evelyn"), r


def test_math_verify_decides_and_string_rescues_bare_words():
    assert grade("0.5", q("\\frac{1}{2}", "math")).grader == "math-verify"
    assert grade("\\frac{1}{3}", q("\\frac{1}{2}", "math")) == GradeResult(
        False, "math-verify", "\\frac{1}{3}"
    )


def test_no_answer_is_graded_none():
    for kind, gold in (("numeric", "1"), ("integer", "1"), ("math", "1"), ("choice", "A")):
        assert grade(None, q(gold, kind, ("x", "y"))) == GradeResult(False, "none", None)
        assert grade("   ", q(gold, kind, ("x", "y"))) == GradeResult(False, "none", None)
    assert grade("no letter here", q("A", "choice", ("x", "y"))) == GradeResult(False, "none", None)


def test_prediction_key_is_recorded():
    assert grade("$1,000.00", q("1000", "numeric")) == GradeResult(True, "numeric", "1000")
    assert grade("\\text{(b)}", q("B", "choice")) == GradeResult(True, "choice", "B")
    assert grade("\\dfrac{1}{2}", q("0.5", "math")).pred == "\\frac{1}{2}"


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown answer kind 'essay'"):
        grade("x", q("x", "essay"))


def test_math_grading_works_in_worker_threads():
    """math-verify's SIGALRM timeouts fail outside the main thread; we switch them off there."""
    pairs = [(p, g, c) for p, g, c in MATH]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: grade(t[0], q(t[1], "math")), pairs))
    assert [r.correct for r in results] == [c for _, _, c in pairs]
    assert results[0].grader == "math-verify"


def test_pathological_math_falls_back_quickly_in_any_thread():
    # Each of these hangs or takes seconds inside sympy (measured); the guard hands them to the string check.
    bad = ["9^{9^{9}}", "10^{10^{100}}", "1000000!", "2^{2^{30}}", "{" * 46 + "1" + "}" * 46, "1" * 5000]
    for s in bad:
        assert _too_risky(s), s

    def run(s):
        t = time.monotonic()
        r = grade(s, q("5", "math"))
        return r, time.monotonic() - t

    with ThreadPoolExecutor(2) as pool:
        for r, secs in pool.map(run, bad):
            assert r.grader == "string" and not r.correct and secs < 1.0
    r, secs = run("9^{9^{9}}")  # main thread too
    assert r.grader == "string" and secs < 1.0
    assert grade("9^{9^{9}}", q("9^{9^{9}}", "math")) == GradeResult(True, "string", "9^{9^{9}}")
    for ok in (
        "x^2+1",
        "2^{10}",
        "\\frac{\\pi^2}{8}",
        "\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]",
    ):
        assert not _too_risky(ok)


def test_outer_interval_timer_survives_math_verify():
    """math-verify's signal.alarm would cancel a running ITIMER_REAL (pytest-timeout uses one)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        grade("\\frac{1}{2}", q("0.5", "math"))
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired


@pytest.mark.parametrize(
    "task", ["gsm8k", "gsm_hard", "aime24", "math500", "gpqa_diamond", "mmlu_pro_health"]
)
def test_every_gold_grades_correct_against_itself(task):
    qs = load(task)
    wrong = [x.id for x in qs if not grade(x.gold, x).correct]
    assert wrong == []
    graders = {grade(x.gold, x).grader for x in qs}
    expected = {"gsm8k": "numeric", "gsm_hard": "numeric", "aime24": "integer", "math500": "math-verify"}
    assert graders == {expected.get(task, "choice")}


def test_math500_golds_are_not_all_equal_to_each_other():
    """A grader that says yes to everything would pass the self-check; shifted golds must mostly fail."""
    qs = load("math500")
    hits = sum(grade(a.gold, b).correct for a, b in zip(qs, qs[1:] + qs[:1]))
    assert hits < 25
