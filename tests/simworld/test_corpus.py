"""simworld.corpus: the resumable logged-debate corpus collector (sim backend; one smoke-model test marked slow)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dear.sim import SimBackend
from simworld import corpus
from simworld.corpus import LoggingPolicy, read_corpus

BASE = ["--llm", "sim", "--task", "synthetic", "--layout", "single"]


def _run(out, n_log, n_mad, *extra, backend=None):
    return corpus.main([*BASE, "--out", str(out), "--n-logging", str(n_log), "--n-mad", str(n_mad), *extra],
                       backend=backend)


def test_logging_policy_draws_are_seeded_per_debate_and_round_with_their_densities():
    pol = LoggingPolicy(3, 2, 0.5, (0.1, 1.2), (0.5, 1.0), seed=7)
    a, b = pol.draw("synthetic/q1/s1", 1), pol.draw("synthetic/q1/s1", 1)
    assert a == b  # independent of scheduling: only (seed, debate, round) matter
    assert pol.draw("synthetic/q1/s1", 2) != a and pol.draw("synthetic/q2/s1", 1) != a
    mask = np.array(a.mask)
    assert not np.diag(mask).any()
    assert a.log_prob_mask == pytest.approx(6 * math.log(0.5))
    assert a.log_density_temperature == pytest.approx(-3 * math.log(1.1))
    assert a.log_density_top_p == pytest.approx(-3 * math.log(0.5))
    assert all(0.1 <= t <= 1.2 for t in a.temperature) and all(0.5 <= p <= 1.0 for p in a.top_p)
    # coverage: over many draws, every pair bit is on about half the time and T spans the range
    draws = [pol.draw(f"d{k}", 1) for k in range(400)]
    on = np.mean([np.array(d.mask)[~np.eye(3, dtype=bool)].mean() for d in draws])
    temps = np.concatenate([d.temperature for d in draws])
    assert 0.45 < on < 0.55 and temps.min() < 0.15 and temps.max() > 1.15
    asym = LoggingPolicy(3, 1, 0.25, (0.1, 1.2), (0.5, 1.0), seed=0).draw("x", 1)
    n_on = int(np.array(asym.mask).sum())
    assert asym.log_prob_mask == pytest.approx(n_on * math.log(0.25) + (6 - n_on) * math.log(0.75))
    with pytest.raises(ValueError, match="--temperature-range"):
        LoggingPolicy(3, 2, 0.5, (1.0, 0.5), (0.5, 1.0), seed=0)
    with pytest.raises(ValueError, match="--mask-p"):
        LoggingPolicy(3, 2, 1.0, (0.1, 1.2), (0.5, 1.0), seed=0)


def test_collects_logging_and_mad_debates_on_disjoint_questions(tmp_path):
    out = tmp_path / "c"
    assert _run(out, 6, 3) == 0
    recs = read_corpus(out)
    kinds = [r["kind"] for r in recs]
    assert kinds.count("logging") == 6 and kinds.count("mad") == 3
    q = {k: {r["trace"]["question_id"] for r in recs if r["kind"] == k} for k in ("logging", "mad")}
    assert len(q["logging"]) == 6 and len(q["mad"]) == 3 and not q["logging"] & q["mad"]
    for r in recs:
        tr = r["trace"]
        assert r["layout"] == "single" and len(tr["rounds"]) == 3 and tr["model_ids"] == ["sim-v1"] * 3
        for turns in tr["rounds"]:
            for t in turns:  # everything the fit needs is kept
                assert {"text", "answer", "answer_key", "peers", "temperature", "top_p", "completion_tokens",
                        "prompt_tokens", "reused_prompt_tokens"} <= set(t)
        if r["kind"] == "logging":  # the record's policy draws are exactly what the engine ran
            for drawn in r["policy"]["rounds"]:
                turns = tr["rounds"][drawn["round"]]
                assert [t["peers"] for t in turns] == [list(np.flatnonzero(m)) for m in drawn["mask"]]
                assert [t["temperature"] for t in turns] == pytest.approx(drawn["temperature"])
                assert [t["top_p"] for t in turns] == pytest.approx(drawn["top_p"])
        else:
            assert all(t["peers"] == [j for j in range(3) if j != t["agent"]] and t["temperature"] == 0.7
                       for t in tr["rounds"][1])
    prov = (out / "PROVENANCE.md").read_text()
    assert "SYNTHETIC" in prov and "6 logging-policy on 6 questions" in prov and "3 MAD on 3" in prov and "layout `single`" in prov
    assert "python -m simworld.corpus" in prov and "--n-logging 6" in prov


def test_resume_grows_the_corpus_and_a_cut_member_is_redone(tmp_path):
    out = tmp_path / "c"
    _run(out, 4, 2)
    first = read_corpus(out)
    _run(out, 6, 2)  # grows: the 4 + 2 stored debates are kept, 2 logging debates are added
    grown = read_corpus(out)
    assert grown[: len(first)] == first and len(grown) == 8
    ids = [(r["kind"], r["trace"]["question_id"]) for r in grown]
    assert len(set(ids)) == len(ids)
    # a kill in the middle of writing the last member: it is moved aside and that debate is redone
    path = out / corpus.CORPUS_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-15])
    assert len(read_corpus(out)) == 7
    _run(out, 6, 2)
    again = read_corpus(out)
    assert len(again) == 8 and {(r["kind"], r["trace"]["question_id"]) for r in again} == set(ids)
    assert list(out.glob("corpus.jsonl.gz.cut-*"))
    # the same records, bit for bit, as an uninterrupted run (the sim is deterministic per request seed)
    fresh = tmp_path / "fresh"
    _run(fresh, 6, 2)
    def content(recs):  # everything but timings
        return sorted((r["kind"], r["trace"]["question_id"], json.dumps(r["policy"]),
                       [[(t["text"], t["peers"], t["temperature"], t["completion_tokens"]) for t in turns]
                        for turns in r["trace"]["rounds"]]) for r in recs)

    assert content(again) == content(read_corpus(fresh))


def test_repeats_add_debates_with_new_seeds_to_the_same_questions(tmp_path):
    out = tmp_path / "c"
    _run(out, 3, 1)
    first = read_corpus(out)
    _run(out, 3, 1, "--repeats", "2")  # grows: a second logging debate per logging question, MAD unchanged
    grown = read_corpus(out)
    assert grown[: len(first)] == first and len(grown) == 3 * 2 + 1
    logging_ = [r["trace"] for r in grown if r["kind"] == "logging"]
    by_question = {}
    for t in logging_:
        by_question.setdefault(t["question_id"], []).append(t)
    assert len(by_question) == 3 and all(len(v) == 2 for v in by_question.values())
    for a, b in by_question.values():  # distinct seeds, so distinct draws of the logging policy and of the sim
        assert a["debate_id"] != b["debate_id"] and a["seed"] != b["seed"]
    _run(out, 3, 1, "--repeats", "2")  # nothing left to do
    assert len(read_corpus(out)) == 7
    with pytest.raises(ValueError, match="--repeats must be >= 1, got 0"):
        _run(out, 3, 1, "--repeats", "0")


def test_settings_guard_and_bad_flags_are_named(tmp_path):
    out = tmp_path / "c"
    _run(out, 2, 1)
    with pytest.raises(ValueError, match="other settings.*layout"):
        corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "multiturn", "--out", str(out),
                     "--n-logging", "2", "--n-mad", "1"])
    with pytest.raises(ValueError, match="--n-logging must be >= 0"):
        _run(tmp_path / "d", -1, 1)
    with pytest.raises(ValueError, match="--n-mad 5000 exceeds"):
        _run(tmp_path / "e", 1, 5000)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="--out .*file exists and is not a directory"):
        _run(tmp_path / "file", 1, 1)
    with pytest.raises(SystemExit):
        corpus.main(["--llm", "sim", "--out", str(tmp_path / "f")])  # --layout is required


def test_layout_is_recorded_and_used(tmp_path):
    out = tmp_path / "m"
    corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "multiturn", "--out", str(out),
                 "--n-logging", "1", "--n-mad", "1"], backend=SimBackend(seed=0))
    recs = read_corpus(out)
    assert {r["layout"] for r in recs} == {"multiturn"}
    assert json.loads((out / "settings.json").read_text())["layout"] == "multiturn"
    # the multi-turn layout keeps the conversation: round 2 prompts hold more messages than round 1
    t = recs[0]["trace"]["rounds"]
    assert len(t[2][0]["messages"]) > len(t[1][0]["messages"])


@pytest.mark.slow
def test_collects_with_the_real_smoke_model(tmp_path):
    out = tmp_path / "smoke"
    assert corpus.main(["--llm", "smoke", "--task", "gsm8k", "--layout", "single", "--out", str(out),
                        "--n-logging", "1", "--n-mad", "1", "--n-rounds", "1", "--max-tokens", "32",
                        "--parallel", "3", "--n-ctx", "2048"]) == 0
    recs = read_corpus(out)
    assert sorted(r["kind"] for r in recs) == ["logging", "mad"]
    for r in recs:
        tr = r["trace"]
        assert tr["model_ids"][0].startswith("smoke:") and not tr["failed"]
        assert all(t["completion_tokens"] > 0 and t["text"] for turns in tr["rounds"] for t in turns)
    prov = (out / "PROVENANCE.md").read_text()
    assert "MIT" in prov and "sha256 `" in prov and "SYNTHETIC" not in prov
    from dear.llm.model_files import smoke_model_path

    import hashlib

    assert hashlib.sha256(smoke_model_path().read_bytes()).hexdigest() in prov
