"""eval.stop_bound: a stop rule's stopping point by hand, and the family's baseline equals the replayed rule."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from eval import bank_replay as B
from eval import stop_bound as S
from tests.eval.test_bank_replay import _tiny_bank


def _paths(leader, first, share=None):
    leader = np.array(leader, dtype=float)
    z = np.zeros_like(leader)
    share = z if share is None else np.array(share, dtype=float)
    return S.Paths(leader, share, z, z, z, np.array(first, dtype=float), np.zeros(len(leader), dtype=int))


def test_where_a_rule_stops():
    p = _paths([[1, 1, 2, 3], [1, 2, 2, 2], [1, 1, 1, 1]], [-0.1, -0.5, -math.inf])
    assert list(S.stop_index(p, S.StopRule(math.inf, (2, 2), False))) == [2, 1, 3]  # until 2 agree, else the end
    assert list(S.stop_index(p, S.StopRule(-0.2, (2, 2), False))) == [0, 1, 3]  # the confident first sample stops
    assert list(S.stop_index(p, S.StopRule(-math.inf, (2, 2), False))) == [0, 0, 0]  # always at the first
    assert list(S.stop_index(p, S.StopRule(math.inf, (S.NEVER, 1), False))) == [2, 2, 2]  # any leader at n = 3
    p = _paths([[1] * 4] * 2, [-0.1, -0.5], share=[[1.0, 0.7, 0.5, 0.4], [1.0, 0.5, 0.8, 0.6]])
    assert list(S.stop_index(p, S.ShareRule(math.inf, 0.6, 2))) == [1, 2]
    assert list(S.stop_index(p, S.ShareRule(-0.2, 0.6, 3))) == [0, 2]  # from n = 3 on; the first stops by confidence


def test_the_leader_share_counts_unanswered_weight():
    assert S.leader_share(["7", None, "7", "3"], [0.4, 0.2, 0.1, 0.3]) == pytest.approx(0.5)
    assert S.leader_share([None, None], [0.5, 0.5]) == 0.0


def test_the_familys_adaptive_sc_is_the_replayed_rule(tmp_path):
    _tiny_bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert S.main(["--bank", str(tmp_path / "bank"), "--width", "5", "--orders", "3", "--n-boot", "50",
                   "--out", str(out)]) == 0
    assert B.main(["--bank", str(tmp_path / "bank"), "--width", "5", "--orders", "3", "--n-boot", "50",
                   "--out", str(tmp_path / "replay")]) == 0
    replay = {r["rule"]: r for r in csv.DictReader((tmp_path / "replay" / "summary.csv").open(encoding="utf-8"))}
    base = replay[B.BASELINE]
    md = (out / "bound.md").read_text(encoding="utf-8")
    assert f"{100 * float(base['accuracy']):.1f} % at {float(base['tokens_per_question']):.0f} tokens/question" in md
    assert "not a method" in md and "nothing synthetic" in md and "| count rules |" in md and "| share rules |" in md
    rows = list(csv.DictReader((out / "bound.csv").open(encoding="utf-8")))
    tokens = [float(r["tokens_per_question"]) for r in rows]
    accuracy = [float(r["accuracy"]) for r in rows]
    assert tokens == sorted(tokens) and accuracy == sorted(accuracy)  # a frontier: each step buys accuracy
    with pytest.raises(ValueError, match="at most 9"):
        S.main(["--bank", str(tmp_path / "bank"), "--width", "10", "--out", str(out)])
