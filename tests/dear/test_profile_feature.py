"""Mixed pools whose seating varies (issue 42 item 2): profiles seated per debate in a shuffled order, and the
optional profile feature that lets a policy see who is who."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.profiles import parse_profiles, without_backend
from dear.debate.trace import DebateTrace
from dear.policy import JointPolicy, PolicyConfig, behavior_obs_dim, profile_onehot, selection_obs_dim
from dear.regulator import RegulatedProtocol, observe
from dear.sim import SimBackend
from dear.tasks.synthetic import load_synthetic
from envs.debate_env import DebateEnv

POOL = ["cot", "cot", "direct:24"]


def test_profile_onehots_are_agent_major_and_unknown_names_are_refused():
    x = profile_onehot([["cot", "direct"], ["direct", "direct"]], ["cot", "direct"])
    assert x.tolist() == [[1, 0, 0, 1], [0, 1, 0, 1]]
    with pytest.raises(ValueError, match="'smoke:cot' is not one the policy knows.*\\['cot', 'direct'\\]"):
        profile_onehot([["cot", "smoke:cot"]], ["cot", "direct"])


def test_a_profile_name_without_its_backend():
    assert without_backend("local:direct:64") == "direct:64"
    assert without_backend("openai:http://h:8000/v1#m:cot") == "cot"
    assert without_backend("cot") == "cot" and without_backend("direct:24") == "direct:24"


def test_the_feature_widens_both_observations_and_the_behavior_sees_each_agents_own_profile():
    cfg = PolicyConfig(n_agents=3, profiles=("cot", "direct"))
    assert cfg.n_profiles == 2 and PolicyConfig(n_agents=3).n_profiles == 0
    assert selection_obs_dim(3, "paper", 2) == selection_obs_dim(3) + 6
    assert selection_obs_dim(3, "extended", 2) == selection_obs_dim(3, "extended") + 6
    assert behavior_obs_dim(3, 2) == behavior_obs_dim(3) + 2
    torch.manual_seed(0)
    policy = JointPolicy(cfg)
    b = torch.full((2, 3, 3), 0.2) * (1 - torch.eye(3))
    u = torch.full((2, 3), 0.6)  # b_i sums to 0.4: masses sum to 1
    onehots = profile_onehot([["cot", "direct", "cot"], ["direct", "cot", "cot"]], cfg.profiles)
    sel = torch.cat([torch.rand(2, selection_obs_dim(3)), onehots], -1)
    act = policy.act(sel, b, u)
    assert act.behavior_obs.shape == (2, 3, behavior_obs_dim(3, 2))
    assert act.behavior_obs[..., -2:].tolist() == onehots.reshape(2, 3, 2).tolist()
    # the update recomputes the same behavior input from the stored selection input and pairs
    again = policy._behavior_input(sel, b, u, act.pairs)
    assert torch.equal(again, act.behavior_obs)
    with pytest.raises(ValueError, match="distinct"):
        PolicyConfig(profiles=("cot", "cot"))
    assert PolicyConfig.from_dict(cfg.to_dict()).profiles == ("cot", "direct")


def test_the_engine_seats_profiles_in_a_given_order_and_the_trace_says_so():
    questions = load_synthetic(n=2, seed=0, split="test")
    engine = DebateEngine(SimBackend(seed=0), DebateConfig(n_agents=3, n_rounds=1, agent_profiles=POOL,
                                                           max_tokens=64))
    seated, plain = engine.start(questions, debate_seeds=[5, 6], pool_orders=[(2, 0, 1), None])
    assert [t.profile for t in seated.last_turns] == ["direct:24", "cot", "cot"]
    assert [t.max_tokens for t in seated.last_turns] == [24, 64, 64]
    assert seated.trace.pool_order == [2, 0, 1] and plain.trace.pool_order is None
    assert "pool_order" not in plain.trace.to_dict()  # traces in pool order are written as before
    assert DebateTrace.from_dict(json.loads(seated.trace.to_json())).pool_order == [2, 0, 1]
    with pytest.raises(ValueError, match="not a permutation"):
        engine.create(questions[:1], [5], pool_orders=[(0, 0, 1)])


def test_the_sim_gives_an_agent_the_skill_of_its_pool_seat():
    """skills [3, 3, -3]: the pool's third profile is the weak one, wherever it sits."""
    sim = SimBackend(seed=0, params={"skills": [3.0, 3.0, -3.0]})
    engine = DebateEngine(sim, DebateConfig(n_agents=3, n_rounds=0, agent_profiles=POOL))
    questions = load_synthetic(n=60, seed=0, split="test")
    debates = engine.start(questions, debate_seeds=list(range(60)), pool_orders=[(2, 0, 1)] * 60)
    accuracy = np.mean([[t.correct for t in d.last_turns] for d in debates], axis=0)
    assert accuracy[0] < 0.5 < accuracy[1] and accuracy[2] > 0.5


def test_the_env_shuffles_seats_without_moving_questions_and_observes_the_seated_profiles():
    kw = dict(llm="sim", n_agents=3, n_rounds=1, agent_profiles=POOL, behavior_map="clip")
    shuffled = DebateEnv(shuffle_profiles=True, profile_feature=True, **kw)
    plain = DebateEnv(**kw)
    assert shuffled.config.profile_vocabulary == ("cot", "direct:24")
    assert shuffled.observation_space["selection"].shape == (selection_obs_dim(3, "paper", 2),)
    orders = set()
    for seed in range(8):
        obs, _ = shuffled.reset(seed=seed)
        plain.reset(seed=seed)
        d = shuffled.debate
        assert d.question.id == plain.debate.question.id and d.seed == plain.debate.seed
        orders.add(d.pool_order)
        seated = [t.profile for t in d.last_turns]
        expected = profile_onehot([seated], shuffled.config.profile_vocabulary)[0].numpy()
        assert np.array_equal(obs["selection"][selection_obs_dim(3):], expected)
    assert len(orders) > 1
    with pytest.raises(ValueError, match="shuffle_profiles needs agent_profiles"):
        DebateEnv(llm="sim", shuffle_profiles=True)


def test_a_profile_policy_needs_profiles_it_knows_and_matches_them_without_their_backend():
    policy = JointPolicy(PolicyConfig(n_agents=3, profiles=("cot", "direct:24")))
    RegulatedProtocol(policy, encoder=None, config=DebateConfig(agent_profiles=parse_profiles(
        "local:cot,local:cot,local:direct:24")))
    with pytest.raises(ValueError, match="give the debate agent profiles"):
        RegulatedProtocol(policy, encoder=None, config=DebateConfig())
    with pytest.raises(ValueError, match="'direct' is not one the policy knows"):
        RegulatedProtocol(policy, encoder=None, config=DebateConfig(agent_profiles=parse_profiles(
            "cot,cot,direct")))


def test_observe_reads_the_profiles_from_the_turns():
    from dear.evidence import make_encoder

    engine = DebateEngine(SimBackend(seed=0), DebateConfig(n_agents=3, n_rounds=1, agent_profiles=POOL))
    (d,) = engine.start(load_synthetic(n=1, seed=0, split="test"), debate_seeds=[1], pool_orders=[(1, 2, 0)])
    obs = observe([d], make_encoder("hashing"), profile_vocabulary=("cot", "direct:24"))
    assert obs.profiles.tolist() == [[1, 0, 0, 1, 1, 0]]
    assert obs.selection_input().shape[-1] == selection_obs_dim(3, "paper", 2)
    (plain,) = DebateEngine(SimBackend(seed=0), DebateConfig(n_agents=3, n_rounds=1)).start(
        load_synthetic(n=1, seed=0, split="test"), debate_seeds=[1])
    with pytest.raises(ValueError, match="needs agent profiles"):
        observe([plain], make_encoder("hashing"), profile_vocabulary=("cot",))


def test_a_profile_policy_regulates_a_mixed_pool_on_the_smoke_model(tmp_path):
    """The real part: SmolLM2-135M through llama.cpp, the pool named on its backend (`smoke:cot`), the policy's
    vocabulary without one; the regulator observes each seat's profile."""
    from dear.export import export_policy
    from dear.infer import RegulatedDebater, make_question

    torch.manual_seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=3, profiles=("cot", "direct:24")))
    exported = export_policy(policy, tmp_path / "p", encoder="hashing", training={"n_rounds": 1, "llm": "sim"})
    seen = []
    with RegulatedDebater(exported, "smoke", agent_profiles=parse_profiles("direct:24,cot,cot"), max_tokens=24,
                          seed=0) as debater:
        act = debater.exported.policy.act
        debater.exported.policy.act = lambda sel, *a, **k: seen.append(sel.clone()) or act(sel, *a, **k)
        (result,) = debater.run([make_question("What is 12 + 30?", kind="integer")])
    assert [t.profile for t in result.trace.rounds[0]] == ["smoke:direct:24", "smoke:cot", "smoke:cot"]
    assert all(t.error is None for turns in result.trace.rounds for t in turns)
    (sel,) = seen
    assert sel[0, selection_obs_dim(3):].tolist() == [0, 1, 1, 0, 1, 0]


def test_the_debater_refuses_a_pool_the_policy_does_not_know_before_loading_a_model(tmp_path):
    from dear.export import export_policy
    from dear.infer import main

    exported = export_policy(JointPolicy(PolicyConfig(n_agents=3, profiles=("cot", "direct"))), tmp_path / "p",
                             encoder="hashing")
    with pytest.raises(ValueError, match="'direct:64' is not one the policy knows"):
        main(["--policy", str(exported), "--llm", "local", "--question", "1+1?", "--agent-profiles",
              "cot,cot,direct:64"])


def test_the_paper_actions_may_observe_the_decision_features():
    """`env.decision_features`: round / R and the vote's margin after the paper's features (an ablation of the
    learning suite; the extended actions always observe them)."""
    env = DebateEnv(llm="sim", n_agents=3, n_rounds=2, decision_features=True)
    obs, _ = env.reset(seed=0)
    assert obs["selection"].shape == (selection_obs_dim(3, "paper", 0, True),) == (selection_obs_dim(3) + 3,)
    assert obs["selection"][-3] == 0.0  # round 0 of 2
    policy = JointPolicy(PolicyConfig(n_agents=3, decision_features=True))
    act = policy.act(torch.tensor(obs["selection"])[None], torch.tensor(obs["belief"])[None],
                     torch.tensor(obs["uncertainty"])[None])
    obs, *_ = env.step({"mask": act.pairs[0].int().numpy(), "behavior": act.raw_behavior[0].reshape(-1).numpy()})
    assert obs["selection"][-3] == 0.5  # round 1 of 2
