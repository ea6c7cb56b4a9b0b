"""eval.confidence_auroc on constructed banks: perfect and reversed separation, a hand-computed vote AUROC,
skipped samples, the bootstrap's weighted AUROC against sklearn, and the files the command writes."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dear.bank.store import Bank, BankSample, ShelfKey
from eval import confidence_auroc as ca

KEY = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 384)


def confidence(x: float) -> dict:
    return {"mean_logprob": x, "lowest_group": x - 1, "tail_mean": x, "answer_mean": None, "margin": None,
            "n_tokens": 10, "k": 5, "window": 16, "tail": 32}


def sample(q: str, i: int, key: str | None, correct: bool, conf: float | None, tokens: int = 100) -> BankSample:
    return BankSample(question_id=q, sample=i, seed=i, text="t", answer=key, answer_key=key, correct=correct,
                      grader="numeric", prompt_tokens=50, completion_tokens=tokens, finish_reason="stop",
                      confidence=None if conf is None else confidence(conf))


def make_bank(tmp_path, samples, key=KEY):
    bank = Bank.open(tmp_path / "bank", "m.gguf", "0" * 64)
    shelf = bank.shelf(key)
    shelf.append(samples)
    bank.record(shelf, {})
    return Bank.open(tmp_path / "bank"), shelf


def separated(sign: float) -> list[BankSample]:
    """4 questions x 3 samples; right answers get confidence sign * (1 + small), wrong ones sign * (-1 - small)."""
    out = []
    for q in range(4):
        for i in range(3):
            right = (q + i) % 2 == 0
            out.append(sample(f"q{q}", i, "5" if right else str(10 + i), right,
                              sign * ((1 if right else -1) + 0.01 * (q + i))))
    return out


def test_perfect_separation_gives_auroc_one(tmp_path):
    _, shelf = make_bank(tmp_path, separated(+1))
    r = ca.measure_result(shelf, "mean_logprob", n_boot=200, seed=0)
    assert r.n_samples == 12 and r.n_missing == 0
    assert r.sample_auroc.estimate == 1.0
    assert r.sample_auroc.low == 1.0 and r.sample_auroc.high == 1.0


def test_reversed_separation_gives_auroc_zero(tmp_path):
    _, shelf = make_bank(tmp_path, separated(-1))
    r = ca.measure_result(shelf, "lowest_group", n_boot=200, seed=0)
    assert r.sample_auroc.estimate == 0.0
    assert r.sample_auroc.high == 0.0


def test_vote_auroc_hand_computed(tmp_path):
    # q1: 5,5,7 -> winner 5 (correct), confidence mean(0.9, 0.5) = 0.7, the loser's 0.1 is ignored
    # q2: 3,3,3 wrong -> confidence mean(0.8, 0.6, 0.4) = 0.6
    # q3: 1,2,None tie -> leaders (1, 2); 1 correct -> score 0.5 -> correct; confidence = the "1" voter's 0.2
    # q4: 8,9,4 3-way tie, 9 correct -> score 1/3 -> wrong; winner "4" (first sorted), confidence 0.3
    # the 4th sample of q1 does not vote.
    samples = [sample("q1", 0, "5", True, 0.9), sample("q1", 1, "5", True, 0.5), sample("q1", 2, "7", False, 0.1),
               sample("q1", 3, "7", False, 0.0),
               sample("q2", 0, "3", False, 0.8), sample("q2", 1, "3", False, 0.6), sample("q2", 2, "3", False, 0.4),
               sample("q3", 0, "1", True, 0.2), sample("q3", 1, "2", False, 0.95), sample("q3", 2, None, False, 0.9),
               sample("q4", 0, "8", False, 0.5), sample("q4", 1, "9", True, 0.5), sample("q4", 2, "4", False, 0.3)]
    _, shelf = make_bank(tmp_path, samples)
    assert ca.round0_vote(shelf.of("q1"), "mean_logprob") == (pytest.approx(0.7), True)
    assert ca.round0_vote(shelf.of("q3"), "mean_logprob") == (pytest.approx(0.2), True)
    assert ca.round0_vote(shelf.of("q4"), "mean_logprob") == (pytest.approx(0.3), False)
    r = ca.measure_result(shelf, "mean_logprob", n_boot=100, seed=0)
    # correct votes (0.7, 0.2) vs wrong (0.6, 0.3): pairs won 0.7>0.6, 0.7>0.3 -> 2 of 4
    assert r.n_questions == 4 and r.n_votes_skipped == 0
    assert r.vote_auroc.estimate == pytest.approx(0.5)
    assert r.vote_accuracy == pytest.approx(0.5)


def test_missing_confidence_is_skipped_and_counted(tmp_path):
    samples = separated(+1)
    samples[1] = sample("q0", 1, "10", False, None)
    samples[2] = sample("q0", 2, "5", True, None)
    samples[3] = sample("q1", 0, "x", False, None)
    _, shelf = make_bank(tmp_path, samples)
    r = ca.measure_result(shelf, "mean_logprob", n_boot=50, seed=0)
    assert (r.n_samples, r.n_missing) == (9, 3)
    assert r.sample_auroc.estimate == 1.0
    answer = ca.measure_result(shelf, "answer_mean", n_boot=50, seed=0)  # None everywhere
    assert (answer.n_samples, answer.n_missing, answer.n_questions, answer.n_votes_skipped) == (0, 12, 0, 4)
    assert np.isnan(answer.sample_auroc.estimate) and answer.sample_auroc.text() == "n/a"
    length = ca.measure_result(shelf, ca.LENGTH, n_boot=50, seed=0)
    assert length.n_missing == 0


def test_weighted_auroc_equals_sklearn_with_weights():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 5, size=40).astype(float)  # many ties
    correct = rng.random(40) < 0.4
    weights = rng.integers(0, 3, size=(6, 40)).astype(float)
    got = ca.weighted_aurocs(values, correct, weights)
    want = [roc_auc_score(correct, values, sample_weight=w) for w in weights]
    np.testing.assert_allclose(got, want)


def test_bootstrap_is_seeded(tmp_path):
    samples = separated(+1)
    samples[0] = sample("q0", 0, "5", True, -2.0)  # imperfect
    _, shelf = make_bank(tmp_path, samples)
    points = ca.sample_scores(shelf, "mean_logprob")
    a, b = ca.cluster_bootstrap(points, 300, 7), ca.cluster_bootstrap(points, 300, 7)
    assert a == b and a.low <= a.estimate <= a.high


def test_reliability_bins_deciles():
    values = np.arange(100, dtype=float)
    bins = ca.reliability_bins(values, values >= 50)
    assert [b.count for b in bins] == [10] * 10
    assert [b.fraction_correct for b in bins] == [0.0] * 5 + [1.0] * 5


def test_command_writes_its_files(tmp_path, capsys):
    make_bank(tmp_path, separated(+1))
    out = tmp_path / "out"
    ca.main(["--bank", str(tmp_path / "bank"), "--n-boot", "50", "--seed", "3", "--out", str(out)])
    assert (out / f"reliability-{KEY.name}.png").stat().st_size > 0
    md = (out / "summary.md").read_text()
    assert "Real model: `m.gguf`" in md and "--seed 3" in md and KEY.name in md
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["summary"] for r in rows] == [*ca.SUMMARIES, ca.LENGTH]
    assert {r["synthetic"] for r in rows} == {"False"}
    assert rows[0]["auroc_sample"] == "1"


def test_shelf_choice(tmp_path):
    bank, _ = make_bank(tmp_path, [sample("q0", 0, "5", True, None), sample("q0", 1, "5", True, None)])
    with pytest.raises(ValueError, match="no shelf at temperature 0.7 with confidence"):
        ca.chosen_shelves(bank, None)
    with pytest.raises(ValueError, match="--shelf: nope"):
        ca.chosen_shelves(bank, ["nope"])
    assert [s.key for s in ca.chosen_shelves(bank, [KEY.name])] == [KEY]
