"""eval.mode_choice_bound: answer histories by hand, fixed rules equal their replay, the solved policy by hand."""

from __future__ import annotations

import csv
import random

import numpy as np
import pytest

from dear.debate.mode_mixing import drawn
from dear.bank.store import BankSample, ShelfKey
from dear.debate.sampling_rules import Samples, rule_outcome
from eval import mode_choice_bound as M


def test_answer_classes_and_the_leaders_votes():
    assert M.answer_class([], "4") == M.NEW
    assert M.answer_class(["4", None, "5"], "5") == 2
    assert M.answer_class(["4"], None) == M.NONE
    history = ((0, M.NEW), (1, M.NONE), (1, M.NEW), (0, 2), (0, 2))
    assert M.leader_votes(history) == 3 and M.drawn_per_mode(history) == (3, 2)
    assert M.leader_votes(((0, M.NONE),)) == 0


def _samples(keys, right="1", tokens=100):
    return Samples(tuple(keys), tuple(k == right for k in keys), (tokens,) * len(keys), (None,) * len(keys))


def _pool(questions, n_orders=1, width=None):
    """questions: per question, (mode 0's keys, mode 1's keys), each drawn in the stored order n_orders times."""
    width = width or len(questions[0][0])
    drawn_ = tuple(tuple(tuple(_samples(keys) for _ in range(n_orders)) for keys in q) for q in questions)
    return M.Pool(("cot", "pot"), tuple(f"q{i}" for i in range(len(questions))), drawn_, width)


def test_the_solved_policy_by_hand():
    """Mode 1 is right at once on q0 and q1; mode 0 is wrong until its third sample. At a price of 0.1 per 1,000
    tokens one sample of mode 1 (objective 1 - 0.01) beats every longer draw, so the policy draws it and stops."""
    pool = _pool([(["2", "3", "1"], ["1", "1", "1"]), (["5", "6", "1"], ["1", "1", "1"])])
    policy = M.solve(pool, price=0.1, budget=6)
    assert policy[()] == 1 and policy[((1, M.NEW),)] == M.STOP
    played = M.play(pool, lambda h: policy[h], price=0.1, budget=6)
    assert played.accuracy == 1.0 and played.mean_tokens == 100 and played.objective == pytest.approx(0.99)


def test_a_fixed_rule_plays_as_its_replay_and_the_optimum_bounds_every_rule():
    """Adaptive SC from 2 over a schedule, played on answer histories, equals `rule_outcome` on the samples the
    schedule interleaves (dear.debate.mode_mixing.drawn); the solved policy is at least every fixed rule there."""
    rng = random.Random(3)
    questions = [tuple([rng.choice(["1", "2", "3", None]) for _ in range(4)] for _ in range(2)) for _ in range(12)]
    pool = _pool(questions, width=4)
    budget, price = 8, 0.05
    for name, (schedule, mode) in M.FIXED_RULES.items():
        played = M.play(pool, M.fixed_rule(schedule, mode), price, budget)
        by_mode = [[pool.drawn[i][m][0] for m in (0, 1)] for i in range(len(questions))]
        replayed = [rule_outcome(drawn(b, [tuple(range(4))] * 2, schedule, mode), "adaptive-sc-2-from-2")
                    for b in by_mode]
        assert list(played.scores) == pytest.approx([o.score for o in replayed]), name
        assert list(played.tokens) == pytest.approx([o.tokens for o in replayed]), name
    best = M.play(pool, lambda h, p=M.solve(pool, price, budget): p[h], price, budget).objective
    assert all(best >= M.play(pool, M.fixed_rule(*spec), price, budget).objective - 1e-12
               for spec in M.FIXED_RULES.values())


def test_a_fitted_policy_falls_back_where_its_questions_never_went():
    fitted = {(): 0, ((0, M.NEW),): 0}  # two chains of thought, then a history the fit never reached
    test = _pool([(["3", "3"], ["1", "1"])])
    played = M.play(test, lambda h: fitted[h], 0.0, 4, fallback=M.fixed_rule(None, 1), known=lambda h: h in fitted)
    assert played.fallback_share == pytest.approx(1 / 3)  # the third decision: two agree, the rule stops
    assert played.per_mode == (2.0, 0.0) and played.accuracy == 0.0


def test_a_policy_acts_only_where_enough_fit_questions_went():
    """With min_questions above what any history but the first holds, the fitted policy decides only the first draw
    and the fallback plays every later decision; solved with that in place, its objective is the fallback's after the
    best first draw."""
    pool = _pool([(["1", "2", "1"], ["1", "1", "1"]), (["2", "1", "2"], ["1", "1", "1"])])
    fallback = M.fixed_rule(None, 0)
    fitted = M.solve(pool, price=0.0, budget=6, min_questions=3, fallback=fallback)
    assert set(fitted) == {()}
    played = M.play(pool, lambda h: fitted[h], 0.0, 6, fallback=fallback, known=lambda h: h in fitted)
    assert fitted[()] == 1 and played.accuracy == 1.0  # a pot sample first, then cot until two agree
    assert played.per_mode == (1.5, 1.0)


def test_the_command_on_a_bank_replays_the_fixed_rules_as_mode_replay(tmp_path):
    """The fixed rules' rows equal eval.mode_replay's adaptive SC rows on the same bank, width and orders."""
    from eval import mode_replay
    from tests.eval.test_mode_replay import _bank

    bank = _bank(tmp_path / "bank")
    for mode, table in (("cot", {"t0": ["1", "1", "2"], "t1": ["5", "1", "1"]}),
                        ("pot", {"t0": ["1", "2", "2"], "t1": ["1", None, "1"]})):
        shelf = bank.shelf(ShelfKey("gsm8k", "train", mode, 0.7, 0.9, 384))
        for qid, answers in table.items():
            shelf.append([BankSample(qid, i, i, "t", a, a, a == "1", "exact", 10, 5, "stop")
                          for i, a in enumerate(answers)])
        bank.record(shelf, {})
    common = ["--bank", str(tmp_path / "bank"), "--width", "3", "--orders", "4", "--n-boot", "50"]
    assert M.main([*common, "--budget", "6", "--min-questions", "1", "--out", str(tmp_path / "b")]) == 0
    assert mode_replay.main([*common, "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "b" / "summary.md").read_text()
    replay = {r["label"]: r for r in csv.DictReader((tmp_path / "r" / "summary.csv").open())}
    for ours, theirs in (("cot alone", "cot: adaptive SC from 2 until 2"),
                         ("cot, pot, cot, pot, … (`alternate`)", "cot, pot, cot, pot, ...: adaptive SC from 2 until 2")):
        row = next(line for line in text.splitlines() if line.startswith(f"| adaptive SC from 2, {ours} |"))
        assert float(row.split("|")[2]) == pytest.approx(100 * float(replay[theirs]["accuracy"]), abs=0.05)
    assert "upper bound" in text and "nothing synthetic" in text


def test_the_command_refuses_to_fit_on_the_reported_split(tmp_path):
    with pytest.raises(ValueError, match="--fit-split"):
        M.parse_args(["--split", "train", "--fit-split", "train", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--modes"):
        M.parse_args(["--modes", "cot", "--out", str(tmp_path)])


def test_the_coarse_state_by_hand():
    # cot "4", pot "4", pot no answer, cot "5", pot "5", cot "5": leader 5 (3 votes, both modes), second 4 (2 votes)
    history = ((0, M.NEW), (1, 0), (1, M.NONE), (0, M.NEW), (1, 3), (0, 3))
    assert M.coarse_state(history) == (3, 3, 3, 2, M.LEADER_BOTH)
    assert M.coarse_state(((1, M.NEW), (0, M.NEW))) == (1, 1, 1, 1, M.LEADER_SECOND)  # a tie: the first draw leads
    assert M.coarse_state(((0, M.NONE),)) == (1, 0, 0, 0, M.LEADER_NONE) and M.coarse_state(()) == (0, 0, 0, 0, 0)


def test_the_coarse_policy_draws_the_mode_that_is_right_at_once():
    """As in the hand-solved history case: mode 1 is right at once, mode 0 wrong until its third sample, so at a
    price of 0.1 the coarse model's best first draw is mode 1 and its best next action is to stop."""
    pool = _pool([(["2", "3", "1"], ["1", "1", "1"]), (["5", "6", "1"], ["1", "1", "1"])])
    model = M.coarse_model(pool, price=0.1, budget=6)
    policy = M.solve_coarse(model)
    assert policy[(0, 0, 0, 0, 0)] == 1 and policy[(0, 1, 1, 0, M.LEADER_SECOND)] == M.STOP
    assert model.questions[(0, 0, 0, 0, 0)] == 2
    assert model.stop[(1, 0, 1, 0, M.LEADER_FIRST)] == pytest.approx(-0.01)  # one wrong cot sample: 0 - 0.1 * 0.1
    assert model.moves[((0, 0, 0, 0, 0), 0)] == {(1, 0, 1, 0, M.LEADER_FIRST): 1.0}
    played = M.play(pool, lambda h: policy[M.coarse_state(h)], price=0.1, budget=6)
    assert played.accuracy == 1.0 and played.mean_tokens == 100


def test_cross_fitting_scores_every_fit_question_once_out_of_fold():
    rng = random.Random(5)
    questions = [tuple([rng.choice(["1", "2", None]) for _ in range(3)] for _ in range(2)) for _ in range(9)]
    pool = _pool(questions, n_orders=2, width=3)
    cross = M.cross_fitted(pool, price=0.05, budget=4, min_questions=1, seed=0)
    assert set(cross) == {"best fixed rule", "history policy", "coarse policy"}
    assert all(len(v) == 9 for v in cross.values())
    order = np.random.default_rng(0).permutation(9)
    held, fit = sorted(order[:4]), sorted(order[4:])
    fitted = M.fitted_policies(M.subpool(pool, fit), M.subpool(pool, held), 0.05, 4, 1)
    assert list(cross["coarse policy"][held]) == pytest.approx(list(fitted["coarse policy"].objectives))


def test_the_coarse_walk_keeps_the_states_and_stop_values_of_the_histories():
    """The running walk of coarse_model gives every history the state `coarse_state` gives it and the objective
    `_ended` gives its stop, on random samples with missing answers."""
    rng = random.Random(11)
    questions = [tuple([rng.choice(["1", "2", "3", None]) for _ in range(3)] for _ in range(2)) for _ in range(6)]
    pool = _pool(questions, width=3)
    model = M.coarse_model(pool, price=0.05, budget=5)
    stop, reached = {}, {}
    for i, p in pool.pairs():
        def walk(history, picks):
            state = M.coarse_state(history)
            reached.setdefault(state, set()).add(i)
            if history:
                stop.setdefault(state, []).append(M._ended(pool, i, p, picks, 0.05)[2])
            for action in M.allowed(history, pool.width, 5):
                if action != M.STOP:
                    k = sum(m == action for m, _ in picks)
                    keys = [pool.drawn[i][m][p].keys[j] for m, j in picks]
                    walk(history + ((action, M.answer_class(keys, pool.drawn[i][action][p].keys[k])),),
                         picks + ((action, k),))
        walk((), ())
    assert model.questions == {s: len(q) for s, q in reached.items()}
    assert model.stop == pytest.approx({s: float(np.mean(v)) for s, v in stop.items()})
