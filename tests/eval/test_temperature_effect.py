"""eval.temperature_effect on a constructed bank: shared questions, numbers worked out by hand, refusals."""

from __future__ import annotations

import csv
import math

import pytest

from dear.bank.store import Bank, BankSample, ShelfKey
from eval import temperature_effect as M


def _samples(qid, answers, logprobs, right="12", completion=100):
    return [BankSample(qid, i, i, f"... {a}", a, a, a == right, "numeric", 50, completion, "stop",
                       {"mean_logprob": lp, "lowest_group": lp, "tail_mean": lp, "answer_mean": None, "margin": None,
                        "n_tokens": 10, "k": 5})
            for i, (a, lp) in enumerate(zip(answers, logprobs))]


def _bank(root, shelves):
    """shelves: {temperature: ({question: answers}, completion tokens)}; each sample's log-prob is -0.1 when right
    and -1.0 when wrong, so confidence separates right from wrong perfectly (AUROC 1)."""
    bank = Bank.open(root, "m.gguf", "0" * 64)
    for t, (table, completion) in shelves.items():
        shelf = bank.shelf(ShelfKey("gsm8k", "train", "cot", t, 0.9, 384))
        for qid, answers in table.items():
            shelf.append(_samples(qid, answers, [-0.1 if a == "12" else -1.0 for a in answers],
                                  completion=completion))
        bank.record(shelf, {})
    return bank


COLD = {"q0": ["12", "12", "12", "12"], "q1": ["7", "7", "7", "12"], "q2": ["12", "12", "3", "3"],
        "q3": ["12"] * 4}  # q3: only this shelf holds it
WARM = {"q0": ["12", "12", "5", "12"], "q1": ["7", "8", None, "12"], "q2": ["12", "4", "3", "9"]}


def _args(tmp_path, *extra):
    return M.parse_args(["--bank", str(tmp_path / "bank"), "--width", "4", "--orders", "3", "--n-boot", "200",
                         "--out", str(tmp_path / "out"), *extra])


def test_rows_read_the_shared_questions_and_match_hand_counts(tmp_path):
    bank = _bank(tmp_path / "bank", {0.3: (COLD, 100), 0.7: (WARM, 140)})
    rows, qs = M.temperature_rows(bank, _args(tmp_path))
    assert qs == ["q0", "q1", "q2"] and [r.temperature for r in rows] == [0.3, 0.7]
    cold, warm = rows
    assert cold.sample_accuracy == (1.0, 0.25, 0.5)
    assert cold.sc_accuracy == (1.0, 0.0, 0.5)  # q2: a 2-2 tie with the right answer, scored 1/2
    assert warm.sc_accuracy == pytest.approx((1.0, 1 / 3, 0.25))  # q1: 7, 8, 12 tie; q2: a four-way tie
    assert cold.distinct_answers == pytest.approx(5 / 3) and warm.distinct_answers == 3.0
    assert cold.unanimous == pytest.approx(1 / 3) and warm.unanimous == 0.0
    assert warm.no_answer == pytest.approx(1 / 12) and cold.no_answer == 0.0
    # wrong pairs: cold q1 7,7,7 (3 equal), q2 3,3 (1 equal); warm q0 none, q1 7-8 (1, unequal), q2 4,3,9 (3)
    assert (cold.same_wrong, cold.wrong_pairs) == (1.0, 4) and (warm.same_wrong, warm.wrong_pairs) == (0.0, 4)
    assert cold.completion_tokens == 100 and warm.completion_tokens == 140
    assert cold.confidence_auroc == 1.0 and warm.confidence_auroc == 1.0
    assert cold.mean_confidence == pytest.approx((7 * math.exp(-0.1) + 5 * math.exp(-1.0)) / 12)
    # adaptive SC from 2 on cold q0: the first two agree on 12 in every order
    assert cold.adaptive_accuracy[0] == 1.0 and cold.adaptive_tokens > 0


def test_the_command_writes_paired_differences_and_labels_the_source(tmp_path):
    _bank(tmp_path / "bank", {0.3: (COLD, 100), 0.7: (WARM, 140), 1.0: (WARM, 160)})
    assert M.main(_args_list(tmp_path)) == 0
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "(reference)" in text and "nothing synthetic" in text and "3 questions" in text
    row_03 = next(line for line in text.splitlines() if line.startswith("| 0.3 |"))
    assert "58.3 % (+16.7 [" in row_03  # one sample: cold 7/12 against warm 5/12 on the shared questions
    rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert [r["temperature"] for r in rows] == ["0.3", "0.7", "1.0"]
    assert all(r["source"] == "real (bank)" for r in rows)
    assert float(rows[0]["sc_accuracy"]) == pytest.approx(0.5)


def _args_list(tmp_path):
    return ["--bank", str(tmp_path / "bank"), "--width", "4", "--orders", "3", "--n-boot", "200",
            "--out", str(tmp_path / "out")]


def test_refusals_name_what_is_missing(tmp_path):
    _bank(tmp_path / "bank", {0.7: (WARM, 140)})
    with pytest.raises(ValueError, match="two or more temperatures"):
        M.main(_args_list(tmp_path))
    _bank(tmp_path / "bank", {0.3: ({"q9": ["12"] * 4}, 100)})
    with pytest.raises(ValueError, match="no question has 4 samples"):
        M.main(_args_list(tmp_path))
    with pytest.raises(ValueError, match="--width"):
        M.parse_args(["--width", "0", "--out", str(tmp_path)])
