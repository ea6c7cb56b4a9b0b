"""simworld.fresh_samples (new wide round 0s on the questions the fit held out) and simworld.sampling_validation
(sampling rules, real vs simulated). Sim backend; one smoke-model test marked slow."""

from __future__ import annotations

import json

import pytest

from dear import tasks
from dear.debate.engine import default_debate_seed
from simworld import corpus, fresh_samples, sampling_validation
from simworld.corpus import read_corpus
from simworld.fit import load_corpus, split_by_question
from simworld.sampling_validation import Samples, rule_outcome, rules_for, samples_used


def _sim_corpus(path, n_log=10, n_mad=3):
    assert corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(path),
                        "--n-logging", str(n_log), "--n-mad", str(n_mad)]) == 0
    return path


def _samples(keys, correct=None, tokens=None):
    correct = correct if correct is not None else [k == "a" for k in keys]
    return Samples(tuple(keys), tuple(correct), tuple(tokens or [10] * len(keys)))


def test_rules_read_a_prefix_and_score_ties_as_expected_values():
    s = _samples(["a", "b", "c", "b", "a", "a", "a", "a", "a"], tokens=list(range(1, 10)))
    assert samples_used(s, "cot") == 1 and rule_outcome(s, "cot").score == 1.0
    assert rule_outcome(s, "sc-3").score == pytest.approx(1 / 3)  # a, b, c: a three-way tie holding the answer
    assert samples_used(s, "adaptive-sc-2") == 4  # the 4th sample is the first to repeat an answer (b)
    assert rule_outcome(s, "adaptive-sc-2") == sampling_validation.Outcome(0.0, 4, 1 + 2 + 3 + 4)
    assert samples_used(s, "adaptive-sc-3") == 6 and rule_outcome(s, "adaptive-sc-3").score == 1.0
    assert rule_outcome(s, "sc-9").score == 1.0
    never = _samples(list("abcdefghi"))
    assert samples_used(never, "adaptive-sc-2") == 9  # nobody agrees: all samples, then the 9-way tie
    assert rule_outcome(never, "adaptive-sc-2").score == pytest.approx(1 / 9)
    assert rule_outcome(_samples([None, None, "a"]), "sc-3").score == 1.0  # no answer never votes
    assert rules_for(9) == ["cot", "sc-3", "sc-5", "sc-9", "adaptive-sc-2", "adaptive-sc-3"]
    with pytest.raises(ValueError, match="needs 9 samples"):
        rule_outcome(_samples(["a"] * 3), "sc-9")
    with pytest.raises(ValueError, match="unknown rule"):
        rule_outcome(s, "vote-2")


def test_fresh_samples_are_new_draws_on_the_held_out_questions_and_resume(tmp_path):
    c = _sim_corpus(tmp_path / "corpus")
    out = tmp_path / "fresh"
    args = ["--corpus", str(c), "--llm", "sim", "--width", "5", "--max-tokens", "384", "--out", str(out)]
    assert fresh_samples.main([*args, "--n", "2"]) == 0
    held = split_by_question(load_corpus(c).logging, 0.2, 0)[1]
    unseen = [t["question_id"] for t in held] + [t["question_id"] for t in load_corpus(c).mad]
    assert fresh_samples.unseen_question_ids(c, 0.2, 0) == unseen and len(unseen) == 5
    recs = read_corpus(out / fresh_samples.SAMPLES_FILE)
    assert [r["question_id"] for r in recs] == unseen[:2]
    assert fresh_samples.main(args) == 0  # grows to every unseen question, redoing none
    recs = read_corpus(out / fresh_samples.SAMPLES_FILE)
    assert [r["question_id"] for r in recs] == unseen
    corpus_seeds = {(r["trace"]["question_id"], t["seed"]) for r in read_corpus(c) for t in r["trace"]["rounds"][0]}
    for r in recs:
        turns = r["trace"]["rounds"][0]
        assert len(turns) == 5 and len(r["trace"]["rounds"]) == 1
        assert all(t["temperature"] == 0.7 and t["top_p"] == 0.9 for t in turns)
        assert all(t["answer_key"] is not None for t in turns)  # whole sim answers, not cut off
        assert not {(r["question_id"], t["seed"]) for t in turns} & corpus_seeds  # no corpus completion again
    q = next(q for q in tasks.load("synthetic", split="train") if q.id == unseen[0])
    assert recs[0]["trace"]["seed"] == fresh_samples.fresh_seed(q) != default_debate_seed(q)
    assert "5 of 5 planned" in (out / "PROVENANCE.md").read_text()
    with pytest.raises(ValueError, match="'width': \\(5, 7\\)"):
        fresh_samples.main([*args[:-4], "--width", "7", "--max-tokens", "384", "--out", str(out)])


def test_the_report_compares_every_rule_and_labels_the_simulator_synthetic(tmp_path):
    c = _sim_corpus(tmp_path / "corpus")
    out = tmp_path / "fresh"
    assert fresh_samples.main(["--corpus", str(c), "--llm", "sim", "--max-tokens", "384", "--out", str(out)]) == 0
    assert sampling_validation.main(["--samples", str(out), "--sim-questions", "40"]) == 0
    md = (out / "validation" / "sampling_validation.md").read_text()
    data = json.loads((out / "validation" / "sampling_validation.json").read_text())
    assert [r["rule"] for r in data["rules"]["real"]] == rules_for(9) == [r["rule"] for r in data["rules"]["sim_synthetic"]]
    assert "SYNTHETIC" in md.splitlines()[0] and md.count("sim (synthetic)") >= 4
    assert data["shape"]["real"]["questions"] == 5 and data["shape"]["sim_synthetic"]["questions"] == 40
    assert 0 < data["shape"]["sim_synthetic"]["sample_accuracy"] < 1  # answers parsed and graded, both ways
    for row in data["rules"]["real"]:
        assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
    for side, rows in data["by_round0_agreement"].items():  # the states split the questions, and their rule
        overall = {r["rule"]: r["accuracy"] for r in data["rules"][side]}  # accuracies average back to the whole
        assert sum(s["questions"] for s in rows.values()) == data["shape"][side]["questions"]
        for rule in ("sc-3", "sc-9"):
            assert sum(s["share"] * s["accuracy"][rule] for s in rows.values() if s["questions"]) == \
                pytest.approx(overall[rule])
    assert "| all differ | sim (synthetic) |" in md
    with pytest.raises(FileNotFoundError, match="not a simworld.fresh_samples directory"):
        sampling_validation.main(["--samples", str(tmp_path)])


@pytest.mark.slow
def test_fresh_samples_with_the_real_smoke_model(tmp_path):
    c = tmp_path / "corpus"
    assert corpus.main(["--llm", "smoke", "--task", "gsm8k", "--layout", "single", "--out", str(c),
                        "--n-logging", "3", "--n-mad", "1", "--n-rounds", "1", "--max-tokens", "24"]) == 0
    out = tmp_path / "fresh"
    assert fresh_samples.main(["--corpus", str(c), "--llm", "smoke", "--width", "3", "--max-tokens", "24",
                               "--parallel", "3", "--out", str(out)]) == 0
    recs = read_corpus(out / fresh_samples.SAMPLES_FILE)
    assert len(recs) == 2  # the one held-out logging question and the MAD question
    for r in recs:
        turns = r["trace"]["rounds"][0]
        assert len(turns) == 3 and all(t["model_id"].startswith("smoke:") and t["completion_tokens"] > 0 for t in turns)
    assert "SmolLM2" in (out / "PROVENANCE.md").read_text()


def test_agreement_state_of_the_first_three_samples():
    def of(*keys):
        return sampling_validation.agreement_state(Samples(keys, (False,) * len(keys), (1,) * len(keys)))

    assert of("1", "1", "1", "2") == "unanimous" and of("1", "2", "1") == "two agree"
    assert of("1", "2", "3", "1") == "all differ" and of(None, None, "3") == "all differ"

