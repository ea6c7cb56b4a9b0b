"""simworld.fit / simworld.mle.fit_mle: the simulator fitted by maximum likelihood and validated out of sample.

The key test generates a corpus with the sim backend itself (known parameters, the logging policy of
simworld.corpus), fits it and checks that the fit recovers the generating parameters and beats the null model on
held-out questions. All numbers here are synthetic.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from dear import sim
from dear.sim import SimBackend, SimParams
from dear.sim.likelihood import FitData
from dear.sim.records import Transition, transitions
from simworld import corpus, mle, validation
from simworld import fit as simfit
from simworld.replay import Schedule, random_schedules, simulate
from simworld.validation import NullModel

# generating parameters deliberately away from the defaults (the optimiser starts at the defaults)
TRUE = replace(SimParams(), skills=[0.4, 0.0, -0.4], difficulty_center=0.2, temp_penalty=1.0, top_p_weight=1.0,
               self_revise_bias=-2.0, switch_bias=-1.5, switch_agree=2.0, p_resolve=0.5, resolve_bonus=1.0,
               p_unique_wrong=0.2, distractor_decay=1.0, words_base=40.0, words_per_temp=90.0)


@pytest.fixture(scope="module")
def sim_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "synthetic-corpus"
    corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(out),
                 "--n-logging", "400", "--n-mad", "60"], backend=SimBackend(TRUE, seed=11))
    return out


@pytest.fixture(scope="module")
def fitted(sim_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit")
    result = simfit.run(sim_corpus, out, holdout=0.2, seed=0, sim_questions=150, command="test", ridge=0.0)
    return result, out  # plain ML: does it recover the generating parameters?


def test_fit_recovers_the_generating_parameters(fitted):
    result, out = fitted
    ident = result["identification"]
    layout = mle._mle_layout(3, fit_top_p=True)
    truth = dict(zip([q.name for q in layout], mle._params_to_theta(TRUE, layout, 3)))
    assert set(ident["estimates"]) == set(truth)
    misses = {}
    for name, est in ident["estimates"].items():
        se = ident["se"][name]
        assert se is not None, name
        if abs(est - truth[name]) > 3.5 * se + 0.05:
            misses[name] = (est, truth[name], se)
    assert not misses, misses
    # the informative parameters are pinned down, not just "within a huge error bar"
    for name in ("difficulty_center", "switch_bias", "switch_disagree", "switch_agree", "self_revise_bias",
                 "resolve_bonus", "skill_0"):
        assert ident["se"][name] < 0.6, (name, ident["se"][name])
    p = SimParams.from_json(out / simfit.PARAMS_FILE)
    assert p.words_base == pytest.approx(TRUE.words_base, abs=3) and p.words_per_temp == pytest.approx(90, abs=5)
    assert p.p_unique_wrong == pytest.approx(TRUE.p_unique_wrong, abs=0.15)
    doc = json.loads((out / simfit.PARAMS_FILE).read_text())
    assert doc["synthetic"] is True and doc["identification"]["identified"]["switch_agree"] is True


def test_heldout_likelihood_beats_the_null_and_calibration_holds(fitted):
    result, out = fitted
    for row in result["loglik_per_transition"]:
        assert row["transitions"] > 100
        assert row["fitted"] > row["null"] + 0.05, row
        assert row["fitted"] > row["default"], row  # the default world is not the generating one
    cells = [c for rows in result["calibration"].values() for c in rows if c["n"] >= 20]
    inside = np.mean([c["fitted_inside"] for c in cells])
    assert inside >= 0.8, [c for c in cells if not c["fitted_inside"]]
    r0 = result["round0"]["logging (held out)"]
    k, n = r0["observed_accuracy"]
    assert abs(r0["fitted"][0] - k / n) < 0.1
    mad = result["mad"]
    assert mad["real"]["n"] == 60 and abs(mad["sim fitted (synthetic)"]["accuracy"] - mad["real"]["accuracy"]) < 0.2
    text = (out / "fit_report.md").read_text()
    assert "SYNTHETIC" in text and "Calibration" in text and "null" in text


def test_data_from_other_parameters_fit_worse_out_of_sample():
    """A wrong structure shows up: parameters fitted on another world lose held-out likelihood."""
    other = replace(TRUE, switch_bias=0.5, switch_agree=0.0, self_revise_bias=0.0, p_resolve=0.9)
    sched = random_schedules(300, rounds=2, seed=4)
    a = simulate(SimBackend(TRUE, seed=1), sched, 1, seed=2)
    b = simulate(SimBackend(other, seed=1), sched, 1, seed=3)
    fit_a = mle.fit_mle(a[:240]).params
    fit_b = mle.fit_mle(b[:240]).params
    test_a = FitData.of(a[240:])
    ll_right = validation.heldout_loglik(fit_a, test_a)
    ll_wrong = validation.heldout_loglik(fit_b, test_a)
    assert ll_right > ll_wrong + 0.05 * len(test_a.transitions), (ll_right, ll_wrong)


def test_null_model_is_a_proper_distribution_and_fits_by_counts():
    def tr(own, own_c, new, new_c):
        return Transition(0, 0, 1, own, own_c, 0, 0, 0, 0.0, 0.7, 0.9, new, new_c)

    trs = [tr("1", True, "1", True)] * 6 + [tr("1", True, "2", False)] * 2 + [tr("2", False, "2", False)] * 3 + \
          [tr("2", False, "1", True)] * 2 + [tr("2", False, "3", False)] * 1 + [tr(None, False, "1", True)]
    null = NullModel.fit(trs)
    assert null.k == pytest.approx(9 / 14)  # kept: 6 correct stayed correct, 3 wrong kept
    assert null.q == pytest.approx(3 / 4)  # of the 4 changed-from-wrong (incl. None), 3 became correct
    # outcome probabilities of an own-wrong agent sum to 1 over correct / same wrong / other wrong
    total = sum(math.exp(null.loglik([t])) for t in (tr("2", False, "1", True), tr("2", False, "2", False),
                                                         tr("2", False, "9", False)))
    assert total == pytest.approx(1.0)


def test_wrong_answer_patterns_and_length_fit():
    for m in (2, 3, 4):
        assert sum(mle._signature_probs(0.2, 1.0, m).values()) == pytest.approx(1.0)
    probs = mle._signature_probs(0.0, 50.0, 3)  # one dominant distractor: every wrong answer coincides
    assert probs[(3,)] == pytest.approx(1.0, abs=1e-9)
    rng = np.random.default_rng(0)
    T = rng.uniform(0.1, 1.2, 400)
    tokens = 40 + 90 * T + sim.TEXT_OVERHEAD_TOKENS + rng.normal(0, 6, 400)
    w = mle.fit_words([(t, int(round(n)), False) for t, n in zip(T, tokens)] + [(1.0, 384, True)] * 50)
    assert w["words_base"] == pytest.approx(40, abs=2) and w["words_per_temp"] == pytest.approx(90, abs=3)
    assert mle.fit_words([(0.7, 100, False)] * 10)["identified"] is False  # T never varied
    # lengths that shrink with T: the sim's bound words_per_temp >= 0 holds, base = the mean
    falling = mle.fit_words([(t, int(round(200 - 10 * t)) + sim.TEXT_OVERHEAD_TOKENS, False) for t in T])
    assert falling["slope_at_bound"] and falling["words_per_temp"] == 0.0
    assert falling["unconstrained_per_temp"] == pytest.approx(-10, abs=0.5)
    assert falling["words_base"] == pytest.approx(200 - 10 * T.mean(), abs=0.5)


def test_sim_text_overhead_constant_matches_the_backend():
    from dear.llm.base import ChatMessage, ChatRequest
    from dear.tasks.synthetic import load_synthetic

    p = replace(SimParams(), words_per_temp=0.0, words_base=80.0)
    q = load_synthetic(1, seed=0, split="test")[0]
    be = SimBackend(p, seed=0)
    extra = []
    for s in range(40):
        req = ChatRequest((ChatMessage("user", q.question),), temperature=0.0, top_p=0.9, max_tokens=4096, seed=s,
                          metadata={"question_text": q.question, "agent": 0, "round": 0})
        extra.append(be.generate([req])[0].completion_tokens - 80)
    assert abs(np.mean(extra) - sim.TEXT_OVERHEAD_TOKENS) < 2.5  # words ~ N(80, 6)


def test_not_identified_parameters_are_reported():
    sched = random_schedules(120, rounds=1, seed=1)  # top-p constant at 0.9 in these schedules
    recs = simulate(SimBackend(seed=0), sched, 1, seed=1)
    fit = mle.fit_mle(recs)
    assert "top_p_weight" in fit.why_not and "top_p_weight" not in fit.estimates
    only_mad = simulate(SimBackend(seed=0), [Schedule.mad(3, 1)] * 80, 1, seed=2)
    fit2 = mle.fit_mle(only_mad)
    assert "self_revise_bias" in fit2.why_not and fit2.identified["self_revise_bias"] is False
    assert "switch_temp" in fit2.why_not  # temperature never varied in MAD


def test_ridge_is_chosen_by_cross_validation_on_the_training_part(tmp_path):
    out = tmp_path / "small-corpus"
    corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(out),
                 "--n-logging", "40", "--n-mad", "4"], backend=SimBackend(TRUE, seed=5))
    result = simfit.run(out, tmp_path / "fit", holdout=0.2, seed=0, sim_questions=20, command="test",
                            ridge_grid=(3.0, 0.0), cv_folds=2)
    cv = result["ridge_cv"]
    assert cv["grid"] == [0.0, 3.0] and cv["folds"] == 2  # ascending: a tie goes to plain ML
    assert cv["transitions"] == len(transitions(simfit.to_records(
        simfit.split_by_question(simfit.load_corpus(out).logging, 0.2, 0)[0], "train")))
    assert result["ridge"] == cv["grid"][int(np.argmax(cv["loglik_per_transition"]))]
    for row in result["loglik_per_transition"]:  # every λ scored on the held-out parts too
        assert set(row["by_ridge"]) == {"0.0", "3.0"} and row["by_ridge"][str(result["ridge"])] == row["fitted"]
    text = (tmp_path / "fit" / "fit_report.md").read_text()
    assert "## Penalty: λ = " in text and "← chosen" in text
    assert json.loads((tmp_path / "fit" / simfit.PARAMS_FILE).read_text())["ridge"] == result["ridge"]


def test_ridge_shrinks_the_transition_law_and_leaves_round_0_free():
    recs = simulate(SimBackend(TRUE, seed=2), random_schedules(30, rounds=2, seed=6), 1, seed=3)
    plain = mle.fit_mle(recs, standard_errors=False)
    shrunk = mle.fit_mle(recs, ridge=3.0, standard_errors=False)
    norm = {f.info["ridge"]: sum(v * v for k, v in f.estimates.items() if k in mle.PENALISED)
            for f in (plain, shrunk)}
    assert norm[3.0] < norm[0.0]
    assert all(se is None for se in shrunk.se.values())  # skipped on request
    assert "difficulty_center" not in mle.PENALISED and "skill_0" not in mle.PENALISED
    with pytest.raises(ValueError, match="ridge"):
        mle.fit_mle(recs, ridge=-1.0)
    with pytest.raises(ValueError, match="folds"):
        simfit.folds_by_question([{"question_id": "a"}], 2, 0)


def test_cli_errors_are_named(tmp_path):
    with pytest.raises(SystemExit):
        simfit.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--holdout", "1.5"])
    with pytest.raises(SystemExit):
        simfit.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--ridge-grid", "0,x"])
    with pytest.raises(SystemExit):
        simfit.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--cv-folds", "1"])
    with pytest.raises(ValueError, match="corpus file not found"):  # dear.cli.run prints it as one line
        simfit.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "o")])


@pytest.mark.slow
def test_pipeline_on_a_real_smoke_model_corpus(tmp_path):
    """Collect a tiny real corpus with the smoke model, fit it and write the reports (numbers are meaningless
    at this size; what is tested is that real traces flow through and unidentified parameters are reported)."""
    out = tmp_path / "smoke-corpus"
    corpus.main(["--llm", "smoke", "--task", "gsm8k", "--layout", "multiturn", "--out", str(out), "--n-logging", "5",
                 "--n-mad", "2", "--n-rounds", "1", "--max-tokens", "32", "--parallel", "3", "--n-ctx", "2048"])
    result = simfit.run(out, tmp_path / "fit", holdout=0.4, seed=0, sim_questions=20, command="test",
                            ridge=0.0)  # 3 questions: too few to cross-validate
    assert result["n_train_debates"] == 3 and result["loglik_per_transition"]
    assert result["identification"]["not_identified"]  # 3 debates cannot identify 14 parameters
    assert (tmp_path / "fit" / "fit_report.md").exists()


def test_token_counters_are_ratios_of_sums_over_usable_turns():
    turns = [{"messages": [{"content": "x" * 360}], "text": "y" * 320, "prompt_tokens": 100, "completion_tokens": 100},
             {"messages": [{"content": "x" * 36}, {"content": "z" * 4}], "text": "y" * 40, "prompt_tokens": 10,
              "completion_tokens": 10},
             {"messages": [{"content": "x" * 999}], "text": "", "prompt_tokens": 5, "completion_tokens": 0,
              "error": "timeout"}]
    c = mle.fit_chars_per_token(turns)
    assert c["identified"] and c["n"] == 2
    assert c["prompt_chars_per_token"] == pytest.approx(400 / 110)
    assert c["text_chars_per_token"] == pytest.approx(360 / 110)
    assert mle.fit_chars_per_token(turns[2:]) == {"identified": False, "n": 0}
