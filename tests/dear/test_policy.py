"""Policies: layouts, closed-form log-probs/entropies, one ratio per joint action, baseline slots."""

import math

import numpy as np
import pytest
import torch

from dear.belief.dempster_shafer import fuse
from dear.belief.subjective_logic import Opinion, opinions
from dear.policy import (
    RAW_BOUND,
    BehaviorPolicy,
    Critic,
    JointPolicy,
    PolicyConfig,
    SelectionPolicy,
    behavior_obs_dim,
    behavior_observation,
    from_sampling,
    mask_to_pairs,
    pair_order,
    pairs_to_mask,
    selection_obs_dim,
    selection_observation,
    to_sampling,
)


def _beliefs(batch: int, v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    e = torch.rand(batch, v, v, generator=g)
    e = 0.5 * (e + e.transpose(1, 2))
    op = opinions(e)
    return op.b, op.u


@pytest.mark.parametrize("v", [2, 3, 5])
def test_pair_order_and_mask_roundtrip(v):
    order = pair_order(v)
    assert order == [(i, j) for i in range(v) for j in range(v) if j != i]
    pairs = torch.randint(0, 2, (4, v * (v - 1))).float()
    mask = pairs_to_mask(pairs, v)
    assert mask.shape == (4, v, v) and mask.dtype == torch.bool
    assert not torch.diagonal(mask, dim1=1, dim2=2).any()
    for k, (i, j) in enumerate(order):
        assert torch.equal(mask[:, i, j], pairs[:, k] > 0.5)
    assert torch.equal(mask_to_pairs(mask), pairs)


@pytest.mark.parametrize("v", [2, 3, 5])
def test_observation_layouts(v):
    b, u = _beliefs(3, v)
    sel = selection_observation(b, u)
    assert sel.shape == (3, selection_obs_dim(v)) == (3, v * (2 * v + 1))
    per_agent = sel.reshape(3, v, 2 * v + 1)
    assert torch.equal(per_agent[:, :, :v], b)
    assert torch.equal(per_agent[:, :, v], u)
    assert torch.equal(per_agent[:, :, v + 1 :], torch.eye(v).expand(3, v, v))
    mask = pairs_to_mask(torch.ones(3, v * (v - 1)), v)
    for rule in ("dst", "mean"):
        obs = behavior_observation(b, u, mask, rule=rule)
        assert obs.shape == (3, v, behavior_obs_dim(v)) == (3, v, 2 * v + 2)
        fused = fuse(Opinion(b, u), mask, rule=rule)  # same code path as the env and the export
        assert torch.allclose(obs[..., :v], fused.evidence)
        assert torch.allclose(obs[..., v], fused.u)
        assert torch.allclose(obs[..., v + 1], fused.conflict)
        assert torch.equal(obs[..., v + 2 :], torch.eye(v).expand(3, v, v))
    # the "mean" ablation carries no DST conflict; DST does on this full mesh
    assert torch.all(behavior_observation(b, u, mask, rule="mean")[..., v + 1] == 0)
    assert bool((behavior_observation(b, u, mask, rule="dst")[..., v + 1] > 0).all())
    # an agent that reads no one keeps its own opinion and has zero conflict
    none = behavior_observation(b, u, torch.zeros(3, v, v, dtype=torch.bool))
    assert torch.allclose(none[..., v], u) and torch.all(none[..., v + 1] == 0)


def test_selection_logprob_entropy_closed_form():
    v = 3
    pol = SelectionPolicy(v, hidden=16)
    torch.nn.init.normal_(pol.net[-1].weight, std=1.0)  # non-trivial probabilities
    b, u = _beliefs(5, v, seed=1)
    obs = selection_observation(b, u)
    dist = pol.distribution(obs)
    a = dist.sample()
    logits = pol(obs)
    p = torch.sigmoid(logits)
    manual_logp = (a * torch.log(p) + (1 - a) * torch.log(1 - p)).sum(-1)
    manual_ent = -(p * torch.log(p) + (1 - p) * torch.log(1 - p)).sum(-1)
    assert dist.log_prob(a).shape == (5,)
    assert torch.allclose(dist.log_prob(a), manual_logp, atol=1e-5)
    assert torch.allclose(dist.entropy(), manual_ent, atol=1e-5)


def test_behavior_logprob_entropy_closed_form():
    v = 4
    pol = BehaviorPolicy(v, hidden=16, log_std_init=-0.3)
    torch.nn.init.normal_(pol.net[-1].weight, std=1.0)
    b, u = _beliefs(6, v, seed=2)
    obs = behavior_observation(b, u, pairs_to_mask(torch.ones(6, v * (v - 1)), v))
    dist = pol.distribution(obs)
    x = dist.sample()
    assert x.shape == (6, v, 2)
    mu, log_std = pol(obs), pol.log_std
    sigma = log_std.exp()
    manual_logp = (-((x - mu) ** 2) / (2 * sigma**2) - log_std - 0.5 * math.log(2 * math.pi)).sum((-1, -2))
    manual_ent = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum() * v * torch.ones(6)
    assert dist.log_prob(x).shape == (6,)
    assert torch.allclose(dist.log_prob(x), manual_logp, atol=1e-4)
    assert torch.allclose(dist.entropy(), manual_ent, atol=1e-5)


def test_one_ratio_per_joint_action_not_kth_power():
    """The PPO ratio of the selection agent is prod_k r_k (one joint ratio), never (prod_k r_k)^k."""
    v = 3
    pol = JointPolicy(PolicyConfig(n_agents=v, selection_hidden=16, behavior_hidden=16))
    b, u = _beliefs(4, v, seed=3)
    sel = selection_observation(b, u)
    out = pol.act(sel, b, u)
    old_logits = pol.selection(sel).detach()
    with torch.no_grad():
        pol.selection.net[-1].bias.add_(0.3)
        pol.behavior.net[-1].bias.add_(0.2)
    ev = pol.evaluate_actions(sel, out.pairs, out.raw_behavior, behavior_obs=out.behavior_obs)
    ratio = torch.exp(ev.logp_selection - out.logp_selection)
    new_p, old_p = torch.sigmoid(pol.selection(sel)), torch.sigmoid(old_logits)
    a = out.pairs
    per_pair = torch.where(a > 0.5, new_p / old_p, (1 - new_p) / (1 - old_p))
    assert ratio.shape == (4,)
    assert torch.allclose(ratio, per_pair.prod(-1), rtol=1e-4)
    assert not torch.allclose(ratio, per_pair.prod(-1) ** per_pair.shape[-1], rtol=1e-3)
    # behavior: one ratio over all V agents x 2 dims
    ratio_b = torch.exp(ev.logp_behavior - out.logp_behavior)
    assert ratio_b.shape == (4,)
    # recompute the behavior obs from b, u and the stored mask -> identical log-probs
    ev2 = pol.evaluate_actions(sel, out.pairs, out.raw_behavior, b=b, u=u)
    assert torch.allclose(ev.logp_behavior, ev2.logp_behavior)


def test_act_matches_evaluate_and_gradients_flow():
    v = 3
    pol = JointPolicy(n_agents=v)
    b, u = _beliefs(8, v, seed=4)
    sel = selection_observation(b, u)
    out = pol.act(sel, b, u)
    assert out.mask.shape == (8, v, v) and out.pairs.shape == (8, v * (v - 1))
    assert out.raw_behavior.shape == (8, v, 2) and out.temperature.shape == (8, v)
    ev = pol.evaluate_actions(sel, out.pairs, out.raw_behavior, behavior_obs=out.behavior_obs)
    assert torch.allclose(ev.logp_selection, out.logp_selection, atol=1e-6)
    assert torch.allclose(ev.logp_behavior, out.logp_behavior, atol=1e-5)
    (ev.logp_selection.sum() + ev.logp_behavior.sum() + ev.entropy_behavior.sum()).backward()
    assert pol.selection.net[0].weight.grad is not None and pol.behavior.log_std.grad is not None
    env_action = out.env_action()
    assert env_action["mask"].shape == (8, v * (v - 1)) and env_action["behavior"].shape == (8, 2 * v)
    assert np.abs(env_action["behavior"]).max() <= RAW_BOUND


def test_deterministic_mode():
    v = 3
    pol = JointPolicy(n_agents=v)
    b, u = _beliefs(4, v, seed=5)
    sel = selection_observation(b, u)
    o1, o2 = pol.act(sel, b, u, deterministic=True), pol.act(sel, b, u, deterministic=True)
    assert torch.equal(o1.pairs, o2.pairs) and torch.equal(o1.raw_behavior, o2.raw_behavior)
    assert torch.equal(o1.pairs, (pol.selection(sel) > 0).float())
    assert torch.allclose(o1.raw_behavior, pol.behavior(o1.behavior_obs))
    # the mean starts at the MAD sampling (T=0.7, top-p=0.9) up to the tiny output init
    assert torch.allclose(o1.temperature, torch.full_like(o1.temperature, 0.7), atol=0.05)
    assert torch.allclose(o1.top_p, torch.full_like(o1.top_p, 0.9), atol=0.05)


def test_baseline_slots():
    v = 3
    b, u = _beliefs(200, v, seed=6)
    sel = selection_observation(b, u)
    mad = JointPolicy(
        PolicyConfig(
            n_agents=v, selection_mode="full", behavior_mode="fixed", fixed_temperature=0.7, fixed_top_p=0.9
        )
    )
    out = mad.act(sel, b, u)
    assert out.mask.sum() == 200 * v * (v - 1)
    assert torch.allclose(out.temperature, torch.tensor(0.7)) and torch.allclose(out.top_p, torch.tensor(0.9))
    assert torch.all(out.logp_selection == 0) and torch.all(out.logp_behavior == 0)
    assert not mad.selection_trainable and not mad.behavior_trainable
    rnd = JointPolicy(PolicyConfig(n_agents=v, selection_mode="random", seed=7))
    a = rnd.act(sel, b, u).pairs
    assert 0.4 < a.mean() < 0.6
    rnd.reseed(7)
    assert torch.equal(rnd.act(sel, b, u).pairs, a)  # seeded
    assert torch.allclose(rnd.act(sel, b, u).logp_selection, torch.full((200,), v * (v - 1) * math.log(0.5)))
    mean = JointPolicy(PolicyConfig(n_agents=v, fusion="mean"))
    out_mean = mean.act(sel, b, u, deterministic=True)
    assert torch.allclose(out_mean.behavior_obs, behavior_observation(b, u, out_mean.mask, rule="mean"))
    with pytest.raises(ValueError, match="selection_mode"):
        PolicyConfig(selection_mode="everyone")
    with pytest.raises(ValueError, match="fusion"):
        PolicyConfig(fusion="max")
    assert PolicyConfig.from_dict(PolicyConfig(n_agents=5).to_dict()) == PolicyConfig(n_agents=5)


def test_sampling_mapping_hits_bounds():
    t_range, p_range = (0.1, 1.2), (0.5, 1.0)
    raw = torch.tensor([[-RAW_BOUND, -RAW_BOUND], [0.0, 0.0], [RAW_BOUND, RAW_BOUND]])
    s = to_sampling(raw, t_range, p_range)
    assert torch.allclose(s.temperature, torch.tensor([0.1, 0.65, 1.2]), atol=1e-4)
    assert torch.allclose(s.top_p, torch.tensor([0.5, 0.75, 1.0]), atol=1e-4)
    s_np = to_sampling(np.array([[-1e6, 1e6]]), t_range, p_range)  # numpy path: no overflow
    assert np.allclose(s_np.temperature, 0.1) and np.allclose(s_np.top_p, 1.0)
    zt, zp = from_sampling(0.7, 0.9, t_range, p_range)
    back = to_sampling(torch.tensor([zt, zp]), t_range, p_range)
    assert abs(float(back.temperature) - 0.7) < 1e-6 and abs(float(back.top_p) - 0.9) < 1e-6
    with pytest.raises(ValueError, match="temperature"):
        from_sampling(1.5, 0.9, t_range, p_range)


def test_critic_and_bad_shapes():
    critic = Critic(state_dim=19, hidden=32)
    assert critic(torch.zeros(7, 19)).shape == (7,)
    with pytest.raises(ValueError, match="critic state"):
        critic(torch.zeros(7, 18))
    with pytest.raises(ValueError, match="selection obs"):
        SelectionPolicy(3)(torch.zeros(2, 20))
    with pytest.raises(ValueError, match="pairs"):
        pairs_to_mask(torch.zeros(2, 5), 3)


def test_running_norm_matches_batch_statistics_and_is_saved():
    from dear.policy import RunningNorm, SelectionPolicy

    torch.manual_seed(0)
    x = torch.randn(300, 4, dtype=torch.float64) * torch.tensor([0.02, 1.0, 5.0, 0.0]) + 0.17
    norm = RunningNorm(4)
    assert torch.equal(norm(x.float()), x.float())  # identity before any statistics
    for part in torch.tensor_split(x, 3):  # parallel Welford == one pass over all rows
        norm.update(part)
    assert torch.allclose(norm.mean, x.mean(0)) and torch.allclose(norm.var, x.var(0, unbiased=False))
    z = norm(x.float())
    assert torch.allclose(z[:, :3].std(0, unbiased=False), torch.ones(3), atol=1e-3)
    assert torch.all(z[:, 3] == 0)  # a constant feature (e.g. a one-hot slot) maps to 0, never NaN/inf
    # the statistics are buffers: saved with the weights and restored by load_state_dict
    pol = SelectionPolicy(3)
    pol.obs_norm.update(torch.rand(10, pol.obs_dim))
    fresh = SelectionPolicy(3)
    fresh.load_state_dict(pol.state_dict())
    obs = torch.rand(5, pol.obs_dim)
    assert torch.equal(fresh(obs), pol(obs))
