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
