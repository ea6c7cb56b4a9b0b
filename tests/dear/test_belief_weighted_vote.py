"""The belief-weighted final vote: every sample weighted by its agent's certainty 1 - u_i in its round
(dear.vote.weighted_tally, Debate.vote_weights, dear.regulator.CertaintyWeigher), in the engine, the environment and
re-voted on stored debates (eval.decision_rules)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from dear.belief import opinions
from dear.debate import DebateConfig, DebateEngine
from dear.debate.protocols import MADProtocol
from dear.debate.trace import write_jsonl
from dear.evidence import make_encoder
from dear.regulator import CertaintyWeigher, observe, round_evidence
from dear.vote import tally, vote, weighted_tally
from envs.vector_env import DebateVectorEnv
from eval import decision_rules
from tests.dear.debate.test_baselines_as_settings import QUESTIONS, by_seed
from tests.dear.debate.test_debate_engine import FakeBackend


def test_weighted_tally_ranks_by_summed_weight_and_keeps_the_tie_rule():
    keys = ["a", "a", "b", None]
    t = weighted_tally(keys, [0.1, 0.1, 0.3, 5.0])  # a no-answer weighs nothing
    assert t.leaders == ("b",) and t.counts == {"a": 2, "b": 1} and t.top == 1
    tied = weighted_tally(keys, [0.2, 0.1, 0.3, 0.0])
    assert tied.leaders == ("a", "b") and tied.score({"a": True, "b": False}) == 0.5
    assert weighted_tally(keys, [1, 1, 1, 1]).leaders == tally(keys).leaders  # equal weights = plurality
    assert weighted_tally([None], [1.0]).leaders == ()
    with pytest.raises(ValueError, match="2 weights for 4 keys"):
        weighted_tally(keys, [1.0, 1.0])
    result = vote(keys, [False, False, True, False], np.random.default_rng(0), weights=[0.1, 0.1, 0.3, 0.0])
    assert result.answer == "b" and result.correct and result.score == 1.0


class ByAgent:
    """A weigher that makes agent `favourite` far more certain than the others, in every round."""

    def __init__(self, favourite: int):
        self.favourite, self.calls = favourite, 0

    def __call__(self, debates):
        self.calls += 1
        for d in debates:
            for r, turns in enumerate(d.trace.rounds):
                d.certainty[r] = [10.0 if t.agent == self.favourite else 0.1 for t in turns]


def test_engine_votes_with_the_weighers_certainties():
    config = DebateConfig(n_agents=3, n_rounds=1, seed=5, decision="belief-weighted")
    with pytest.raises(ValueError, match="needs an engine with a weigher"):
        DebateEngine(FakeBackend(by_seed), config).run(QUESTIONS, MADProtocol(3, 1))
    for favourite in range(3):
        weigher = ByAgent(favourite)
        for d in DebateEngine(FakeBackend(by_seed), config, weigher=weigher).run(QUESTIONS, MADProtocol(3, 1)):
            mine = {turns[favourite].answer_key for turns in d.trace.rounds} - {None}
            if mine:  # the favourite's answers (both rounds vote) outweigh everyone else's
                assert d.trace.final_answer in mine
            assert len(d.certainty) == 2
        assert weigher.calls == len(QUESTIONS)


def test_certainty_weigher_is_one_minus_u_of_each_round_and_matches_observe():
    encoder = make_encoder("hashing")
    config = DebateConfig(n_agents=3, n_rounds=2, seed=5)
    debates = DebateEngine(FakeBackend(by_seed), config).run(QUESTIONS, MADProtocol(3, 2))
    CertaintyWeigher(encoder)(debates)
    for d in debates:
        assert sorted(d.certainty) == [0, 1, 2]
        u = opinions(round_evidence(d.trace.rounds, encoder)).u
        assert np.allclose([d.certainty[r] for r in range(3)], (1 - u).numpy(), atol=1e-6)
        assert all(0 < c < 0.5 for cs in d.certainty.values() for c in cs)  # u_i > 1/2 always (docs/DESIGN.md §3)
    live = DebateEngine(FakeBackend(by_seed), config).start(QUESTIONS)
    obs = observe(live, encoder)  # the regulator's observation keeps the certainties it computed
    for k, d in enumerate(live):
        assert d.certainty[0] == pytest.approx((1 - obs.u[k]).tolist())


def test_mixed_widths_are_weighed_in_their_own_batches():
    encoder = make_encoder("hashing")
    narrow = DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=0, seed=5)).start(QUESTIONS[:1])
    wide = DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=5, n_rounds=0, seed=5)).start(QUESTIONS[:1])
    CertaintyWeigher(encoder)(narrow + wide)
    assert [len(d.certainty[0]) for d in narrow + wide] == [3, 5]


def test_env_trains_with_the_belief_weighted_vote():
    env = DebateVectorEnv(num_envs=2, decision="belief-weighted", silent=True,
                          autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=[3, 4])
    done = np.zeros(2, bool)
    while not done.all():
        action = {"mask": np.ones((2, 6), np.int8), "behavior": np.zeros((2, 6), np.float32)}
        _, reward, done, _, _ = env.step(action)
        assert np.isfinite(reward).all()
    for d in env.debates:
        assert sorted(d.certainty) == [0, 1, 2] and d.trace.vote_counts
    env.close()


def test_decision_rules_revotes_stored_debates(tmp_path):
    config = DebateConfig(n_agents=3, n_rounds=2, seed=0)
    debates = DebateEngine(FakeBackend(by_seed), config).run(QUESTIONS, MADProtocol(3, 2))
    write_jsonl([d.trace for d in debates], tmp_path / "mad.jsonl")
    assert decision_rules.main(["--traces", str(tmp_path / "mad.jsonl"), "--out", str(tmp_path / "out"),
                                "--encoder", "hashing"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    assert [r["rule"] for r in rows] == ["last-round", "all-answers", "belief-weighted"]
    last = [d.trace.final_score for d in debates]
    assert float(rows[0]["accuracy"]) == pytest.approx(np.mean(last))  # the stored vote, re-counted
    per = list(csv.DictReader(open(tmp_path / "out" / "per_debate.csv")))
    assert [float(p["last-round"]) for p in per] == pytest.approx(last)
    weighted = DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=2, seed=0,
                                                               decision="belief-weighted"),
                            weigher=CertaintyWeigher(make_encoder("hashing"))).run(QUESTIONS, MADProtocol(3, 2))
    # re-voting a stored debate gives what the engine decides live
    assert [float(p["belief-weighted"]) for p in per] == pytest.approx([d.trace.final_score for d in weighted])
    with pytest.raises(FileNotFoundError, match="no such file"):
        decision_rules.main(["--traces", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o2")])


@pytest.mark.slow
def test_decision_rules_on_real_stored_debates_with_the_real_encoder(tmp_path):
    """Real GSM8K debates of the embedded model (committed traces), certainties from all-MiniLM-L6-v2."""
    from tests import ROOT

    traces = ROOT / "results/eval-gsm8k-n60-v2/traces/gsm8k/mad.jsonl"
    torch.manual_seed(0)
    assert decision_rules.main(["--traces", str(traces), "--out", str(tmp_path)]) == 0
    rows = {r["rule"]: r for r in csv.DictReader(open(tmp_path / "rows.csv"))}
    assert int(rows["belief-weighted"]["n"]) == 60
    stored = [t.final_score for t in decision_rules.read_source(traces).traces if not t.failed]
    assert float(rows["last-round"]["accuracy"]) == pytest.approx(np.mean(stored))
