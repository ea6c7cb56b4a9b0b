"""dear.debate.sampling_rules' new rules (adaptive SC from a start, ESC, CISC, confident stop) and
dear.debate.replay_orders (order-averaged replay, fitting tau and the stop threshold), each against a case worked out
by hand."""

from __future__ import annotations

import itertools
import math

import pytest

from envs.reward import objective

from dear.debate import replay_orders as O
from dear.debate import sampling_rules as R


def _samples(keys, conf=None, tokens=None, right="a"):
    """Samples whose key `right` is the correct one; tokens 1, 2, 3, ... unless given."""
    return R.Samples(tuple(keys), tuple(k == right for k in keys),
                     tuple(tokens or range(1, len(keys) + 1)), None if conf is None else tuple(conf))


def test_adaptive_sc_from_a_start():
    s = _samples(["a", "b", "c", "b", "a", "a"])
    # from 1 until 2: a | a b | a b c | a b c b -> b and b agree at 4 samples; plurality b (wrong); tokens 1+2+3+4
    assert R.rule_outcome(s, "adaptive-sc-2-from-1") == R.Outcome(0.0, 4, 10)
    assert R.samples_used(s, "adaptive-sc-2-from-2") == 4
    assert R.rule_outcome(s, "adaptive-sc-3-from-1") == R.Outcome(1.0, 6, 21)  # a reaches 3 at the 6th sample
    for a in (2, 3):  # from-3 is the old adaptive-sc-A, whatever `start` the caller passes
        assert R.rule_outcome(s, f"adaptive-sc-{a}-from-3", start=1) == R.rule_outcome(s, f"adaptive-sc-{a}")
    assert R.samples_used(_samples(["a", "a", "b"]), "adaptive-sc-2-from-1") == 2
    with pytest.raises(ValueError, match="at least 1"):
        R.samples_used(s, "adaptive-sc-2-from-0")
    with pytest.raises(ValueError, match="unknown rule 'adaptive-sc-x-from-2'"):
        R.samples_used(s, "adaptive-sc-x-from-2")


def test_esc_stops_after_the_first_unanimous_window():
    s = _samples(["b", "a", "c", "c", "a", "a", "a"], right="c")
    # W=2: (b a) mixed, (c c) unanimous -> 4 drawn; plurality over b a c c is c (right); tokens 1+2+3+4
    assert R.rule_outcome(s, "esc-2") == R.Outcome(1.0, 4, 10)
    # W=3: (b a c), (c a a) mixed; the 7th alone is no window -> all 7; plurality a (4 votes, wrong)
    assert R.rule_outcome(s, "esc-3") == R.Outcome(0.0, 7, 28)
    # a window of missing answers is not unanimous; a window wider than the samples reads them all
    assert R.rule_outcome(_samples([None, None, "a", "a"]), "esc-2") == R.Outcome(1.0, 4, 10)
    assert R.samples_used(_samples(["a", "a"]), "esc-3") == 2
    with pytest.raises(ValueError, match="at least 1"):
        R.samples_used(s, "esc-0")


def test_cisc_weighs_votes_by_softmax_of_confidence():
    s = _samples(["a", "b", "b"], conf=[-0.1, -0.5, -0.6])
    # tau 0.1: weights ∝ e^-1, e^-5, e^-6 -> a (1) outweighs b (e^-4 + e^-5 ≈ 0.025)
    assert R.rule_outcome(s, "cisc-3", params=R.RuleParams(tau=0.1)) == R.Outcome(1.0, 3, 6)
    # tau 10: ∝ e^-0.01, e^-0.05, e^-0.06 -> b (≈ 1.89) outweighs a (≈ 0.99)
    assert R.rule_outcome(s, "cisc-3", params=R.RuleParams(tau=10.0)).score == 0.0
    assert R.rule_outcome(s, "cisc-1").score == 1.0  # only the first sample votes
    w = R.cisc_weights([-0.1, -0.5, -0.6], 0.1)
    assert sum(w) == pytest.approx(1.0)
    assert w[1] / w[0] == pytest.approx(math.exp(-4))
    # equal weights tie 1-1: the expected value over the two leaders
    assert R.rule_outcome(_samples(["a", "b"], conf=[-0.2, -0.2]), "cisc-2").score == 0.5


def test_a_missing_confidence_weighs_least():
    assert R.cisc_weights([None, -0.3, -0.1], 0.1)[0] == pytest.approx(R.cisc_weights([-0.3, -0.3, -0.1], 0.1)[0])
    assert R.cisc_weights([None, None], 1.0) == [0.5, 0.5]
    # a (no confidence) weighs as b's -0.3, so b and b outvote it
    assert R.rule_outcome(_samples(["a", "b", "b"], conf=[None, -0.3, -0.3]), "cisc-3").score == 0.0
    with pytest.raises(ValueError, match="reads confidences"):
        R.rule_outcome(_samples(["a", "b"]), "cisc-2")
    with pytest.raises(ValueError, match="needs 4 samples"):
        R.rule_outcome(_samples(["a", "b"], conf=[0, 0]), "cisc-4")


def test_confident_stop():
    s = _samples(["a", "b", "b", "a"], conf=[-0.1, -0.5, -0.6, -0.1])
    confident = R.RuleParams(tau=0.1, threshold=-0.2)
    assert R.rule_outcome(s, "confident-stop", params=confident) == R.Outcome(1.0, 1, 1)
    # -0.1 < -0.05: on from the first until 2 agree (a b b: 3 samples), then the CISC vote over them
    assert R.rule_outcome(s, "confident-stop", params=R.RuleParams(tau=0.1, threshold=-0.05)) == R.Outcome(1.0, 3, 6)
    assert R.rule_outcome(s, "confident-stop", params=R.RuleParams(tau=10.0, threshold=-0.05)) == R.Outcome(0.0, 3, 6)
    assert R.samples_used(s, "confident-stop") == 3  # the default threshold (inf) never stops at the first
    # a first sample without a confidence, or without an answer, never clears the threshold
    everything = R.RuleParams(threshold=-math.inf)
    assert R.samples_used(_samples(["a", "b", "b"], conf=[None, 0, 0]), "confident-stop", params=everything) == 3
    assert R.samples_used(_samples([None, "b", "b"], conf=[0, 0, 0]), "confident-stop", params=everything) == 3
    assert R.samples_used(_samples(["a", "b"], conf=[0, 0]), "confident-stop", params=R.RuleParams(agree=3)) == 2


def test_the_old_rules_ignore_confidences():
    keys = ["a", "b", "b", "c", "a", "a"]
    plain, scored = _samples(keys), _samples(keys, conf=[-1, 0, 0, 0, -1, 5])
    for rule in ("cot", "sc-3", "sc-6", "adaptive-sc-2", "adaptive-sc-3", "adaptive-sc-2-from-1", "esc-2"):
        assert R.rule_outcome(plain, rule) == R.rule_outcome(scored, rule), rule
    with pytest.raises(ValueError, match="2 confidences for 6 samples"):
        R.Samples(tuple(keys), (True,) * 6, (1,) * 6, (0.0, 0.0))


# ---------------------------------------------------------------- replay over orders
ALL_SIX = tuple(itertools.permutations(range(3)))


def test_replay_over_all_six_orders():
    s = _samples(["a", "b", "b"])  # tokens 1, 2, 3
    # sc-2 on the 6 orders: (a b) (a b) (b a) (b b) (b a) (b b) -> 1/2, 1/2, 1/2, 0, 1/2, 0; tokens 3 4 3 5 4 5
    r = O.replayed(s, "sc-2", R.DEFAULT_PARAMS, ALL_SIX)
    assert (r.score, r.used, r.tokens) == (pytest.approx(2 / 6), 2.0, pytest.approx(24 / 6))
    assert r.stored == R.Outcome(0.5, 2, 3)
    # adaptive from 1 until 2: b b at the front stops at 2 (2 of 6 orders), else all 3; the vote is always b
    r = O.replayed(s, "adaptive-sc-2-from-1", R.DEFAULT_PARAMS, ALL_SIX)
    assert (r.score, r.used, r.tokens) == (0.0, pytest.approx(16 / 6), pytest.approx((4 * 6 + 2 * 5) / 6))
    # single CoT over the rotations: the exact mean over positions
    assert O.rotations(3) == ((0, 1, 2), (1, 2, 0), (2, 0, 1))
    assert O.replayed(s, "cot", R.DEFAULT_PARAMS, O.rotations(3)).score == pytest.approx(1 / 3)


def test_orders_are_seeded_by_question_and_shared_by_every_rule(monkeypatch):
    first = O.orders(9, 20, 0, "gsm8k-test-7")
    assert first == O.orders(9, 20, 0, "gsm8k-test-7")
    assert all(sorted(o) == list(range(9)) for o in first) and len(first) == 20
    assert first != O.orders(9, 20, 1, "gsm8k-test-7") and first != O.orders(9, 20, 0, "gsm8k-test-8")
    q = O.ReplayQuestion.of("gsm8k-test-7", _samples("abcabcabc", conf=[0.0] * 9), 20, 0)
    assert q.orders == first
    seen: dict[str, list] = {}
    real = O.rule_outcome

    def spy(s, rule, **kw):
        seen.setdefault(rule, []).append(s.keys)
        return real(s, rule, **kw)

    monkeypatch.setattr(O, "rule_outcome", spy)
    for rule in ("sc-3", "esc-2", "cisc-5", "confident-stop"):
        O.replayed(q.samples, rule, R.DEFAULT_PARAMS, q.orders)
    draws = list(seen.values())
    assert all(d == draws[0] for d in draws) and len(draws[0]) == 21  # 20 orders, then the stored one


# ---------------------------------------------------------------- fitting
def _question(qid, keys, conf, tokens=None):
    return O.ReplayQuestion(qid, _samples(keys, conf, tokens), ((0, 1, 2),))


def test_fit_tau_picks_the_best_grid_point():
    grid = (0.01, 1.0, 100.0)
    # q2 [a a b], conf -0.5 -0.5 -0.1: tau 0.01 -> b (0); tau 1: a 2e^-0.4 ≈ 1.34 > b 1 (1); tau 100 -> a (1)
    q2 = _question("q2", ["a", "a", "b"], [-0.5, -0.5, -0.1])
    # q3 [a b b], conf -0.1 -0.9 -0.9: tau 0.01 -> a (1); tau 1: a 1 > b 2e^-0.8 ≈ 0.90 (1); tau 100 -> b (0)
    q3 = _question("q3", ["a", "b", "b"], [-0.1, -0.9, -0.9])
    assert O.fit_tau([q2, q3], 3, grid) == O.Fit(1.0, 1.0, grid)
    # q1 [a b b], conf -0.1 -0.5 -0.5: right only at tau 0.01; with q2 every tau scores 1/2: the largest wins
    q1 = _question("q1", ["a", "b", "b"], [-0.1, -0.5, -0.5])
    assert O.fit_tau([q1, q2], 3, grid) == O.Fit(100.0, 0.5, grid)


def test_fit_threshold_picks_the_best_grid_point():
    tau10 = R.RuleParams(tau=10.0)
    # q1 all right (conf -0.05): stopped 1 sample, right; on: 2 agree at 2 samples, right
    q1 = _question("q1", ["a", "a", "a"], [-0.05] * 3, [100] * 3)
    # q2 b a a (conf -0.2 -0.4 -0.4): stopped wrong at 100 tokens; on: 3 samples, a a outweighs b at tau 10, right
    q2 = _question("q2", ["b", "a", "a"], [-0.2, -0.4, -0.4], [100] * 3)
    # utility: thr -0.4 both stop: (1 + 0)/2 - 0.1 p; thr -0.1 q1 stops: 1 - 0.2 p; inf: 1 - 0.25 p
    grid = (-0.4, -0.1, math.inf)
    assert O.fit_threshold([q1, q2], at_price(0.01), tau10, grid) == O.Fit(-0.1, pytest.approx(0.998), grid)
    assert O.fit_threshold([q1, q2], at_price(0.0), tau10, grid).value == math.inf  # a tie with -0.1: the larger
    assert O.fit_threshold([q1, q2], at_price(10.0), tau10, grid).value == -0.4  # tokens dear: always stop
    # the default grid: quantiles of -0.4 -0.4 -0.2 -0.05 -0.05 -0.05, then inf; -0.05 is its largest best point
    default = O.threshold_grid([q1, q2])
    assert default[0] == -0.4 and default[-2] == -0.05 and default[-1] == math.inf
    assert list(default) == sorted(default)
    assert O.fit_threshold([q1, q2], at_price(0.01), tau10).value == -0.05


def at_price(price: float):
    """A rule outcome's objective at a token price (what eval.bank_replay and train.bank_check fit by)."""
    return lambda o: objective(o.score, o.tokens, price)
