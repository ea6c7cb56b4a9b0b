"""The simulated world's independent samples refitted to the bank (simworld.bank_fit): the joint round-0 fit
recovers a known world's difficulty and traps, the trap law draws what its κ says, the wrong-answer patterns sum the
multinomial right, and the command fits the committed bank's train questions and validates on held-out ones."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MajorityProtocol
from dear.sim import SimBackend, SimParams
from dear.sim.model import kappa_of, wrong_label_probs
from dear.tasks.synthetic import load_synthetic
from simworld import bank_fit
from simworld.mle import signature_probs, wrong_pairs_same

TRUE = SimParams(skills=[0.0], difficulty_center=-0.5, difficulty_scale=1.4, p_unique_wrong=0.3,
                 distractor_decay=1.0, trap_share=0.3, trap_slope=0.5, trap_pull=0.9, words_sd=40.0)


def draws_of(params: SimParams, n: int, width: int = 8, seed: int = 0) -> list[bank_fit.QuestionDraws]:
    engine = DebateEngine(SimBackend(params, seed=seed), DebateConfig(n_agents=width, n_rounds=0, seed=seed))
    return [bank_fit.trace_draws(d.trace) for d in engine.run(load_synthetic(n, seed=seed), MajorityProtocol())]


def brute_signature_probs(probs: np.ndarray, m: int) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for labels in itertools.product(range(len(probs)), repeat=m):
        counts = Counter(x for x in labels if x > 0)
        sig = tuple(sorted(list(counts.values()) + [1] * labels.count(0), reverse=True))
        out[sig] = out.get(sig, 0.0) + float(np.prod(probs[list(labels)]))
    return out


@pytest.mark.parametrize("trap", [False, True])
def test_wrong_answer_patterns_sum_the_multinomial_like_every_label_sequence(trap):
    probs = wrong_label_probs(TRUE, trap=trap)
    assert probs.sum() == pytest.approx(1.0)
    for m in (2, 3, 5):
        fast, slow = signature_probs(probs, m), brute_signature_probs(probs, m)
        assert fast.keys() == slow.keys()
        assert max(abs(fast[k] - slow[k]) for k in fast) < 1e-12


def test_the_sim_draws_traps_as_kappa_says_and_lengths_with_their_spread():
    draws = draws_of(TRUE, 600)
    pairs = wrong_pairs_same([q.wrong_answers for q in draws])
    # pairs weight questions by their wrong answers (hard questions, more often traps when γ > 0): κ averages over
    # questions, so the pair rate sits above it here, and far above the same world without traps
    no_traps = wrong_pairs_same([q.wrong_answers for q in draws_of(replace(TRUE, trap_share=0.0), 600)])
    assert kappa_of(replace(TRUE, trap_share=0.0)) == pytest.approx(no_traps.rate, abs=0.03)
    assert pairs.rate > no_traps.rate + 0.1 and kappa_of(TRUE) > kappa_of(replace(TRUE, trap_share=0.0))
    lengths = [n for q in draws for n in q.completion_tokens]
    assert 30 < np.std(lengths) < 50  # words_sd = 40 (the old fixed spread was 6)


def test_the_joint_fit_recovers_a_known_world():
    draws = draws_of(TRUE, 300)
    fitted, fit = bank_fit.fit_round0(draws, SimParams())
    assert fitted.skills == [0.0] and not fit.temp_penalty_fitted
    assert fitted.difficulty_center == pytest.approx(TRUE.difficulty_center, abs=0.35)
    assert fitted.difficulty_scale == pytest.approx(TRUE.difficulty_scale, rel=0.25)
    assert fitted.trap_pull == pytest.approx(TRUE.trap_pull, abs=0.15)
    assert fitted.p_unique_wrong == pytest.approx(TRUE.p_unique_wrong, abs=0.12)
    assert kappa_of(fitted) == pytest.approx(kappa_of(TRUE), abs=0.06)
    # the truth is more likely than the world without traps on questions the fit never saw
    held = draws_of(TRUE, 150, seed=1)
    assert sum(bank_fit.joint_loglik(fitted, held).values()) > sum(
        bank_fit.joint_loglik(replace(fitted, trap_share=0.0), held).values())


def test_the_command_fits_train_questions_of_the_bank_and_validates_on_held_out_ones(tmp_path):
    base = "worlds/gsm8k-fitted/sim_params_synthetic_texts.json"
    assert bank_fit.main(["--base", base, "--fresh", "results/fresh-samples-gsm8k", "--sim-questions", "60",
                          "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bank_fit.json").read_text())
    assert all("-train-" in s for s in doc["fit"]["shelves"])
    assert doc["validation"]["real_questions"] > 0 and doc["fit"]["round0"]["questions"] > 0
    params = SimParams.from_json(tmp_path / "sim_params_synthetic_texts.json")
    assert params.skills == [0.0] and params.has_confidence and params.words_sd > 6
    assert params.switch_agree == SimParams.from_json(base).switch_agree  # the exchange rounds stay the base's
    text = (tmp_path / "README.md").read_text()
    assert "train/holdout" in text and "synthetic" in text.lower()


def test_the_joint_fit_recovers_the_effect_of_temperature_from_a_grid():
    """The same questions (one δ each) sampled at T 0.3, 0.7 and 1.0 with a known τ: with two or more temperatures
    the fit frees τ and finds it; the difficulty comes back as well."""
    from dear.sim.model import difficulty_logit, excess, sigmoid

    truth = replace(TRUE, temp_penalty=1.5, trap_share=0.0)
    rng = np.random.default_rng(4)
    draws = []
    for i in range(120):
        d = float(difficulty_logit(truth, rng.uniform()))
        for t in (0.3, 0.7, 1.0):
            right = rng.uniform(size=8) < sigmoid(-d - truth.temp_penalty * float(excess(truth, t, 0.9)))
            wrong = tuple(str(rng.integers(100, 200)) for _ in range(int((~right).sum())))
            draws.append(bank_fit.QuestionDraws(f"q{i}", t, 0.9, tuple(bool(r) for r in right), wrong,
                                                (200,) * 8, (False,) * 8))
    fitted, fit = bank_fit.fit_round0(draws, SimParams())
    assert fit.temp_penalty_fitted and fit.questions == 120
    assert fitted.temp_penalty == pytest.approx(1.5, abs=0.35)
    assert fitted.difficulty_center == pytest.approx(truth.difficulty_center, abs=0.35)
