"""The simulator fitted to a mixed pool (agents of different reply styles): per-agent skills, answer-only agents,
per-agent validation. The corpus is made by the sim backend itself (known parameters), so every number here is
synthetic."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dear.sim import SimBackend, SimParams
from dear.sim.records import record_from_dict
from simworld import corpus, mle
from simworld import fit as simfit
from simworld.evidence_match import build_text_bank
from simworld.fit import length_turns, load_corpus
from simworld.validation import sim_debate_config

# one strong and one weaker reasoning agent beside an answer-only agent that is nearly always wrong
TRUE = replace(SimParams(), skills=[1.0, 0.2, -2.5], difficulty_center=0.2, switch_bias=-1.5, switch_agree=2.0,
               p_resolve=0.5, resolve_bonus=1.0, p_unique_wrong=0.3, words_base=60.0, words_per_temp=50.0,
               text_chars_per_token=3.5)
PROFILES = "cot,cot,direct"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "mixed"
    corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "multiturn", "--out", str(out),
                 "--agent-profiles", PROFILES, "--n-logging", "240", "--n-mad", "40"],
                backend=SimBackend(TRUE, seed=3))
    fit_dir = out.parent / "fit"
    return out, simfit.run(out, fit_dir, holdout=0.25, seed=0, sim_questions=120, command="test", ridge=0.0), fit_dir


def test_answer_only_agents_write_the_answer_line_and_are_left_out_of_length_and_bank(mixed):
    out, _, _ = mixed
    c = load_corpus(out)
    direct = [t for tr in c.logging for turns in tr["rounds"] for t in turns if t["style"] == "direct"]
    cot = [t for tr in c.logging for turns in tr["rounds"] for t in turns if t["style"] == "cot"]
    assert direct and all(t["text"] == f"Final answer: {t['answer_key']}" for t in direct if t["answer_key"])
    assert np.mean([t["completion_tokens"] for t in direct]) < 10 < 60 < np.mean([t["completion_tokens"] for t in cot])
    assert len(length_turns(c.logging)) == len(cot)
    bank = build_text_bank(c.logging)
    texts = {x for q in bank["questions"] for k in q["classes"] for x in k["texts"]}
    assert texts and not any(x.startswith("Final answer:") for x in texts)
    from dear.sim import TextBank
    from simworld.evidence_match import write_text_bank

    assert TextBank.load(write_text_bank(bank, out.parent / "bank.json.gz")).rewrite_answers  # new banks rewrite


def test_fit_recovers_each_agents_skill_and_the_length_of_reasoning_agents(mixed):
    _, result, fit_dir = mixed
    ident = result["identification"]
    layout = mle._mle_layout(3, fit_top_p=True)
    truth = dict(zip([q.name for q in layout], mle._params_to_theta(TRUE, layout, 3)))
    for name in ("skill_0", "skill_1"):  # skills are reported relative to their mean (absorbed in c)
        assert abs(ident["estimates"][name] - truth[name]) < 3.5 * ident["se"][name] + 0.05, name
    p = SimParams.from_json(fit_dir / simfit.PARAMS_FILE)
    assert p.skill(0) > p.skill(1) > p.skill(2) + 1.5
    # the direct agent's ~5-token replies would drag a pooled length fit far below the reasoning agents'
    assert p.words_base == pytest.approx(TRUE.words_base, abs=6) and p.words_per_temp == pytest.approx(50, abs=8)


def test_validation_is_reported_per_agent_with_its_profile(mixed):
    _, result, fit_dir = mixed
    rows = result["round0"]["logging (held out)"]["by_agent"]
    assert [r["agent"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert abs(r["observed"] / r["n"] - r["predicted"]) < 0.15, r
    groups = {c["group"] for c in result["calibration"]["logging (held out)"]}
    assert {"agent 0", "agent 1", "agent 2"} <= groups
    real, sim = result["mad"]["real"], result["mad"]["sim fitted (synthetic)"]
    for a in range(3):  # the simulated MAD's agents write as long as the corpus's
        assert sim["completion_tokens_per_agent"][a] == pytest.approx(real["completion_tokens_per_agent"][a], rel=0.2)
    report = (fit_dir / "fit_report.md").read_text()
    assert "agent 2 (sim:direct)" in report and "Round-0 accuracy by agent" in report


def test_the_sim_debates_of_the_validation_seat_the_corpus_profiles_without_their_backend():
    cfg = sim_debate_config({"n_agents": 3, "agent_profiles": ["local:cot", "local:cot", "local:direct:64"]}, seed=0)
    assert [(p.backend, p.style, p.max_tokens) for p in cfg.agent_profiles] == [
        (None, "cot", None), (None, "cot", None), (None, "direct", 64)]
    assert sim_debate_config({"n_agents": 3}, seed=0).agent_profiles is None


def test_a_shuffled_seating_is_refused_by_the_fit():
    turn = {"agent": 0, "answer_key": "1", "correct": True, "temperature": 0.7}
    trace = {"rounds": [[dict(turn, agent=a) for a in range(3)]], "pool_order": [2, 0, 1]}
    with pytest.raises(ValueError, match=r"trace 7: seats the pool in the order \[2, 0, 1\]"):
        record_from_dict(trace, "trace 7")
    assert record_from_dict(dict(trace, pool_order=[0, 1, 2]), "t") is not None


def test_evidence_pairs_are_split_by_pair_type_in_a_mixed_pool_only():
    from simworld.evidence_match import pair_evidence, recombination_score

    class Echo:  # embeds a text as (length, 1): pairs of equal-length texts have e_ij = 1
        def encode(self, texts):
            return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    def turn(style, key, text):
        return {"style": style, "answer_key": key, "reasoning": text, "conclusion": text}

    mixed = [{"rounds": [[turn("cot", "1", "a long text"), turn("cot", "1", "a long text"), turn("direct", "1", "1")]]}]
    out = pair_evidence(mixed, Echo())
    assert sorted(out) == ["agree", "agree cot-cot", "agree cot-direct", "differ"]
    assert len(out["agree"]) == 3 and len(out["agree cot-direct"]) == 2 and len(out["differ"]) == 0
    same = [{"rounds": [[turn(None, "1", "x"), turn(None, "2", "y")]]}]
    assert sorted(pair_evidence(same, Echo())) == ["agree", "differ"]
    # per-type distances: a sim with the right pairs of each type scores 0 whatever its mix of types
    real = {"agree": np.array([1.0, 0.5]), "agree cot-cot": np.array([1.0]), "agree cot-direct": np.array([0.5]),
            "differ": np.array([])}
    sim = {"agree": np.array([1.0, 0.5, 0.5, 0.5]), "agree cot-cot": np.array([1.0]),
           "agree cot-direct": np.array([0.5, 0.5, 0.5]), "differ": np.array([])}
    assert recombination_score(real, sim) == 0.0


def test_a_bank_that_rewrites_answers_states_the_sims_answer():
    from dear.sim import TextBank
    from dear.sim.bank import rewrite_answer
    from dear.synthetic_header import parse_header
    from dear.tasks.synthetic import load_synthetic

    assert rewrite_answer("So 1,200 - 200 = 1000, then 1200.0, $1200. and 11200", "1200", "967") == \
        "So 967 - 200 = 1000, then 967, $967. and 11200"
    assert rewrite_answer("x = \\frac{1}{2}", "\\frac{1}{2}", "7") == "x = 7"
    questions = [{"id": "q", "classes": [
        {"answer": "1200", "correct": True, "texts": ["The total is 1,200.\nFinal answer: 1200"]},
        {"answer": "40", "correct": False, "texts": ["It is 40.\nFinal answer: 40"]},
        {"answer": "7", "correct": False, "texts": ["It is 7.\nFinal answer: 7"]}]}]
    h = parse_header(load_synthetic(1, seed=0, split="test")[0].question)
    old, new = TextBank(questions), TextBank(questions, rewrite_answers=True)
    assert old.text_for(h, h.answer, 0, 0) == "The total is 1,200."  # banks without the key: unchanged texts
    assert new.text_for(h, h.answer, 0, 0) == f"The total is {h.answer}."
    assert new.text_for(h, h.distractors[0], 0, 0) == f"It is {h.distractors[0]}."
