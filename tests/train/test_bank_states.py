"""train.bank_states: the committed bank-world policy's decisions per state, on a tiny bank of real-format samples."""

from __future__ import annotations

import csv

from tests.envs.test_bank_world import bank
from train import bank_states


def test_every_decision_is_counted_in_its_state(tmp_path):
    bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert bank_states.main(["--policy", "results/policy-bank-gsm8k-p0.05", "--bank", str(tmp_path / "bank"),
                             "--orders", "3", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "states.csv").open(encoding="utf-8")))
    first = next(r for r in rows if (r["samples"], r["leader_holds"]) == ("1", "1"))
    assert first["debates"] == "6"  # 2 banked questions x 3 orders, each starting from one sample
    assert all(r["adaptive_sc"] == ("stop" if int(r["leader_holds"]) >= 2 else "draw 1") for r in rows)
    assert all(0 <= float(r["policy_stops"]) <= 1 for r in rows)
    md = (out / "states.md").read_text(encoding="utf-8")
    assert "2 questions × 3 seeded orders = 6 debates" in md and "Overall: accuracy" in md and "synthetic" not in md.replace("nothing synthetic", "")


def test_a_confidence_weighted_policys_stop_is_scored_by_its_weighted_vote():
    """Two samples disagree: the plain vote ties (1/2), the weighted vote follows the more confident sample."""
    from types import SimpleNamespace

    def turn(key, correct, logprob):
        return SimpleNamespace(answer_key=key, correct=correct, confidence={
            "mean_logprob": logprob, "lowest_group": None, "tail_mean": None, "answer_mean": None, "margin": None,
            "n_tokens": 10, "k": 5})

    voters = [turn("12", True, -0.1), turn("7", False, -0.5)]
    weighted = SimpleNamespace(decision="confidence-weighted", vote_tau=0.1, debate_id="d")
    assert bank_states.stop_score(weighted, voters) == 1.0
    assert bank_states.stop_score(SimpleNamespace(decision="all-answers"), voters) == 0.5
    voters[0].confidence["mean_logprob"] = -0.9  # now the wrong sample is the confident one
    assert bank_states.stop_score(weighted, voters) == 0.0


def test_in_a_pool_of_modes_each_state_says_which_modes_its_fresh_samples_came_from(tmp_path):
    """The committed mixed-mode policy (one new sample a round) on a tiny bank of both modes."""
    from tests.envs.test_bank_world import two_mode_bank

    two_mode_bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert bank_states.main(["--policy", "results/policy-bank-gsm8k-modes-long-p0.05", "--bank", str(tmp_path / "bank"),
                             "--orders", "3", "--pool", "pot,cot,pot", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "states.csv").open(encoding="utf-8")))
    going_on = [r for r in rows if r["fresh_when_going_on"]]
    assert going_on and all(float(r["fresh_when_going_on"]) <= 1 for r in going_on)  # one new sample a round
    assert all(set(part.split()[0] for part in r["fresh_modes"].split(" / ")) <= {"cot", "pot"} for r in going_on)
    assert "agents pot, cot, pot" in (out / "states.md").read_text(encoding="utf-8")
