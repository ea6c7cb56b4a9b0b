"""dear.debate.mode_mixing: the schedules' patterns and the interleaved draws, checked by hand."""

from __future__ import annotations

import pytest

from dear.debate.mode_mixing import interleave, pattern
from dear.debate.sampling_rules import Samples, rule_outcome

COT = Samples(("a", "a", "a"), (True, True, True), (10, 11, 12), (-0.1, -0.2, -0.3))
POT = Samples(("b", "b", None), (False, False, False), (5, 6, 7), None)


def test_patterns():
    assert pattern("alternate", 5) == (0, 1, 0, 1, 0)
    assert pattern("alternate-second-first", 3) == (1, 0, 1)
    assert pattern("second-then-first", 4) == (1, 0, 0, 0)
    assert pattern("first-then-second", 3) == (0, 1, 1)
    assert pattern("seats-second-first-second", 7) == (1, 0, 1, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'; known: alternate"):
        pattern("zigzag", 3)


def test_interleave_draws_each_mode_in_its_own_order_and_keeps_confidences_with_samples():
    s = interleave([COT, POT], (1, 0, 1, 0))
    assert s.keys == ("b", "a", "b", "a") and s.tokens == (5, 10, 6, 11)
    assert s.confidence == (None, -0.1, None, -0.2)  # pot has none: None per pot sample
    assert interleave([POT, POT], (0, 1)).confidence is None  # no mode drawn has any


def test_interleave_stops_where_a_mode_runs_out():
    assert interleave([COT, POT], (1, 1, 1, 1, 0)).keys == ("b", "b", None)
    with pytest.raises(ValueError, match="mode position 2 for 2 modes"):
        interleave([COT, POT], (2,))


def test_a_mixing_rule_reads_the_interleaved_draws():
    # pot first, cot beside it: b vs a disagree; the next pot sample says b again, so 2 agree on b (wrong) after 3
    out = rule_outcome(interleave([COT, POT], pattern("alternate-second-first", 6)), "adaptive-sc-2-from-2")
    assert (out.score, out.used, out.tokens) == (0.0, 3, 5 + 10 + 6)
    # cot first then pot: a, b disagree, then pot's b makes 2 agree on b
    out = rule_outcome(interleave([COT, POT], pattern("first-then-second", 6)), "adaptive-sc-2-from-2")
    assert (out.score, out.used) == (0.0, 3)
    # alternate from cot: a, b, a -> a (right) after 3
    out = rule_outcome(interleave([COT, POT], pattern("alternate", 6)), "adaptive-sc-2-from-2")
    assert (out.score, out.used, out.tokens) == (1.0, 3, 10 + 5 + 11)


def test_drawn_orders_each_mode_then_interleaves_or_reads_one_mode_alone():
    from dear.debate.mode_mixing import drawn

    cot = Samples(("a", "b", "c"), (True, False, False), (1, 2, 3), None)
    pot = Samples(("x", "y", "z"), (False, True, False), (4, 5, 6), None)
    assert drawn([cot, pot], [(2, 0, 1), (1, 2, 0)], "alternate").keys == ("c", "y", "a", "z", "b", "x")
    assert drawn([cot, pot], [(2, 0, 1), (1, 2, 0)], None, mode=1).keys == ("y", "z", "x")
