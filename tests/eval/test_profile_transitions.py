"""eval.profile_transitions: who moved to whose answer, by profile and the profiles read (hand-built traces)."""

from __future__ import annotations

from dataclasses import replace

from dear.debate.trace import DebateTrace
from eval.profile_transitions import profile_steps
from tests.eval.test_eval_report import _turn

PROFILES = ["cot", "cot", "direct"]


def _trace(rounds: list[list[str | None]], peers: list[list[int]], failed: bool = False) -> DebateTrace:
    t = DebateTrace(debate_id="d", question_id="q", task="b", question="?", gold="4", kind="numeric",
                    model_ids=["m"] * 3, failed=failed)
    for r, keys in enumerate(rounds):
        t.add_round([replace(_turn(i, r, k, k == "4"), profile=PROFILES[i], peers=peers[i] if r else [])
                     for i, k in enumerate(keys)])
    return t


def test_steps_are_grouped_by_profile_and_profiles_read_with_adoptions_by_source():
    # round 1: cot 0 reads nobody and keeps 4; cot 1 reads cot 0 and direct 2, moves to 4 (I→C, from cot);
    # direct 2 reads cot 0 and cot 1, moves to cot 1's wrong 7 (kept wrong)
    t = _trace([["4", "7", "9"], ["4", "4", "7"]], peers=[[], [0, 2], [0, 1]])
    rows = {(s.profile, s.read): s for s in profile_steps([t, _trace([["4"] * 3, ["5"] * 3], [[1]] * 3, True)])}
    assert set(rows) == {("cot", "nobody"), ("cot", "cot+direct"), ("direct", "cot")}
    alone, mixed, direct = rows["cot", "nobody"], rows["cot", "cot+direct"], rows["direct", "cot"]
    assert (alone.n, alone.was_correct, alone.correct_to_incorrect, alone.moved, alone.adopted) == (1, 1, 0, 0, {})
    assert (mixed.was_incorrect, mixed.incorrect_to_correct, mixed.moved, mixed.adopted) == (1, 1, 1, {"cot": [1, 1]})
    assert (direct.was_incorrect, direct.incorrect_to_correct, direct.moved, direct.adopted) == (1, 0, 1, {"cot": [1, 0]})


def test_a_move_to_an_answer_nobody_read_is_not_an_adoption_and_no_answer_is_wrong():
    t = _trace([["4", "7", "9"], ["8", None, "9"]], peers=[[1], [0], [0, 1]])
    rows = {(s.profile, s.read): s for s in profile_steps([t])}
    cot = rows["cot", "cot"]
    assert (cot.n, cot.was_correct, cot.correct_to_incorrect, cot.moved, cot.adopted) == (2, 1, 1, 2, {})
    assert rows["direct", "cot"].moved == 0
