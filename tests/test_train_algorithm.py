"""HAPPO update: the sequential factor M, one joint ratio per agent, GAE, value normalisation."""

import math

import pytest
import torch

from dear.policy import Critic, JointPolicy, PolicyConfig
from dear.regulator import state_dim
from train.algorithm import HAPPO, clipped_surrogate, happo_factor
from train.buffer import RolloutBatch, compute_gae
from train.config import HAPPOConfig
from train.valuenorm import ValueNorm

V = 3


def _learner(**happo):
    torch.manual_seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=V))
    critic = Critic(state_dim(V), 32)
    cfg = HAPPOConfig(update_epochs=2, num_minibatches=1, lr_selection=0.05, lr_behavior=0.05, **happo)
    return HAPPO(policy, critic, cfg)


def _batch(learner: HAPPO, episodes=6, steps=2, seed=1) -> RolloutBatch:
    """Hand-made batch: random observations/actions; old log-probs from the current policy, perturbed so
    ratios start away from 1, rewards that make the advantages non-trivial."""
    g = torch.Generator().manual_seed(seed)
    e, t = episodes, steps
    sel_obs = torch.rand(e, t, V * (2 * V + 1), generator=g)
    pairs = (torch.rand(e, t, V * (V - 1), generator=g) > 0.5).float()
    beh_obs = torch.rand(e, t, V, 2 * V + 2, generator=g)
    raw = torch.randn(e, t, V, 2, generator=g)
    with torch.no_grad():
        lp_s, _ = learner.policy.evaluate_selection(sel_obs.reshape(e * t, -1), pairs.reshape(e * t, -1))
        lp_b, _ = learner.policy.evaluate_behavior(beh_obs.reshape(e * t, V, -1), raw.reshape(e * t, V, 2))
    dones = torch.zeros(e, t)
    dones[:, -1] = 1
    rewards = torch.zeros(e, t)
    rewards[:, -1] = (torch.rand(e, generator=g) > 0.5).float()
    return RolloutBatch(
        selection_obs=sel_obs, pairs=pairs, behavior_obs=beh_obs, raw_behavior=raw,
        logp_selection=lp_s.reshape(e, t) + 0.05 * torch.randn(e, t, generator=g),
        logp_behavior=lp_b.reshape(e, t) + 0.05 * torch.randn(e, t, generator=g),
        state=torch.rand(e, t, state_dim(V), generator=g), rewards=rewards, dones=dones,
    )


def test_happo_factor_is_product_of_previous_ratios():
    new = [torch.tensor([0.1, -0.2, 0.3]), torch.tensor([0.0, 0.5, -0.1])]
    old = [torch.tensor([0.0, 0.0, 0.1]), torch.tensor([0.2, 0.1, 0.1])]
    expected = torch.exp(new[0] - old[0]) * torch.exp(new[1] - old[1])
    assert torch.allclose(happo_factor(new, old), expected)
    assert not happo_factor([new[0].requires_grad_()], [old[0]]).requires_grad  # detached


@pytest.mark.parametrize("order", ["fixed", "random"])
def test_second_agent_uses_first_agents_ratio(order):
    learner = _learner(agent_order=order, norm_adv=True)
    batch = _batch(learner)
    _, adv, _ = learner.advantages(batch)  # critic is only updated after both actors
    adv = adv.reshape(-1)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    gen = torch.Generator().manual_seed(3)
    first, second = learner.agent_order(torch.Generator().manual_seed(3))
    stats = learner.update(batch, gen)
    f = learner.last_factors
    assert torch.equal(f[first], torch.ones_like(f[first]))  # first agent: plain PPO on Â
    n = adv.numel()
    with torch.no_grad():
        sel_new, _ = learner.policy.evaluate_selection(batch.flat("selection_obs"), batch.flat("pairs"))
        beh_new, _ = learner.policy.evaluate_behavior(batch.flat("behavior_obs"), batch.flat("raw_behavior"))
    new = {"selection": sel_new, "behavior": beh_new}
    old = {"selection": batch.flat("logp_selection"), "behavior": batch.flat("logp_behavior")}
    expected = torch.exp(new[first] - old[first])
    assert torch.allclose(f[second], expected, atol=1e-6)
    assert (expected - 1).abs().max() > 1e-3  # the first agent really moved, so M is not trivially 1
    # The second agent's reported surrogate is the clipped PPO loss on M·Â over the same batch.
    loss, _ = clipped_surrogate(new[second], old[second], expected * adv, learner.cfg.clip_coef)
    assert stats[f"losses/{second}/policy_loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert f[second].shape == (n,)


def test_bernoulli_joint_ratio_is_one_ratio():
    """Selection has one joint log-prob (sum over pairs) -> ONE ratio per step, which is clipped as a whole.
    Per-pair ratios of 1.1 each (inside the clip range) give a joint ratio 1.1^6 ≈ 1.77 that must be clipped;
    the product of per-dimension ratios must not be raised to a further power."""
    torch.manual_seed(0)
    pol = JointPolicy(PolicyConfig(n_agents=V))
    obs = torch.rand(5, V * (2 * V + 1))
    pairs = (torch.rand(5, V * (V - 1)) > 0.5).float()
    dist = pol.selection.distribution(obs)
    joint = dist.log_prob(pairs)
    assert joint.shape == (5,)
    per_pair = torch.distributions.Bernoulli(logits=pol.selection(obs)).log_prob(pairs)
    assert torch.allclose(joint, per_pair.sum(-1))
    old = joint - V * (V - 1) * math.log(1.1)  # every pair's ratio is 1.1
    ratio = torch.exp(joint - old)
    assert torch.allclose(ratio, torch.full((5,), 1.1 ** (V * (V - 1))), rtol=1e-5)
    _, diag = clipped_surrogate(joint, old, torch.ones(5), clip_coef=0.2)
    assert diag["clipfrac"].item() == 1.0  # the joint ratio is clipped although each pair's is inside


def test_gae_terminal_episode():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.8]])
    dones = torch.tensor([[0.0, 1.0]])
    adv, ret = compute_gae(rewards, values, dones, torch.tensor([123.0]), gamma=0.9, gae_lambda=0.5)
    d1 = 1.0 - 0.8  # terminal: no bootstrap from last_values
    d0 = 0.0 + 0.9 * 0.8 - 0.5
    assert torch.allclose(adv, torch.tensor([[d0 + 0.9 * 0.5 * d1, d1]]))
    assert torch.allclose(ret, adv + values)


def test_valuenorm_matches_running_statistics():
    vn = ValueNorm()
    xs = [torch.randn(17) * 3 + 2, torch.randn(5) - 1, torch.randn(40)]
    for x in xs:
        vn.update(x)
    allx = torch.cat(xs).double()
    assert vn.mean.item() == pytest.approx(allx.mean().item(), abs=1e-9)
    assert vn.var.item() == pytest.approx(allx.var(unbiased=False).item(), abs=1e-9)
    y = torch.randn(8)
    assert torch.allclose(vn.denormalize(vn.normalize(y)), y, atol=1e-6)


def test_update_improves_value_fit_and_reports_cleanrl_names():
    learner = _learner()
    batch = _batch(learner, episodes=32)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        stats = learner.update(batch, gen)
    for agent in ("selection", "behavior"):
        for k in ("policy_loss", "entropy", "approx_kl", "clipfrac"):
            assert math.isfinite(stats[f"losses/{agent}/{k}"])
    assert stats["losses/explained_variance"] > 0.3


def test_target_kl_stops_epochs_early():
    learner = _learner(target_kl=1e-9)
    learner.cfg.update_epochs = 10
    stats = learner.update(_batch(learner), torch.Generator().manual_seed(0))
    assert stats["losses/selection/epochs"] == 1.0 and stats["losses/behavior/epochs"] == 1.0


def test_nan_loss_raises():
    learner = _learner()
    batch = _batch(learner)
    batch.state[0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="state"):
        learner.update(batch, torch.Generator().manual_seed(0))
