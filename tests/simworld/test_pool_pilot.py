"""simworld.pool_pilot: round 0 of a candidate pool on train questions, per-profile accuracy and cost, resumable;
a test against the real smoke model (marked slow) and the rest with the synthetic backend."""

from __future__ import annotations

import json

import pytest

from dear.debate.trace import read_jsonl
from dear.sim import SimBackend
from simworld import pool_pilot


def run(out, n: int, profiles: str = "sim:cot,sim:direct:64", backends=None) -> None:
    pool_pilot.main(["--agent-profiles", profiles, "--task", "synthetic", "--n", str(n), "--exclude-corpus", "",
                     "--out", str(out), "--batch", "2", "--max-tokens", "128"],
                    backends=backends or {"sim": SimBackend()})


def test_each_profile_answers_every_question_and_a_rerun_continues(tmp_path):
    out = tmp_path / "pilot"
    run(out, 3)
    first = read_jsonl(out / "traces.jsonl")
    assert [len(t.rounds[0]) for t in first] == [2, 2, 2]
    assert [(a.profile, a.style, a.max_tokens) for a in first[0].rounds[0]] == \
        [("sim:cot", "cot", 128), ("sim:direct:64", "direct", 64)]
    run(out, 3)  # nothing to do
    assert len(read_jsonl(out / "traces.jsonl")) == 3
    run(out, 5)  # a larger --n extends the same seeded order
    traces = read_jsonl(out / "traces.jsonl")
    assert len(traces) == 5 and [t.question_id for t in traces[:3]] == [t.question_id for t in first]
    rep = json.loads((out / "report.json").read_text())
    assert rep["n"] == 5 and [r["profile"] for r in rep["profiles"]] == ["sim:cot", "sim:direct:64"]
    for i, row in enumerate(rep["profiles"]):
        assert row["accuracy"] == pytest.approx(sum(t.rounds[0][i].correct for t in traces) / 5)
        assert row["ci_low"] - 1e-9 <= row["accuracy"] <= row["ci_high"] + 1e-9
    (pair,) = rep["pairs"]
    assert pair["diff"] == pytest.approx(rep["profiles"][0]["accuracy"] - rep["profiles"][1]["accuracy"])
    assert "| `sim:cot` |" in (out / "report.md").read_text()


def test_other_settings_are_refused(tmp_path):
    out = tmp_path / "pilot"
    run(out, 2)
    with pytest.raises(ValueError, match="agent_profiles"):
        run(out, 2, profiles="sim:cot,sim:cot")


def test_the_excluded_corpus_questions_are_left_out():
    from simworld.fit import load_corpus
    from tests import ROOT

    corpus = load_corpus(ROOT / "results" / "corpus-gsm8k")
    used = {t["question_id"] for t in corpus.logging + corpus.mad}
    picked = pool_pilot.pilot_questions("gsm8k", "train", 50, 0, str(ROOT / "results" / "corpus-gsm8k"))
    assert len(picked) == 50 and not used & {q.id for q in picked}
    assert [q.id for q in picked[:20]] == [q.id for q in pool_pilot.pilot_questions(
        "gsm8k", "train", 20, 0, str(ROOT / "results" / "corpus-gsm8k"))]


@pytest.mark.slow
def test_a_pilot_on_the_real_smoke_model(tmp_path):
    out = tmp_path / "pilot"
    pool_pilot.main(["--agent-profiles", "smoke:cot,smoke:direct:16", "--n", "2", "--max-tokens", "48",
                     "--parallel", "2", "--out", str(out)])
    traces = read_jsonl(out / "traces.jsonl")
    assert len(traces) == 2 and all(not t.failed for t in traces)
    for t in traces:
        cot, direct = t.rounds[0]
        assert cot.text and direct.text and 0 < direct.completion_tokens <= 16 and cot.completion_tokens <= 48
        assert cot.model_id.startswith("smoke:") and t.question_id.startswith("train-")
    assert json.loads((out / "report.json").read_text())["n"] == 2
