"""simworld.evidence_match and the sim's text bank: simulated e_ij brought to a corpus' e_ij (synthetic data).

The "real" corpus here is a sim-made corpus whose texts are rewritten so that agreement is much less visible
(every completion is padded with words shared by all answers to the question, as real texts share the
question's wording): the bank must carry that over to the simulator, the sim's own texts must not.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from dear.sim import SimBackend, SimParams, TextBank, parse_header
from simworld import corpus, evidence_match
from simworld.corpus import CORPUS_FILE, read_corpus


def _pad(text: str, question: str, rng) -> str:
    """Dilute the answer words: 60 words of the question's header id (shared by every agent on it)."""
    h = parse_header(question)
    words = " ".join(f"topic{h.id.replace('-', '')}w{k}" for k in rng.integers(0, 40, 60))
    return text.replace("Reasoning: ", f"Reasoning: {words} ").replace("Conclusion: ", f"Conclusion: {words[:200]} ")


@pytest.fixture(scope="module")
def padded_corpus(tmp_path_factory):
    src = tmp_path_factory.mktemp("c") / "sim"
    corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(src),
                 "--n-logging", "120", "--n-mad", "16"], backend=SimBackend(seed=4))
    rng = np.random.default_rng(0)
    out = src.parent / "padded"
    out.mkdir()
    (out / "settings.json").write_text((src / "settings.json").read_text())
    from dear.debate.prompts import parse_sections

    with open(out / CORPUS_FILE, "wb") as f:
        for r in read_corpus(src):
            for turns in r["trace"]["rounds"]:
                for t in turns:
                    t["text"] = _pad(t["text"], r["trace"]["question"], rng)
                    sec = parse_sections(t["text"])
                    t["reasoning"], t["conclusion"] = sec.reasoning, sec.conclusion
            f.write(gzip.compress((json.dumps(r) + "\n").encode()))
    return out


def test_bank_texts_bring_the_sim_evidence_to_the_corpus(padded_corpus, tmp_path):
    res = evidence_match.run(padded_corpus, tmp_path, "hashing", SimParams(), n_sim=40, holdout=0.3, seed=0,
                             command="test", keeps=(0.7, 1.0), mixes=(0.0,))
    fitted = json.loads((tmp_path / "evidence_report.json").read_text())["recombination"]
    assert (fitted["keep"], fitted["mix"]) in {(0.7, 0.0), (1.0, 0.0)} and len(fitted["grid"]) == 2
    assert SimParams.from_json(tmp_path / evidence_match.PARAMS_FILE).bank_sentence_keep == fitted["keep"]
    name = f"sim, recombined bank texts (keep {fitted['keep']:.2f}, mix {fitted['mix']:.2f})"
    real, before, after = res["real"], res["sim, own texts"], res[name]
    assert real["agree"]["n"] > 100 and real["differ"]["n"] > 50
    # the padded corpus separates agreement far less than the sim's own texts
    assert real["d_prime"] < before["d_prime"] / 2
    for k in ("agree", "differ"):
        assert after["ks_vs_real"][k]["statistic"] < before["ks_vs_real"][k]["statistic"] - 0.2, k
    assert abs(after["d_prime"] - real["d_prime"]) < abs(before["d_prime"] - real["d_prime"])
    text = (tmp_path / "evidence_report.md").read_text()
    assert "KS" in text and "SYNTHETIC" in text and (tmp_path / evidence_match.BANK_FILE).exists()


def test_text_bank_keeps_the_sims_answers_and_decisions(padded_corpus, tmp_path):
    bank = evidence_match.build_text_bank([r["trace"] for r in read_corpus(padded_corpus)])
    path = evidence_match.write_text_bank(bank, tmp_path / "bank.json.gz")
    params = SimParams()
    plain = evidence_match.simulate_traces(params, {}, 12, 3, None)
    banked = evidence_match.simulate_traces(params, {}, 12, 3, path)
    for a, b in zip(plain, banked):
        # same decisions, answers and token counts: only the words differ
        assert [[t["answer_key"] for t in r] for r in a["rounds"]] == [[t["answer_key"] for t in r] for r in b["rounds"]]
        assert a["completion_tokens"] == b["completion_tokens"]
        assert all("topic" in t["text"] for r in b["rounds"] for t in r)
    tb = TextBank.load(path)
    assert all(any(c["correct"] for c in q["classes"]) for q in tb.eligible)
    with pytest.raises(ValueError, match="not found"):
        TextBank.load(tmp_path / "missing.json.gz")
    with pytest.raises(ValueError, match="no question"):
        TextBank([], "x")


def test_recombined_bank_texts_keep_the_conclusion_and_draw_from_the_question():
    text = "Reasoning: First step.\nSecond step. Third step.\nConclusion: The answer is 4.\nFinal answer: 4"
    bank = TextBank([{"id": "q", "classes": [{"answer": "4", "correct": True, "texts": [text]},
                                              {"answer": "5", "correct": False, "texts": ["Other words here. End."]}]}])
    h = parse_header("[synthetic id=t-1 difficulty=0.5 answer=4 distractors=5,6]")
    whole = bank.text_for(h, "4", 1, 0)
    assert whole == bank.text_for(h, "4", 1, 0, keep=1.0, mix=0.0) and "Final answer" not in whole
    only_conclusion = bank.text_for(h, "4", 1, 0, keep=0.0)
    assert only_conclusion == "Conclusion: The answer is 4."
    # deterministic per (bank text, round, agent); agents differ
    a = [bank.text_for(h, "4", r, ag, keep=0.5, mix=0.3) for r in range(6) for ag in range(3)]
    assert a == [bank.text_for(h, "4", r, ag, keep=0.5, mix=0.3) for r in range(6) for ag in range(3)]
    assert len(set(a)) > 3
    mixed = bank.text_for(h, "4", 1, 0, keep=1.0, mix=1.0)
    assert mixed.endswith("Conclusion: The answer is 4.")
    pool = set(bank._sentences(bank.questions[0]))
    assert all(s in pool for s in mixed.split("\n"))
    with pytest.raises(ValueError, match="bank_sentence_keep"):
        SimParams(bank_sentence_keep=1.5)


def test_grid_edge_is_flagged():
    def fit(keep, mix):
        grid = [{"keep": k, "mix": m} for k in (0.5, 1.0) for m in (0.0, 0.2)]
        return evidence_match.RecombinationFit(keep, mix, grid)

    assert evidence_match.on_grid_edge(fit(1.0, 0.0)) == []  # the ends of [0, 1] are not edges
    assert evidence_match.on_grid_edge(fit(1.0, 0.2)) == ["mix = 0.20"]
    assert evidence_match.on_grid_edge(fit(0.5, 0.0)) == ["keep = 0.50"]


def test_pair_evidence_splits_by_parsed_answer():
    from dear.evidence import make_encoder

    def turn(ans, words):
        return {"answer_key": ans, "reasoning": words, "conclusion": words}

    tr = {"rounds": [[turn("1", "a b c d"), turn("1", "a b c e"), turn("2", "x y z w")],
                     [turn(None, "q"), turn("1", "a b"), turn("1", "a b")]]}
    e = evidence_match.pair_evidence([tr], make_encoder("hashing"))
    assert len(e["agree"]) == 2 and len(e["differ"]) == 2
    assert e["agree"].min() > e["differ"].max()
