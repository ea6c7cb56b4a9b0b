"""The one plurality vote (dear/vote.py) and the one seed rule (dear/seeds.py), and that every user agrees."""

import numpy as np
import pytest

from dear import metrics, regulator
from dear.seeds import derive_seed
from dear.vote import Tally, key_correct, tally, vote


def test_tally_counts_leaders_and_ignores_none():
    t = tally(["b", None, "a", "b", "a", "c"])
    assert t == Tally(counts={"b": 2, "a": 2, "c": 1}, leaders=("a", "b"), top=2) and t.tie
    assert tally([None, None]) == Tally(counts={}, leaders=(), top=0)
    assert tally([None, None]).pick(np.random.default_rng(0)) is None


def test_pick_draws_only_on_a_tie_and_ignores_agent_order():
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    assert tally(["x", "x", "y"]).pick(rng) == "x" and rng.bit_generator.state == state
    picks = {tally(keys).pick(np.random.default_rng(s)) for s in range(30) for keys in (["p", "q"], ["q", "p"])}
    assert picks == {"p", "q"}
    for s in range(10):  # same seed, permuted agents: same winner
        assert tally(["p", "q", "r"]).pick(np.random.default_rng(s)) == tally(["r", "p", "q"]).pick(
            np.random.default_rng(s))


def test_vote_winner_correct_if_any_agent_with_it_is_graded_correct():
    v = vote(["5", "5", "7"], [True, False, False], np.random.default_rng(0))
    assert v.answer == "5" and v.correct and not v.tie and v.counts == {"5": 2, "7": 1}
    assert key_correct(["5", None, "7"], [False, True, True]) == {"5": False, "7": True}


def test_metrics_and_regulator_use_the_same_leaders():
    keys, ok = ["a", "b", None, "b", "a"], [True, False, False, False, True]
    rv = metrics.round_vote(keys, ok)
    assert rv.leaders == tally(keys).leaders == ("a", "b") and rv.score == 0.5 and rv.tie
    share, distinct, none, agrees = regulator._answer_features(keys)
    assert (share, distinct, none) == (2 / 5, 2 / 5, 1 / 5) and agrees == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert metrics.agreeing_peers(keys).tolist() == [1, 1, 0, 1, 1]


@pytest.mark.parametrize("parts", [(0,), (7, 3), (123456, 0x5EED, 2), (2**32 - 1, 5)])
def test_derive_seed_reproduces_both_former_helpers(parts):
    # The two rules this replaced (engine.derive_seed, 31 bits; train.algorithm.seed_for, 62 bits), written out
    # so the seeds of existing runs and caches stay the same.
    ss = np.random.SeedSequence(list(parts))
    assert derive_seed(*parts) == int(ss.generate_state(1)[0] & 0x7FFFFFFF)
    assert derive_seed(*parts, bits=62) == int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))
    assert 0 <= derive_seed(*parts) < 2**31 and 0 <= derive_seed(*parts, bits=62) < 2**62


def test_derive_seed_rejects_other_widths_and_maps_negatives():
    with pytest.raises(ValueError, match="bits must be 31 or 62"):
        derive_seed(1, bits=32)
    assert derive_seed(-1) == derive_seed(2**32 - 1)
