"""eval.mode_replay end to end on a tiny two-mode bank: each mode's table, how their errors differ, the rules."""

from __future__ import annotations

import csv

import pytest

from dear.bank.store import Bank, BankSample, ShelfKey
from eval import mode_replay as M


def _samples(qid, answers, right="12", run=False):
    program = {"code": "print(1)", "answer_text": "1", "verdict": "ok", "stdout": "1\n"} if run else None
    return [BankSample(qid, i, i, f"... {a}", a, a, a == right, "numeric", 50, 100 if not run else 30, "stop",
                       {"mean_logprob": -0.1, "lowest_group": -0.1, "tail_mean": -0.1, "answer_mean": None,
                        "margin": None, "n_tokens": 10, "k": 5},
                       program={**program, "verdict": "timeout"} if run and a is None else program)
            for i, a in enumerate(answers)]


def _bank(root):
    bank = Bank.open(root, "m.gguf", "0" * 64)
    cot = {"q0": ["12", "12", "12"], "q1": ["7", "7", "12"], "q2": ["12", "3", "3"]}
    pot = {"q0": ["12", "12", None], "q1": ["12", "12", "12"], "q2": ["4", "3", "4"], "q3": ["12"] * 3}
    for mode, table in (("cot", cot), ("pot", pot)):
        shelf = bank.shelf(ShelfKey("gsm8k", "test", mode, 0.7, 0.9, 384))
        for qid, answers in table.items():
            shelf.append(_samples(qid, answers, run=mode == "pot"))
        bank.record(shelf, {})
    return bank


def test_the_report_end_to_end(tmp_path):
    _bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert M.main(["--bank", str(tmp_path / "bank"), "--width", "3", "--orders", "4", "--n-boot", "50",
                   "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    assert "the 3 questions both hold" in text  # q3 has no cot samples
    # cot accuracy over positions: q0 1, q1 1/3, q2 1/3 -> 55.6 %; pot: q0 2/3, q1 1, q2 0 -> 55.6 %; no answer 1/9
    assert "| cot | 55.6 [" in text and "| pot | 55.6 [" in text and "| 11.1 | ok 88.9 %, timeout 11.1 % |" in text
    # majorities: cot right on q0, pot right on q0 and q1 -> both 1, only cot 0, only pot 1, neither 1 (q2)
    assert "right in both modes on 1, only with cot on 0, only with pot on 1, in neither on 1" in text
    # wrong pairs within a mode: cot (7, 7) on q1 and (3, 3) on q2 -> 100 %; pot q2 (4, 3, 4) -> 1 of 3 pairs
    assert "are equal 100.0 % (cot) and 33.3 % (pot) of the time" in text
    rows = list(csv.DictReader((out / "summary.csv").open()))
    by = {r["label"]: r for r in rows}
    assert float(by["cot: single sample (mean over positions)"]["accuracy"]) == pytest.approx(5 / 9)
    assert float(by["both modes: SC-6"]["samples_per_question"]) == 6
    assert all(r["synthetic"] == "False" for r in rows)
    assert (out / "accuracy_vs_tokens.png").stat().st_size > 0


def test_the_modes_must_be_two_and_banked(tmp_path):
    _bank(tmp_path / "bank")
    with pytest.raises(ValueError, match="--modes: name two different reply modes"):
        M.main(["--bank", str(tmp_path / "bank"), "--modes", "cot", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="no shelf gsm8k test direct"):
        M.main(["--bank", str(tmp_path / "bank"), "--modes", "cot,direct", "--width", "3", "--out", str(tmp_path / "o")])


def _mixed_policy(out, profiles=("cot", "pot")):
    """An untrained extended-action policy that sees each agent's mode (the bank world's action set)."""
    import torch

    from dear.export import export_policy
    from dear.policy import JointPolicy, PolicyConfig

    torch.manual_seed(0)
    cfg = PolicyConfig(n_agents=3, actions="extended", kinds_mode="fresh-one", behavior_mode="fixed",
                       turn_kinds=("keep", "fresh"), profiles=profiles)
    return export_policy(JointPolicy(cfg), out, encoder="minilm",
                         training={"llm": "bank", "task": "gsm8k", "synthetic": False, "n_rounds": 4,
                                   "start_width": 1})


def test_a_policy_chooses_which_mode_samples_next_on_the_committed_shelves(tmp_path):
    """On the committed cot and pot test shelves (real samples): the policy's row pairs with the rules' by question."""
    policy = _mixed_policy(tmp_path / "policy")
    out = tmp_path / "out"
    assert M.main(["--width", "9", "--orders", "1", "--n-boot", "50", "--policy", str(policy), "--pool", "cot,pot,cot",
                   "--pool", "pot,cot,pot", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    dear, pot_first = rows[-2:]
    assert pot_first["label"] == "DEAR `policy` (pot, cot, pot)"
    assert dear["rule"] == "dear" and dear["label"] == "DEAR `policy` (cot, pot, cot)" and dear["modes"] == "cot+pot"
    assert dear["n_questions"] == rows[0]["n_questions"] and 1 <= float(dear["samples_per_question"]) <= 18
    assert 0 <= float(dear["accuracy"]) <= 1
    # agent 0 draws every sample (fresh-one): its mode's only; the mix adds up to the samples drawn
    for row, only in ((dear, "cot"), (pot_first, "pot")):
        mix = dict(part.split() for part in row["policy_samples_by_mode"].split(" / "))
        assert float(mix[only]) == pytest.approx(float(row["samples_per_question"]), abs=0.01)
        assert float(mix["pot" if only == "cot" else "cot"]) == 0
    assert rows[0]["policy_samples_by_mode"] == ""
    with pytest.raises(ValueError, match="--pool: 3 agents' modes"):
        M.main(["--width", "9", "--orders", "1", "--policy", str(policy), "--pool", "cot,pot", "--out", str(out)])
