"""dear.metrics against hand-computed small debates (V agents x rounds), incl. all-agree, ties and no answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dear.metrics import (
    ScoredDebate,
    Ratio,
    agreeing_peers,
    bootstrap_ci,
    conformity,
    drift,
    flips_by_agreement,
    paired_bootstrap_diff,
    round_scores,
    round_vote,
    summarize,
    transitions,
)

T, F = True, False

# gold is "4" throughout
ALL_AGREE = (
    [["4", "4", "4"]] * 3,
    [[T, T, T]] * 3,
)
# agent 0 alone is right, then conforms to the wrong majority (blind conformity)
CONFORM = (
    [["4", "5", "5"], ["5", "5", "5"], ["5", "5", "5"]],
    [[T, F, F], [F, F, F], [F, F, F]],
)
# the group is right, drifts to a wrong majority in round 1 (agent 2 holds out), recovers in round 2
DRIFT_RECOVER = (
    [["4", "4", "5"], ["5", "5", "4"], ["4", "4", "4"]],
    [[T, T, F], [F, F, T], [T, T, T]],
)
# round 0: a 1-1 tie plus an agent without an answer
TIE_NONE = (
    [["4", "5", None], ["4", "4", "4"]],
    [[T, F, F], [T, T, T]],
)


def test_round_vote_plurality_tie_and_no_answer():
    v = round_vote(["4", "5", "5"], [T, F, F])
    assert v.leaders == ("5",) and v.top == 2 and not v.tie and v.score == 0.0
    v = round_vote(["4", "5", None], [T, F, F])
    assert v.leaders == ("4", "5") and v.tie and v.score == 0.5  # expected value of a random tie-break
    v = round_vote([None, None, None], [F, F, F])
    assert v.leaders == () and v.score == 0.0 and not v.tie
    # None never counts as the plurality even when it is the most frequent "answer"
    v = round_vote([None, None, "4"], [F, F, T])
    assert v.leaders == ("4",) and v.score == 1.0


def test_agreeing_peers():
    assert agreeing_peers(["4", "4", "5"]).tolist() == [1, 1, 0]
    assert agreeing_peers(["4", "4", "4"]).tolist() == [2, 2, 2]
    assert agreeing_peers([None, None, "4"]).tolist() == [0, 0, 0]  # two non-answers do not agree


def test_transitions_hand_computed():
    assert transitions(ALL_AGREE[1]).tolist() == [[3, 0, 0, 0], [3, 0, 0, 0]]
    assert transitions(CONFORM[1]).tolist() == [[0, 1, 0, 2], [0, 0, 0, 3]]
    assert transitions(DRIFT_RECOVER[1]).tolist() == [[0, 2, 1, 0], [1, 0, 2, 0]]
    assert transitions(TIE_NONE[1]).tolist() == [[1, 0, 2, 0]]
    assert transitions([[T, F]]).shape == (0, 4)  # one round: no transitions


def test_flips_by_agreement():
    assert flips_by_agreement(*ALL_AGREE) == {2: Ratio(0, 6)}
    assert flips_by_agreement(*CONFORM) == {0: Ratio(1, 1)}
    # round 0: agents 0,1 correct with 1 agreeing peer, both flip; round 1: agent 2 correct alone, stays
    assert flips_by_agreement(*DRIFT_RECOVER) == {1: Ratio(2, 2), 0: Ratio(0, 1)}


def test_hcr_bcr_hand_computed():
    c = conformity(*ALL_AGREE)
    assert (c.hcr, c.bcr) == (Ratio(0, 0), Ratio(0, 0))
    assert math.isnan(c.hcr.rate)
    c = conformity(*CONFORM)
    assert c.hcr == Ratio(1, 1) and c.bcr == Ratio(0, 0)
    # round 0: agent 2 wrong in the minority vs a correct plurality, correct next -> BCR 1/1;
    # round 1: agent 2 right in the minority vs a wrong plurality, still right next -> HCR 0/1
    c = conformity(*DRIFT_RECOVER)
    assert c.hcr == Ratio(0, 1) and c.bcr == Ratio(1, 1)
    # a 1-1 tie: nobody is in the minority; the no-answer agent is excluded
    c = conformity(*TIE_NONE)
    assert (c.hcr, c.bcr) == (Ratio(0, 0), Ratio(0, 0))


def test_hcr_with_tied_wrong_leaders_and_mixed_ties():
    # V=5: leaders "1" and "2" tie with 2 votes each, agent 4 alone holds the correct "3" and conforms
    answers = [["1", "1", "2", "2", "3"], ["1", "1", "2", "2", "1"]]
    correct = [[F, F, F, F, T], [F, F, F, F, F]]
    assert conformity(answers, correct).hcr == Ratio(1, 1)
    # mixed tie (leader "1" right, "2" wrong): agent 4 is wrong in the minority but enters neither rate
    correct = [[T, T, F, F, F], [T, T, F, F, T]]
    c = conformity(answers, correct)
    assert (c.hcr, c.bcr) == (Ratio(0, 0), Ratio(0, 0))


def test_drift_focus_recovery():
    d = drift(round_scores(*DRIFT_RECOVER))
    assert d.scores.tolist() == [1.0, 0.0, 1.0]
    assert d.focus.tolist() == [-1.0, 1.0]
    assert d.drifted and d.first_drift_round == 1 and d.recovered and d.rounds_drifted == 1
    d = drift([1.0, 0.0, 0.0])  # never recovers, two rounds below the best
    assert d.drifted and not d.recovered and d.rounds_drifted == 2
    d = drift([0.0, 1.0, 1.0])  # improvement is not drift
    assert not d.drifted and not d.recovered and d.rounds_drifted == 0 and d.focus.tolist() == [1.0, 0.0]
    d = drift([0.5, 1.0, 0.5, 0.5])  # drift is measured against the best earlier round, not round 0
    assert d.first_drift_round == 2 and d.rounds_drifted == 2 and not d.recovered
    d = drift([1.0, 0.5, 0.75, 1.0])  # partial recovery (0.75) does not count, reaching 1.0 does
    assert d.recovered and d.rounds_drifted == 2
    assert not drift([1.0]).drifted and drift([1.0]).focus.size == 0
    assert round_scores(*TIE_NONE).tolist() == [0.5, 1.0]


def test_bootstrap_ci_seeded_and_sane():
    x = [0.0, 1.0] * 50
    a, b = bootstrap_ci(x, seed=3), bootstrap_ci(x, seed=3)
    assert a == b
    assert a.mean == 0.5 and 0.38 < a.low < 0.42 and 0.58 < a.high < 0.62  # ~ 0.5 +- 1.96 * 0.05
    assert bootstrap_ci([1.0] * 10).low == 1.0
    assert math.isnan(bootstrap_ci([]).mean)
    d = paired_bootstrap_diff([1, 1, 1, 0], [0, 1, 1, 0])
    assert d.mean == 0.25 and d.low >= 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        paired_bootstrap_diff([1, 0], [1])


def _rec(debate, final_correct, qid, p=100, c=50, tie=False, grader="numeric"):
    return ScoredDebate(
        answers=debate[0], correct=debate[1], final_correct=final_correct, prompt_tokens=p,
        completion_tokens=c, tie=tie, final_grader=grader, question_id=qid,
    )


def test_summarize_aggregates_hand_computed():
    recs = [
        _rec(ALL_AGREE, True, "a"),
        _rec(CONFORM, False, "b", p=200, c=100),
        _rec(DRIFT_RECOVER, True, "c"),
        _rec(TIE_NONE, True, "d", tie=False, grader="none"),
    ]
    s = summarize(recs, seed=0, n_boot=500)
    assert s.n == 4 and s.accuracy.mean == 0.75
    assert s.prompt_tokens == 125.0 and s.completion_tokens == 62.5 and s.total_tokens.mean == 187.5
    assert s.n_rounds == 3 and s.round_n == [4, 4, 3]
    assert s.round_accuracy == pytest.approx([(1 + 0 + 1 + 0.5) / 4, (1 + 0 + 0 + 1) / 4, (1 + 0 + 1) / 3])
    assert s.transitions.tolist() == [[3 + 0 + 0 + 1, 1 + 2, 1 + 2, 2], [3 + 1, 0, 2, 3]]
    assert s.hcr == Ratio(1, 2) and s.bcr == Ratio(1, 1)
    assert s.flips_by_agreement == {0: Ratio(1, 3), 1: Ratio(2, 2), 2: Ratio(0, 6)}
    # focus r1: (0 + 0 - 1 + 0.5) / 4; r2: (0 + 0 + 1) / 3
    assert s.focus == pytest.approx([-0.125, 1 / 3])
    assert s.drifted == Ratio(1, 4) and s.recovered == Ratio(1, 1) and s.mean_rounds_drifted == 0.25
    assert (s.improved, s.degraded) == (1, 0)
    assert s.round_ties == 1 and s.final_ties == 0 and s.no_answer == Ratio(1, 33)
    assert s.graders == {"numeric": 3, "none": 1}
    row = s.to_row()
    assert row["hcr_num"] == 1 and row["hcr_den"] == 2 and row["r0->1 C->I"] == 3
    assert row["drifted_pct"] == 25.0 and row["grader none"] == 1


def test_single_round_methods_have_nan_rates():
    recs = [_rec(([["4"]], [[T]]), True, "a"), _rec(([["5"]], [[F]]), False, "b")]
    s = summarize(recs)
    assert s.accuracy.mean == 0.5 and s.transitions.shape == (0, 4)
    assert math.isnan(s.hcr.rate) and math.isnan(s.drifted.rate) and s.round_accuracy == [1.0 / 2]


def test_bad_records():
    with pytest.raises(ValueError, match="round 0 has 2 answers but 3 grades"):
        ScoredDebate(answers=[["4", "4"]], correct=[[T, T, T]], final_correct=True, question_id="q")
    with pytest.raises(ValueError, match="answers has 2 rounds"):
        ScoredDebate(answers=[["4"], ["4"]], correct=[[T]], final_correct=True)
    with pytest.raises(ValueError, match="no debate records"):
        summarize([])
    assert np.isnan(Ratio(0, 0).rate)


def test_wilson_ci():
    from dear.metrics import wilson_ci

    ci = wilson_ci(Ratio(5, 10))
    assert ci.mean == 0.5 and ci.low == pytest.approx(0.2366, abs=1e-3) and ci.high == pytest.approx(0.7634, abs=1e-3)
    ci = wilson_ci(Ratio(0, 4))
    assert ci.low == 0.0 and 0.4 < ci.high < 0.5  # 0/4 is not "certainly 0"
    assert math.isnan(wilson_ci(Ratio(0, 0)).mean)
