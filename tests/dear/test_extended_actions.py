"""The extended action set: per-agent turn kinds (revise / keep / fresh) and a stop, chosen by the selection
policy; its log-probs and entropy, the environment that plays it, the trainer's handling of early stops, and the
strong baselines as fixed settings of the policy (SC and MAD-stop reproduce their protocols' decisions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from dear.belief import opinions
from dear.debate import DebateConfig, DebateEngine
from dear.debate.engine import TURN_KINDS
from dear.debate.protocols import (SamplingRuleProtocol, MADProtocol, MajorityProtocol, SelfConsistencyProtocol,
                                   StopWhenUnanimousProtocol)
from dear.evidence import make_encoder
from dear.policy import KINDS, LEADER_FEATURE, JointPolicy, PolicyConfig, selection_obs_dim
from dear.regulator import RegulatedProtocol
from envs.vector_env import DebateVectorEnv
from tests.dear.debate.test_baselines_as_settings import QUESTIONS, by_seed
from tests.dear.debate.test_debate_engine import FakeBackend


def beliefs(batch: int, v: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    e = torch.rand(batch, v, v, generator=g)
    op = opinions((e + e.transpose(1, 2)) / 2)
    return op.b.float(), op.u.float()


def extended_policy(**kw) -> JointPolicy:
    torch.manual_seed(0)
    return JointPolicy(PolicyConfig(actions="extended", **kw))


def test_kind_order_is_the_engines():
    assert KINDS == TURN_KINDS


def test_log_prob_counts_only_the_parts_that_act():
    policy = extended_policy()
    obs = torch.rand(64, selection_obs_dim(3, "extended"))
    b, u = beliefs(64)
    act = policy.act(obs, b, u)
    logp, _ = policy.evaluate_selection(obs, act.pairs, act.kinds, act.stop)
    assert torch.allclose(logp, act.logp_selection)
    # pairs of an agent that does not revise, and everything after a stop, change nothing
    flipped = act.pairs.clone()
    reader = torch.arange(6) // 2  # pair_order(3): reader of each pair
    idle = (act.kinds[:, reader] != 0) | (act.stop[:, None] > 0)
    flipped[idle] = 1 - flipped[idle]
    assert torch.allclose(policy.evaluate_selection(obs, flipped, act.kinds, act.stop)[0], logp)
    kinds = act.kinds.clone()
    kinds[act.stop > 0] = (kinds[act.stop > 0] + 1) % 3
    assert torch.allclose(policy.evaluate_selection(obs, act.pairs, kinds, act.stop)[0], logp)
    assert (act.pairs[idle] == 0).all()  # the env gets only the pairs that act
    # a kept turn and a stopped debate carry no behavior log-prob
    active = act.behavior_active
    assert ((active == 0) == ((act.kinds == 1) | (act.stop[:, None] > 0))).all()


def test_entropy_is_the_hierarchical_actions_entropy():
    policy = extended_policy()
    with torch.no_grad():  # a non-uniform distribution, so the check is not trivial
        policy.selection.net[-1].bias.copy_(torch.linspace(-1.5, 1.5, policy.selection.net[-1].bias.numel()))
    obs = torch.rand(1, selection_obs_dim(3, "extended")).expand(20000, -1)
    b, u = beliefs(1)
    act = policy.act(obs, b.expand(20000, -1, -1), u.expand(20000, -1))
    monte_carlo = -act.logp_selection.mean()
    assert float(act.entropy_selection[0]) == pytest.approx(float(monte_carlo), abs=0.05)


def test_fixed_rules_play_the_baselines():
    sc = extended_policy(selection_mode="full", kinds_mode="fresh", stop_mode="never", behavior_mode="fixed")
    mad_stop = extended_policy(selection_mode="full", kinds_mode="revise", stop_mode="agree", stop_agree=1.0)
    obs = torch.rand(4, selection_obs_dim(3, "extended"))
    obs[:, LEADER_FEATURE] = torch.tensor([1 / 3, 2 / 3, 1.0, 0.0])
    b, u = beliefs(4)
    a = sc.act(obs, b, u)
    assert (a.kinds == 2).all() and (a.stop == 0).all() and (a.pairs == 0).all()
    assert not sc.selection_trainable and float(a.logp_selection.abs().sum()) == 0.0
    m = mad_stop.act(obs, b, u)
    assert m.stop.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert (m.pairs[m.stop == 0] == 1).all() and (m.pairs[m.stop == 1] == 0).all()


def test_random_rules_draw_kinds_and_stops_at_their_frequencies():
    policy = extended_policy(selection_mode="random", random_p=0.5, kinds_mode="random",
                             random_kinds=(0.2, 0.3, 0.5), stop_mode="random", random_stop=0.25)
    obs = torch.rand(4000, selection_obs_dim(3, "extended"))
    b, u = beliefs(4000)
    a = policy.act(obs, b, u)
    go = a.stop == 0
    assert float(a.stop.mean()) == pytest.approx(0.25, abs=0.03)
    shares = [float((a.kinds[go] == k).float().mean()) for k in range(3)]
    assert shares == pytest.approx([0.2, 0.3, 0.5], abs=0.03)
    assert not policy.selection_trainable and float(a.logp_selection.abs().sum()) == 0.0
    # only a revising agent reads, at the pair probability
    revising = (a.kinds[go] == 0).repeat_interleave(2, dim=-1)
    assert float(a.pairs[go][revising].mean()) == pytest.approx(0.5, abs=0.03)
    assert float(a.pairs[go][~revising].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="random_kinds must be 3 probabilities"):
        PolicyConfig(actions="extended", random_kinds=(0.5, 0.6, 0.0))
    with pytest.raises(ValueError, match="random_stop must be in"):
        PolicyConfig(actions="extended", random_stop=1.5)


def test_a_paper_policy_is_unchanged():
    paper = JointPolicy(PolicyConfig())
    obs = torch.rand(3, selection_obs_dim(3))
    b, u = beliefs(3)
    act = paper.act(obs, b, u)
    assert act.kinds is None and act.stop is None and set(act.env_action()) == {"mask", "behavior"}
    with pytest.raises(ValueError, match="actions must be one of paper|extended"):
        PolicyConfig(actions="wide")


def make_env(**kw) -> DebateVectorEnv:
    return DebateVectorEnv(num_envs=4, actions="extended", autoreset_mode=AutoresetMode.DISABLED, shaping=True,
                           shaping_coef=1.0, **kw)


def test_env_plays_kinds_and_stop_and_votes_over_every_sample():
    env = make_env(decision="all-answers")
    obs, _ = env.reset(seed=[1, 2, 3, 4])
    assert obs["selection"].shape == (4, selection_obs_dim(3, "extended"))
    action = {"mask": np.ones((4, 6), np.int8), "behavior": np.zeros((4, 6), np.float32),
              "kinds": np.array([[2, 2, 2], [0, 0, 0], [1, 1, 1], [0, 1, 2]], np.int8),
              "stop": np.array([0, 0, 0, 1], np.int8)}
    _, _, done, _, _ = env.step(action)
    assert done.tolist() == [False, False, False, True]  # stopped before round 1: no call, the vote is taken
    _, _, done, _, _ = env.step(action)
    assert done.all()
    fresh, revise, keep, stopped = env.debates
    assert fresh.n_samples == 9 and len(fresh.voters("all-answers")) == 9
    assert [t.silent for t in keep.trace.rounds[1]] == [True] * 3 and len(keep.voters("all-answers")) == 3
    assert len(revise.voters("all-answers")) == 9 and stopped.round == 0
    assert stopped.trace.total_tokens == sum(t.prompt_tokens + t.completion_tokens for t in stopped.trace.rounds[0])
    env.close()


@pytest.mark.parametrize("field, value, message", [
    ("kinds", np.array([[3, 0, 0]] * 4, np.int8), r"\['kinds'\] must be 3 integers in 0..2"),
    ("stop", np.array([2, 0, 0, 0], np.int8), r"\['stop'\] must be 0 or 1"),
])
def test_env_names_a_bad_extended_action(field, value, message):
    env = make_env()
    env.reset(seed=1)
    action = {"mask": np.zeros((4, 6), np.int8), "behavior": np.zeros((4, 6), np.float32),
              "kinds": np.zeros((4, 3), np.int8), "stop": np.zeros(4, np.int8), field: value}
    with pytest.raises(ValueError, match=message):
        env.step(action)
    with pytest.raises(ValueError, match="keys"):
        env.step({"mask": action["mask"], "behavior": action["behavior"]})
    env.close()


def regulated(policy: JointPolicy, decision: str):
    backend = FakeBackend(by_seed)
    config = DebateConfig(n_agents=3, n_rounds=2, seed=5, decision=decision)
    engine = DebateEngine(backend, config)
    protocol = RegulatedProtocol(policy, make_encoder("hashing"), config)
    return engine.run(QUESTIONS, protocol)


def run_protocol(protocol, decision: str = "last-round"):
    engine = DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=2, seed=5, decision=decision))
    return engine.run(QUESTIONS, protocol)


def test_sc_is_a_setting_of_the_extended_policy():
    policy = extended_policy(kinds_mode="fresh", stop_mode="never", behavior_mode="fixed", behavior_map="clip")
    mine = regulated(policy, "all-answers")
    theirs = run_protocol(SelfConsistencyProtocol(3, 9))
    for a, b in zip(theirs, mine):
        assert b.n_samples == 9 and b.trace.vote_counts == a.trace.vote_counts
        assert b.trace.final_score == a.trace.final_score


@pytest.mark.parametrize("agree,start", [(2, None), (3, None), (2, 1), (3, 1), (2, 2), (3, 2)])
def test_adaptive_sc_is_a_setting_of_the_extended_policy(agree, start):
    """From V (or `start`) samples, one fresh sample a round until `agree` answers agree: SamplingRuleProtocol's
    samples and votes (single CoT and adaptive SC started at 1 or 2 as settings of a policy that starts narrower)."""
    policy = extended_policy(kinds_mode="fresh-one", stop_mode="agree", stop_agree=agree / 3,
                             behavior_mode="fixed", behavior_map="clip")
    config = DebateConfig(n_agents=3, n_rounds=6, seed=5, decision="all-answers", start_width=start)
    mine = DebateEngine(FakeBackend(by_seed), config).run(
        QUESTIONS, RegulatedProtocol(policy, make_encoder("hashing"), config))
    rule = SamplingRuleProtocol(f"adaptive-sc-{agree}" + (f"-from-{start}" if start else ""), 3, 9)
    theirs = DebateEngine(FakeBackend(by_seed), rule.configure(config)).run(QUESTIONS, rule)
    assert len({d.n_samples for d in theirs}) > 1  # the stop is exercised at several sample counts
    for a, b in zip(theirs, mine):
        assert b.n_samples == a.n_samples and b.trace.vote_counts == a.trace.vote_counts
        # the same requests (a sample's seed is its index's, whichever agent draws it)
        assert sorted(t.seed for t in b.voters("all-answers")) == sorted(t.seed for t in a.voters("all-answers"))
        assert b.trace.final_score == a.trace.final_score


def test_mad_is_a_setting_of_the_extended_policy():
    policy = extended_policy(selection_mode="full", kinds_mode="revise", stop_mode="never",
                             behavior_mode="fixed", behavior_map="clip")
    mine = regulated(policy, "last-round")
    theirs = run_protocol(MADProtocol(3, 2))
    for a, b in zip(theirs, mine):
        assert [[(t.text, t.peers) for t in turns] for turns in b.trace.rounds] == \
            [[(t.text, t.peers) for t in turns] for turns in a.trace.rounds]
        assert b.trace.final_score == a.trace.final_score and len(b.trace.rounds) == 3


def test_round0_majority_is_a_setting_of_the_extended_policy():
    """A stop whose agreement threshold every vote meets: the debate ends before its first exchange."""
    policy = extended_policy(kinds_mode="revise", stop_mode="agree", stop_agree=0.0,
                             behavior_mode="fixed", behavior_map="clip")
    mine = regulated(policy, "last-round")
    theirs = run_protocol(MajorityProtocol())
    for a, b in zip(theirs, mine):
        assert len(b.trace.rounds) == 1 and b.trace.vote_counts == a.trace.vote_counts
        assert b.trace.final_score == a.trace.final_score


def test_mad_stop_is_a_setting_of_the_extended_policy():
    policy = extended_policy(selection_mode="full", kinds_mode="revise", stop_mode="agree", stop_agree=1.0,
                             behavior_mode="fixed", behavior_map="clip")
    mine = regulated(policy, "last-round")
    theirs = run_protocol(StopWhenUnanimousProtocol(3, 2))
    assert any(len(a.trace.rounds) < 3 for a in theirs)  # some debates stop: the rule is exercised
    for a, b in zip(theirs, mine):
        assert [[t.text for t in turns] for turns in b.trace.rounds] == [[t.text for t in turns]
                                                                         for turns in a.trace.rounds]
        assert b.trace.final_score == a.trace.final_score


def test_training_handles_early_stops(tmp_path):
    from train.config import load_config
    from train.runner import Trainer

    cfg = load_config("sim-stylised", ["run.iterations=2", "rollout.episodes_per_iter=32", "rollout.envs_per_worker=16", "env.actions=extended",
                                       "env.decision=all-answers", "logging.progress=false",
                                       f"run.out_dir={tmp_path}"])
    trainer = Trainer(cfg)
    try:
        result = trainer.train()
    finally:
        trainer.close()
    rows = [line for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    import json
    last = json.loads(rows[-1])
    assert 0.0 < last["synthetic/rollout/stop_rate"] < 1.0  # the neutral start stops about half the debates
    assert last["synthetic/rollout/fresh_share"] > 0.1

    # the trained policy exports and debates at inference with its actions and its vote rule
    from dear.export import export_checkpoint, load_exported
    from dear.infer import RegulatedDebater
    from dear.tasks import load

    exported = load_exported(export_checkpoint(result.run_dir, tmp_path / "policy"))
    assert exported.policy.config.actions == "extended" and exported.decision == "all-answers"
    assert exported.manifest["action"]["set"] == "extended"
    with RegulatedDebater(exported, llm="sim") as debater:
        results = debater.run(load("synthetic", split="test", n=16))
    decisions = [c for r in results for c in r.controls]
    assert decisions and all(len(c.kinds) == 3 and c.stop is not None for c in decisions)
    stopped = [r for r in results if len(r.trace.rounds) < 3]
    assert all(r.controls[-1].stop for r in stopped)


def test_a_regrade_votes_again_by_the_rule_the_trace_records():
    """A debate voted over every sample records that rule and is re-voted over every sample. A trace written before
    every rule was recorded is refused unless a rule is named for it, and is re-voted by the named rule (never one
    guessed from its stored vote); a trace that records its rule keeps it whatever is named."""
    from dataclasses import replace

    from dear.debate.regrade import MissingVoteRule, regrade_trace

    env = make_env(decision="all-answers")
    env.reset(seed=[1, 2, 3, 4])
    action = {"mask": np.ones((4, 6), np.int8), "behavior": np.zeros((4, 6), np.float32),
              "kinds": np.array([[2, 2, 2], [0, 0, 0], [1, 1, 1], [0, 1, 2]], np.int8),
              "stop": np.zeros(4, np.int8)}
    env.step(action)
    env.step(action)
    fresh = env.debates[0]
    for d in env.debates:
        assert d.trace.decision == "all-answers" and d.trace.to_dict()["decision"] == "all-answers"
        for named in (None, "last-round"):  # its own rule, whatever is named for traces that record none
            again = regrade_trace(d.trace, d.question, engine_seed=0, vote_rule=named)
            assert (again.vote_counts, again.final_score, again.decision) == \
                (d.trace.vote_counts, d.trace.final_score, "all-answers")
        old = replace(d.trace, decision=None)  # as written before every rule was recorded
        with pytest.raises(MissingVoteRule, match="records no vote rule"):
            regrade_trace(old, d.question, engine_seed=0)
        again = regrade_trace(old, d.question, engine_seed=0, vote_rule="all-answers")
        assert (again.vote_counts, again.final_score, again.decision) == \
            (d.trace.vote_counts, d.trace.final_score, "all-answers")
    # fresh samples add voters; the rule named for an unrecorded trace is the one it is re-voted by
    assert sum(fresh.trace.vote_counts.values()) == 9
    last = regrade_trace(replace(fresh.trace, decision=None), fresh.question, engine_seed=0, vote_rule="last-round")
    assert last.decision == "last-round" and sum(last.vote_counts.values()) <= 3
    env.close()
    with pytest.raises(ValueError, match="vote rule must be one of"):
        regrade_trace(fresh.trace, fresh.question, engine_seed=0, vote_rule="guess")
