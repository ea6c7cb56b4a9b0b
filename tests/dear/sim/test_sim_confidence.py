"""The simulated world's confidence model (dear/sim/confidence.py) and its fit to the bank
(simworld.confidence_fit): a turn that asks for log-probabilities gets a drawn mean token log-probability, right
samples more confident, a question's samples sharing its effect; nothing else about the turn moves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MajorityProtocol
from dear.debate.sampling_rules import Samples
from dear.sim import SimBackend, SimParams
from dear.tasks.synthetic import load_synthetic
from simworld import confidence_fit

MODEL = {"confidence_mu_correct": -2.0, "confidence_sd_correct": 0.05, "confidence_mu_wrong": -1.0,
         "confidence_sd_wrong": 0.05, "confidence_sd_question": 0.5}


def round0(params: dict, logprobs: int | None, n: int = 12, width: int = 6):
    engine = DebateEngine(SimBackend(params), DebateConfig(n_agents=width, n_rounds=0, seed=3, logprobs=logprobs))
    return engine.run(load_synthetic(n, seed=1), MajorityProtocol())


def test_a_turn_that_asks_gets_the_models_confidence_and_nothing_else_moves():
    with_model = round0(MODEL, 5)
    plain = round0({}, 5)
    unasked = round0(MODEL, None)
    for a, b, c in zip(with_model, plain, unasked):
        assert [t.text for t in a.trace.rounds[0]] == [t.text for t in b.trace.rounds[0]] \
            == [t.text for t in c.trace.rounds[0]]
        assert all(t.confidence is None for t in c.trace.rounds[0])  # not asked
        assert all(t.confidence == {"missing": "sim-v1 sent no log-probabilities"} for t in b.trace.rounds[0])
    samples = [Samples.of(d.trace) for d in with_model]
    right = [c for s in samples for c, ok in zip(s.confidence, s.correct) if ok]
    wrong = [c for s in samples for c, ok in zip(s.confidence, s.correct) if not ok]
    assert right and wrong and np.mean(right) > np.mean(wrong)  # exp(-2) against exp(-1), before the shared effect
    # one question's samples of a class sit together (sd 0.05 within), questions apart (sd 0.5 between)
    spread_within = np.mean([np.std(np.log(-np.array([c for c, ok in zip(s.confidence, s.correct) if ok])))
                             for s in samples if sum(s.correct) >= 2])
    assert spread_within < 0.1


def test_the_model_needs_both_class_spreads():
    with pytest.raises(ValueError, match="both > 0"):
        SimParams(confidence_sd_correct=0.3)


def test_the_fit_reads_train_questions_and_validates_on_held_out_ones(tmp_path):
    into = tmp_path / "sim_params_synthetic_confidence.json"
    base = "worlds/gsm8k-fitted/sim_params_synthetic_texts.json"
    assert confidence_fit.main(["--out", str(tmp_path / "fit"), "--base", base, "--into", str(into),
                                "--n-boot", "50"]) == 0
    doc = json.loads((tmp_path / "fit" / "confidence_fit.json").read_text())
    fit_q, held_q = doc["fit"]["questions"], doc["validation"]["questions"]
    assert fit_q > held_q > 0 and doc["shelf"].startswith("gsm8k-train")
    p = doc["params"]
    assert p["confidence_mu_correct"] < p["confidence_mu_wrong"]  # right samples: log(-m) lower, m higher
    assert 0.5 < doc["validation"]["auroc_model"] < 1 and p["confidence_sd_question"] > 0
    params = SimParams.from_json(into)
    assert params.has_confidence and params.confidence_sd_question == pytest.approx(p["confidence_sd_question"])
    assert params.skills == SimParams.from_json(base).skills  # the base world's other parameters, unchanged
    with pytest.raises(ValueError, match="write a new file"):
        confidence_fit.main(["--out", str(tmp_path / "fit"), "--base", base, "--into", base])
    assert "train/holdout" in (tmp_path / "fit" / "README.md").read_text()
