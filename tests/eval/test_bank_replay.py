"""eval.bank_replay: the frontier and paired-difference helpers, and the report end to end on a tiny sample bank."""

from __future__ import annotations

import csv
import re

import pytest

from dear.bank.store import Bank, BankSample, ShelfKey
from dear.debate.sampling_rules import FittedParams, RuleParams
from eval import bank_replay as B


def test_on_frontier():
    # (accuracy, tokens): the second is dominated by the first (same accuracy, more tokens), the fourth by the third
    points = [(0.8, 100), (0.8, 150), (0.9, 300), (0.85, 300), (0.9, 300)]
    assert B.on_frontier(points) == [True, False, True, False, True]


def _row(rule, scores):
    return B.RowResult(B.RowSpec(rule, rule), tuple(scores), tuple(scores), tuple(1.0 for _ in scores), 1.0)


def test_paired_to_the_baseline():
    rows = [_row("cot", [1, 0, 1, 0]), _row(B.BASELINE, [1, 1, 0, 0])]
    diffs = B.paired_to(rows, B.BASELINE, n_boot=200, seed=0)
    assert diffs[0].mean == 0.0 and diffs[1] == B.metrics.CI(0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="baseline"):
        B.paired_to(rows[:1], B.BASELINE, 10, 0)


def _confidence(value):
    return {"mean_logprob": value, "lowest_group": value, "tail_mean": value, "answer_mean": None, "margin": None,
            "n_tokens": 10, "k": 5}


def _question(qid, answers, right="12", confidence=None):
    """One question's samples: answers in index order; sample 1 has no confidence record, sample 2 a missing one."""
    out = []
    for i, a in enumerate(answers):
        conf = None if i == 1 else {"missing": "no logprobs"} if i == 2 else _confidence(-0.1 - 0.05 * (a != right))
        out.append(BankSample(question_id=qid, sample=i, seed=i, text=f"... {a}", answer=a, answer_key=a,
                              correct=a == right, grader="numeric", prompt_tokens=50, completion_tokens=100 + i,
                              finish_reason="stop", confidence=conf))
    return out


def _tiny_bank(root):
    bank = Bank.open(root, "m.gguf", "0" * 64)
    shapes = [["12"] * 9, ["12", "7", "12", "7", "7", "12", "12", "3", "12"], ["7", "3", "12", "7", "7", "3", "12", "3", "7"],
              [None, "12", "12", "5", "12", "12", "5", "12", "12"]]
    for split in ("test", "train"):
        shelf = bank.shelf(ShelfKey("gsm8k", split, "cot", 0.7, 0.9, 384))
        for n, answers in enumerate(shapes):
            shelf.append(_question(f"gsm8k-{split}-{n}", answers))
        shelf.append(_question(f"gsm8k-{split}-short", ["12"] * 5))  # fewer than 9 samples: left out
        bank.record(shelf, {})
    return bank


def test_the_report_end_to_end(tmp_path):
    _tiny_bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert B.main(["--bank", str(tmp_path / "bank"), "--out", str(out), "--orders", "3", "--n-boot", "50",
                   "--prices", "0.01,0.002"]) == 0
    assert {p.name for p in out.iterdir()} == {"summary.md", "summary.csv", "accuracy_vs_tokens.png",
                                               "rule_params.json", "per_question.csv"}
    per_q = list(csv.DictReader((out / "per_question.csv").open(encoding="utf-8")))
    assert len(per_q) == 4 * 16 and {r["question_id"] for r in per_q} == {f"gsm8k-test-{n}" for n in range(4)}
    assert {r["score"] for r in per_q if r["label"] == "SC-9" and r["question_id"] == "gsm8k-test-0"} == {"1.0"}
    # the fit as eval.run and dear.serve read it: tau per CISC K, confident stop at the first price
    fitted = FittedParams.load(out / "rule_params.json")
    assert set(fitted.rules) == {"cisc-3", "cisc-5", "cisc-9", "confident-stop"}
    assert fitted.provenance["confident_stop_price"] == 0.01 and fitted.provenance["fit_questions"] > 0
    assert fitted.provenance["fit_shelf"] == "gsm8k-train-cot-t0.7-p0.9-m384"
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    rules = [r["rule"] for r in rows]
    assert rules == ["cot", "sc-3", "sc-9", *(f"adaptive-sc-{a}-from-{s}" for a in (2, 3) for s in (1, 2, 3)),
                     "esc-2", "esc-3", "cisc-3", "cisc-5", "cisc-9", "confident-stop", "confident-stop"]
    assert {r["n_questions"] for r in rows} == {"4"}
    base = rows[rules.index(B.BASELINE)]
    assert float(base["minus_baseline"]) == 0.0
    sc9 = rows[rules.index("sc-9")]
    assert float(sc9["samples_per_question"]) == 9.0 and float(sc9["accuracy"]) == 0.75  # 12 leads in q0, q1, q3; 7 in q2
    assert any(r["on_frontier"] == "True" for r in rows)
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "not synthetic" in md and "4 questions with at least 9 samples (1 with fewer left out)" in md
    assert "fitted on `gsm8k-train-cot-t0.7-p0.9-m384`" in md and "seed 0" in md and "3 seeded permutations" in md


def test_a_policy_debates_beside_the_rules_on_the_same_samples(tmp_path):
    """The committed bank-world policy on a bank of two real questions (8 samples each): its row pairs with the
    rules' by question, counts the samples it drew from the bank, and the report says where it stands."""
    from tests.envs.test_bank_world import bank

    bank(tmp_path / "bank")
    out = tmp_path / "out"
    assert B.main(["--bank", str(tmp_path / "bank"), "--out", str(out), "--orders", "4", "--n-boot", "50",
                   "--width", "8", "--fit-split", "none", "--policy", "results/policy-bank-gsm8k-p0.05",
                   "--random-control"]) == 0
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    dear, control = rows[-2:]
    assert (control["rule"], control["policy"]) == ("dear-random", "results/policy-bank-gsm8k-p0.05")
    assert 1 <= float(control["samples_per_question"]) <= 8 and control["label"].startswith("random control")
    assert (dear["rule"], dear["policy"], dear["stored_accuracy"]) == ("dear", "results/policy-bank-gsm8k-p0.05", "")
    assert {r["shelf"] for r in rows} == {"gsm8k-test-cot-t0.7-p0.9-m384"}
    assert dear["n_questions"] == "2" and 1 <= float(dear["samples_per_question"]) <= 8
    assert 0 <= float(dear["accuracy"]) <= 1 and float(dear["tokens_per_question"]) >= 70  # 50 + 20 a sample
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "DEAR in the bank world, against the rules:" in md and "4 bank-world debates a question" in md
    assert re.search(r"against `adaptive-sc-2-from-2` at \d\.\d\d × its tokens; (on the frontier|dominated by)", md)


def test_the_report_refuses_to_fit_on_the_reported_shelf(tmp_path):
    _tiny_bank(tmp_path / "bank")
    with pytest.raises(ValueError, match="fit on training questions"):
        B.main(["--bank", str(tmp_path / "bank"), "--out", str(tmp_path / "o"), "--fit-split", "test"])
    with pytest.raises(ValueError, match="no shelf math test"):
        B.main(["--bank", str(tmp_path / "bank"), "--out", str(tmp_path / "o"), "--benchmark", "math"])


def test_rows_carry_the_fitted_parameters():
    fits = B.Fits({3: B.Fit(0.2, 0.9, (0.2,)), 5: B.Fit(0.5, 0.9, (0.5,)), 9: B.Fit(1.0, 0.9, (1.0,))},
                  {0.01: B.Fit(-0.3, 0.8, (-0.3,))})
    specs = {s.label: s for s in B.row_specs(9, fits)}
    assert specs["CISC-5"].params.tau == 0.5
    assert specs["confident stop (price 0.01/1k tokens)"].params == RuleParams(tau=0.2, threshold=-0.3)


def test_the_threshold_curve_runs_from_always_stopping_to_adaptive_sc(tmp_path):
    """eval.threshold_curve on the tiny bank: the grid's lowest threshold stops at every first sample that has a
    confidence, the never-stop row is adaptive SC's draws (its tokens), and the goal-shape column is filled."""
    from eval import threshold_curve as T

    _tiny_bank(tmp_path / "bank")
    assert T.main(["--bank", str(tmp_path / "bank"), "--width", "9", "--orders", "4", "--n-boot", "50",
                   "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "curve.csv").open()))
    never = rows[-1]
    assert never["threshold"] == "inf" and float(never["tokens_over_baseline"]) == pytest.approx(1.0)
    assert float(rows[0]["test_tokens"]) < float(never["test_tokens"])
    assert all(r["goal_shape"] in ("True", "False") and r["synthetic"] == "False" for r in rows)
    assert "Nothing is chosen on the reported questions" in (tmp_path / "out" / "curve.md").read_text()
