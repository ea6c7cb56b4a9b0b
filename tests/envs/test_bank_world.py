"""The bank world as a training env: real samples replayed, a start from one sample, the turn kinds the world can
play, and each agent's confidence in the observation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dear import tasks
from dear.bank.backend import BankBackend
from dear.bank.store import Bank, BankSample, ShelfKey
from dear.policy import KINDS, JointPolicy, PolicyConfig, selection_obs_dim
from envs.debate_env import DebateEnv
from tests.dear.test_extended_actions import beliefs

QUESTIONS = tasks.load("gsm8k", "test", n=3)
KEY = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 384)
BANKED = QUESTIONS[:2]  # the third question is not in the bank


def _record(i: int) -> dict:
    return {"mean_logprob": -0.1 * (i + 1), "lowest_group": 1.0, "tail_mean": -0.1, "answer_mean": None,
            "margin": None, "n_tokens": 20, "k": 5, "window": 16, "tail": 32}


def bank(tmp_path) -> Bank:
    b = Bank.open(tmp_path, "m.gguf", "0" * 64)
    shelf = b.shelf(KEY)
    for q in BANKED:
        shelf.append([BankSample(q.id, i, 100 + i, f"Reasoning: r{i}\nFinal answer: \\boxed{{{a}}}", a, a,
                                 a == q.gold, "exact", 50, 20, "stop", _record(i))
                      for i, a in enumerate([q.gold, "1", q.gold, "2", q.gold, "3", q.gold, "4"])])
    b.record(shelf, {})
    return b


def env(tmp_path, **knobs) -> DebateEnv:
    settings = dict(task="gsm8k", split="test", n_agents=3, n_rounds=2, actions="extended", decision="all-answers",
                    start_width=1, turn_kinds=("keep", "fresh"), confidence_feature=True, max_tokens=384)
    settings.update(knobs)
    return DebateEnv(llm=BankBackend(bank(tmp_path), "gsm8k", "test"), encoder="hashing",
                     questions=QUESTIONS, **settings)


def action(kinds, stop=0) -> dict:
    return {"mask": np.zeros(6, dtype=np.int8), "behavior": np.zeros(6, dtype=np.float32),
            "kinds": np.array([KINDS.index(k) for k in kinds], dtype=np.int64), "stop": np.int64(stop)}


def test_the_env_asks_only_banked_questions_and_starts_from_one_replayed_sample(tmp_path):
    e = env(tmp_path)
    assert [q.id for q in e.core.questions] == [q.id for q in BANKED]
    obs, _ = e.reset(seed=0)
    assert obs["selection"].shape == (selection_obs_dim(3, "extended", confidence_feature=True),)
    first, *waiting = e.debate.trace.rounds[0]
    assert first.source.startswith(f"bank:{KEY.name}#") and all(t.waiting for t in waiting)
    index = int(first.source.rsplit("#", 1)[1])
    confidence = obs["selection"][21:24]  # after the paper's V(2V+1) features
    assert confidence[0] == pytest.approx(math.exp(-0.1 * (index + 1)), rel=1e-3) and (confidence[1:] == 0).all()


def test_fresh_turns_replay_distinct_samples_and_a_revise_is_refused(tmp_path):
    e = env(tmp_path)
    e.reset(seed=1)
    e.step(action(("keep", "fresh", "fresh")))
    _, reward, done, _, info = e.step(action(("fresh", "keep", "fresh")))
    sources = [t.source for t in e.debate.voters("all-answers")]
    assert done and len(sources) == len(set(sources)) == 5  # 1 + 2 + 2 samples, none drawn twice
    assert info["tokens_total"] == sum(t.prompt_tokens + t.completion_tokens for t in e.debate.voters("all-answers"))
    e.reset(seed=2)
    with pytest.raises(ValueError, match=r"\['revise'\] not playable"):
        e.step(action(("revise", "keep", "keep")))


def test_a_policy_never_picks_a_kind_the_world_cannot_play():
    torch.manual_seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=3, actions="extended", turn_kinds=("keep", "fresh"),
                                      confidence_feature=True))
    obs = torch.rand(256, selection_obs_dim(3, "extended", confidence_feature=True))
    b, u = beliefs(256)
    act = policy.act(obs, b, u)
    assert not (act.kinds == KINDS.index("revise")).any() and (act.kinds == KINDS.index("fresh")).any()
    assert torch.isfinite(act.entropy_selection).all()
    with pytest.raises(ValueError, match="turn_kinds"):
        PolicyConfig(actions="extended", turn_kinds=("swap",))


def test_the_world_checks_its_settings(tmp_path):
    with pytest.raises(ValueError, match="start_width"):
        env(tmp_path, start_width=4)
    with pytest.raises(ValueError, match="need actions='extended'"):
        env(tmp_path, actions="paper")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['start_wdith'\]"):
        env(tmp_path, start_wdith=1)


def test_single_cot_is_a_setting_of_the_policy_that_starts_from_one_sample(tmp_path):
    """Start from one sample and stop at once (stop when the leader holds 1/V): the vote is the first sample's
    answer at the first sample's tokens, as a single chain of thought."""
    e = env(tmp_path)
    policy = JointPolicy(PolicyConfig(n_agents=3, actions="extended", turn_kinds=("keep", "fresh"),
                                      confidence_feature=True, kinds_mode="fresh-one", stop_mode="agree",
                                      stop_agree=1 / 3, behavior_mode="fixed"))
    for seed in range(4):
        obs, _ = e.reset(seed=seed)
        first = e.debate.trace.rounds[0][0]
        act = policy.act(torch.as_tensor(obs["selection"])[None], torch.as_tensor(obs["belief"])[None],
                         torch.as_tensor(obs["uncertainty"])[None], deterministic=True)
        step = {k: v[0] for k, v in act.env_action().items()}
        _, _, done, _, info = e.step(step)
        assert done and info["final_answer"] == first.answer_key
        assert info["tokens_total"] == first.prompt_tokens + first.completion_tokens


def quick_export(tmp_path, *overrides: str):
    """`--config gsm8k-quick` trained one small iteration on the committed bank, exported and loaded."""
    from dear.export import export_checkpoint, load_exported
    from train.config import load_config
    from train.runner import Trainer

    cfg = load_config("gsm8k-quick", ["env.encoder=hashing", "run.iterations=1", "rollout.episodes_per_iter=16",
                                      f"run.out_dir={tmp_path}", "logging.progress=false", *overrides])
    trainer = Trainer(cfg)
    try:
        result = trainer.train()
    finally:
        trainer.close()
    return load_exported(export_checkpoint(result.run_dir, tmp_path / "policy"))


def test_the_quick_preset_trains_in_the_bank_world_exports_and_debates(tmp_path):
    """`--config gsm8k-quick` in small on the committed bank (real replayed samples): the exported policy starts from
    one sample, asks for log-probabilities and never revises when it debates at inference time."""
    from dear.infer import RegulatedDebater
    from tests.dear.debate.test_debate_engine import FakeBackend

    exported = quick_export(tmp_path)
    assert exported.start_width == 1 and exported.policy.config.turn_kinds == ("keep", "fresh")
    backend = FakeBackend()
    debater = RegulatedDebater(exported, backend, encoder="hashing", allow_encoder_mismatch=True)
    assert debater.config.start_width == 1 and debater.config.logprobs is not None
    (out,) = debater.run([tasks.load("gsm8k", "test", n=1)[0]])
    assert len(backend.calls[0]) == 1  # round 0 is one sample
    assert not any(t.peers for turns in out.trace.rounds for t in turns)  # nobody revises reading peers


def test_a_confidence_weighted_world_votes_by_each_samples_own_confidence(tmp_path):
    """decision: confidence-weighted asks for log-probabilities even when the policy observes none, and a small
    vote_tau lets the most confident sample decide (the bank's confidences fall with the sample index)."""
    e = env(tmp_path, decision="confidence-weighted", vote_tau=0.01, confidence_feature=False)
    for seed in range(4):
        e.reset(seed=seed)
        _, _, done, _, info = e.step(action(("fresh", "fresh", "fresh"), stop=0))
        _, _, done, _, info = e.step(action(("keep", "keep", "keep"), stop=1))
        voters = e.debate.voters("confidence-weighted")
        assert done and all(t.confidence is not None for t in voters)
        best = min(voters, key=lambda t: int(t.source.rsplit("#", 1)[1]))  # sample i: mean log-prob -0.1 (i + 1)
        assert info["final_answer"] == best.answer_key
        assert e.debate.trace.decision == "confidence-weighted" and e.debate.trace.vote_tau == 0.01
    with pytest.raises(ValueError, match="vote_tau"):
        env(tmp_path, decision="confidence-weighted", vote_tau=0)


def test_a_policy_trained_with_the_confidence_weighted_vote_debates_with_it(tmp_path):
    """The vote rule and its tau travel from the config through the export to inference time."""
    from dear.infer import RegulatedDebater
    from tests.dear.debate.test_debate_engine import FakeBackend

    exported = quick_export(tmp_path, "env.decision=confidence-weighted", "env.vote_tau=0.05",
                            "env.confidence_feature=false")
    assert exported.decision == "confidence-weighted" and exported.vote_tau == 0.05
    assert not exported.policy.config.confidence_feature and exported.reads_confidence
    debater = RegulatedDebater(exported, FakeBackend(), encoder="hashing", allow_encoder_mismatch=True)
    assert debater.config.decision == "confidence-weighted" and debater.config.vote_tau == 0.05
    assert debater.config.logprobs is not None


def test_the_committed_bank_policy_debates_on_a_real_model_with_its_confidence(smoke_backend):
    """The exported bank-world policy (results/policy-bank-gsm8k-p0.05) at inference time on a real llama.cpp model
    (the smoke model: its answers are nonsense, the plumbing is real): one sample first, every sent turn with a
    confidence record from real log-probabilities, and no revise turn."""
    from dear.export import load_exported
    from dear.infer import RegulatedDebater
    from tests import ROOT

    exported = load_exported(ROOT / "results" / "policy-bank-gsm8k-p0.05")
    debater = RegulatedDebater(exported, smoke_backend, encoder="hashing", allow_encoder_mismatch=True,
                               max_tokens=24)
    (out,) = debater.run([tasks.load("gsm8k", "test", n=1)[0]])
    first, *waiting = out.trace.rounds[0]
    assert not first.waiting and all(t.waiting for t in waiting)
    sent = [t for turns in out.trace.rounds for t in turns if not t.silent]
    assert sent and all(t.confidence is not None and "missing" not in t.confidence for t in sent)
    assert not any(t.peers for t in sent)


def test_the_sample_budgets_travel_from_the_config_through_the_export_to_inference_time(tmp_path):
    """env.max_samples and env.fresh_per_round shape the world the policy learned in; its debates keep them."""
    from dear.infer import RegulatedDebater
    from tests.dear.debate.test_debate_engine import FakeBackend

    exported = quick_export(tmp_path, "env.max_samples=5", "env.fresh_per_round=1", "env.n_rounds=4")
    assert exported.max_samples == 5 and exported.fresh_per_round == 1
    debater = RegulatedDebater(exported, FakeBackend(), encoder="hashing", allow_encoder_mismatch=True)
    assert debater.config.max_samples == 5 and debater.config.fresh_per_round == 1
    (out,) = debater.run([tasks.load("gsm8k", "test", n=1)[0]])
    drawn = [sum(t.fresh or (r == 0 and not t.waiting) for t in turns) for r, turns in enumerate(out.trace.rounds)]
    assert all(n <= 1 for n in drawn) and sum(drawn) <= 5


def test_a_round_budget_in_the_bank_world_draws_one_sample_a_round(tmp_path):
    e = env(tmp_path, n_rounds=3, fresh_per_round=1)
    e.reset(seed=3)
    e.step(action(("fresh", "fresh", "fresh")))
    e.step(action(("fresh", "fresh", "fresh")))
    assert e.debate.n_samples == 3 and [sum(t.fresh for t in turns) for turns in e.debate.trace.rounds[1:]] == [1, 1]
    with pytest.raises(ValueError, match="fresh_per_round"):
        env(tmp_path, fresh_per_round=0)


POT = ShelfKey("gsm8k", "test", "pot", 0.7, 0.9, 384)


def two_mode_bank(tmp_path) -> Bank:
    """`bank` plus a pot shelf whose samples carry their (stored) sandbox runs."""
    b = bank(tmp_path)
    shelf = b.shelf(POT)
    for q in BANKED:
        runs = [{"code": f"print({a})", "answer_text": a, "verdict": "ok", "stdout": f"{a}\n"} for a in ("7", "8")]
        shelf.append([BankSample(q.id, i, 200 + i, f"```python\nprint({r['answer_text']})\n```", r["answer_text"],
                                 r["answer_text"], False, "exact", 40, 10, "stop", _record(i), program=r)
                      for i, r in enumerate(runs * 4)])
    b.record(shelf, {})
    return b


def test_a_pool_that_mixes_modes_replays_each_agents_mode_and_observes_who_is_who(tmp_path):
    e = DebateEnv(llm=BankBackend(two_mode_bank(tmp_path), "gsm8k", "test", profile=("cot", "pot")),
                  encoder="hashing", questions=QUESTIONS, task="gsm8k", split="test", n_agents=3, n_rounds=2,
                  actions="extended", decision="all-answers", start_width=1, turn_kinds=("keep", "fresh"),
                  confidence_feature=True, max_tokens=384, agent_profiles=("cot", "pot", "cot"),
                  shuffle_profiles=True, profile_feature=True)
    seen = set()
    for seed in range(6):
        e.reset(seed=seed)
        e.step(action(("fresh", "fresh", "fresh")))
        for t in e.debate.voters("all-answers"):
            shelf = t.source.partition(":")[2].rpartition("#")[0]
            assert shelf == (POT.name if t.style == "pot" else KEY.name)  # each agent's own mode
            assert (t.program is not None) == (t.style == "pot")
            seen.add(t.style)
    assert seen == {"cot", "pot"}
