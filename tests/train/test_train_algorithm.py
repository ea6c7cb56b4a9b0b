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
    # The hand-made batch perturbs the stored log-probs so that ratios start away from 1; only the joint behavior
    # ratio reads them (per_dim re-evaluates its old log-probs before its update), so these tests use the joint
    # one unless they ask otherwise (per_dim has its own tests below).
    happo.setdefault("behavior_ratio", "joint")
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


def _seed_giving(learner: HAPPO, order: tuple[str, str]) -> int:
    """A generator seed under which `learner.agent_order` yields `order` (so both orders are really tested)."""
    for seed in range(100):
        if tuple(learner.agent_order(torch.Generator().manual_seed(seed))) == order:
            return seed
    raise AssertionError(f"no seed in 0..99 gives the order {order}")


@pytest.mark.parametrize("agent_order, order", [
    ("fixed", ("selection", "behavior")),
    ("random", ("selection", "behavior")),
    ("random", ("behavior", "selection")),
])
def test_second_agent_uses_first_agents_ratio(agent_order, order):
    learner = _learner(agent_order=agent_order, norm_adv=True)
    batch = _batch(learner)
    adv = learner.advantages(batch).advantages  # critic is only updated after both actors
    adv = adv.reshape(-1)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    seed = _seed_giving(learner, order) if agent_order == "random" else 3
    assert tuple(learner.agent_order(torch.Generator().manual_seed(seed))) == order
    first, second = order
    with torch.no_grad():
        before = {a: getattr(learner.policy, a).state_dict() for a in order}
        before = {a: {k: v.clone() for k, v in sd.items()} for a, sd in before.items()}
    stats = learner.update(batch, torch.Generator().manual_seed(seed))
    assert stats[f"losses/{first}/update_position"] == 0.0 and stats[f"losses/{second}/update_position"] == 1.0
    f = learner.last_factors
    assert torch.equal(f[first], torch.ones_like(f[first]))  # first agent: plain PPO on Â
    with torch.no_grad():
        sel_new, _ = learner.policy.evaluate_selection(batch.flat("selection_obs"), batch.flat("pairs"))
        beh_new, _ = learner.policy.evaluate_behavior(batch.flat("behavior_obs"), batch.flat("raw_behavior"))
    new = {"selection": sel_new, "behavior": beh_new}
    old = {"selection": batch.flat("logp_selection"), "behavior": batch.flat("logp_behavior")}
    # M of the second agent = the FIRST agent's ratio new/old only (the second agent's own ratio is not in it).
    expected = torch.exp(new[first] - old[first])
    assert torch.allclose(f[second], expected, atol=1e-6)
    assert not torch.allclose(f[second], torch.exp(new[second] - old[second]), atol=1e-3)
    assert (expected - 1).abs().max() > 1e-3  # the first agent really moved, so M is not trivially 1
    for a in order:  # both agents were updated
        assert any(not torch.equal(v, getattr(learner.policy, a).state_dict()[k]) for k, v in before[a].items())
    # The second agent's reported surrogate is the clipped PPO loss on M·Â over the same batch.
    loss, _ = clipped_surrogate(new[second], old[second], expected * adv, learner.cfg.clip_coef)
    assert stats[f"losses/{second}/policy_loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert f[second].shape == (adv.numel(),)


def test_random_order_draws_both_orders():
    learner = _learner(agent_order="random")
    orders = {tuple(learner.agent_order(torch.Generator().manual_seed(s))) for s in range(20)}
    assert orders == {("selection", "behavior"), ("behavior", "selection")}


def _bernoulli_action_prob(logits: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    p = 1.0 / (1.0 + torch.exp(-logits.double()))
    return torch.where(pairs > 0.5, p, 1.0 - p)


def _gaussian_density(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    x, mean, std = x.double(), mean.double(), log_std.double().exp()
    return torch.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))


def test_joint_ratio_is_product_of_per_dimension_probability_ratios_and_clipped_as_one():
    """Each actor has ONE ratio per step: the product over its action dimensions of new/old probability
    ratios, computed here from the densities by hand (not from the policy's log-probs), and PPO clips that
    joint ratio as a whole, even where every per-dimension ratio lies inside [1 - eps, 1 + eps]."""
    torch.manual_seed(0)
    old_pol = JointPolicy(PolicyConfig(n_agents=V))
    new_pol = JointPolicy(PolicyConfig(n_agents=V))
    new_pol.load_state_dict(old_pol.state_dict())
    with torch.no_grad():
        new_pol.selection.net[-1].bias.add_(0.3)  # every pair ratio in [0.85, 1.15]
        new_pol.behavior.net[-1].bias.add_(torch.tensor([0.05, -0.05]))
    n = 64
    g = torch.Generator().manual_seed(1)
    obs = torch.rand(n, V * (2 * V + 1), generator=g)
    pairs = (torch.rand(n, V * (V - 1), generator=g) > 0.5).float()
    beh_obs = torch.rand(n, V, 2 * V + 2, generator=g)
    raw = old_pol.behavior(beh_obs).detach() + 0.3 * torch.randn(n, V, 2, generator=g)
    with torch.no_grad():
        per_pair = _bernoulli_action_prob(new_pol.selection(obs), pairs) / _bernoulli_action_prob(
            old_pol.selection(obs), pairs)
        per_dim = _gaussian_density(raw, new_pol.behavior(beh_obs), new_pol.behavior.log_std) / _gaussian_density(
            raw, old_pol.behavior(beh_obs), old_pol.behavior.log_std)
        lp_old = old_pol.evaluate_actions(obs, pairs, raw, behavior_obs=beh_obs)
        lp_new = new_pol.evaluate_actions(obs, pairs, raw, behavior_obs=beh_obs)
    for per, new_lp, old_lp in ((per_pair, lp_new.logp_selection, lp_old.logp_selection),
                                (per_dim.reshape(n, -1), lp_new.logp_behavior, lp_old.logp_behavior)):
        joint = per.prod(-1)
        assert torch.allclose(torch.exp(new_lp - old_lp).double(), joint, rtol=1e-4)
        _, diag = clipped_surrogate(new_lp, old_lp, torch.ones(n), clip_coef=0.2)
        assert diag["clipfrac"].item() == pytest.approx(((joint - 1).abs() > 0.2).double().mean().item())
    inside = ((per_pair - 1).abs() <= 0.2).all(-1)
    joint_sel = per_pair.prod(-1)
    assert bool((inside & ((joint_sel - 1).abs() > 0.2)).any())  # clipped jointly, not per pair
    assert bool((inside & ((joint_sel - 1).abs() <= 0.2)).any())  # and not everything is clipped


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def _overflowing_batch(learner: HAPPO) -> RolloutBatch:
    """A finite batch (passes check_finite) whose rewards are near float32's maximum, so un-normalised
    advantages times ratios, or squared value errors, overflow to inf inside the losses."""
    batch = _batch(learner)
    batch.rewards[:, -1] = 3e38
    return batch


@pytest.mark.parametrize("agent", ["selection", "behavior"])
def test_non_finite_policy_loss_raises_before_the_step(agent):
    learner = _learner(norm_adv=False)
    if agent == "behavior":  # the selection actor is fixed, so behavior is the one reaching its guard
        learner.policy.config.selection_mode = "full"
    batch = _overflowing_batch(learner)
    before = _params(getattr(learner.policy, agent))
    with pytest.raises(FloatingPointError, match=f"non-finite {agent} policy loss"):
        learner.update(batch, torch.Generator().manual_seed(0))
    after = dict(getattr(learner.policy, agent).named_parameters())
    assert all(torch.equal(v, after[k]) for k, v in before.items())  # raised before the optimiser step


def test_non_finite_value_loss_raises_before_the_step():
    learner = _learner(value_norm=False)
    # No trainable actor, so the update reaches the critic; its squared error overflows.
    learner.policy.config.selection_mode, learner.policy.config.behavior_mode = "full", "fixed"
    batch = _overflowing_batch(learner)
    before = _params(learner.critic)
    with pytest.raises(FloatingPointError, match="non-finite value loss"):
        learner.update(batch, torch.Generator().manual_seed(0))
    after = dict(learner.critic.named_parameters())
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_gae_terminal_episode():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.8]])
    dones = torch.tensor([[0.0, 1.0]])
    gae = compute_gae(rewards, values, dones, torch.tensor([123.0]), gamma=0.9, gae_lambda=0.5)
    adv, ret = gae.advantages, gae.returns
    assert gae.values is values
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


def test_mappo_updates_each_agent_on_the_plain_advantage():
    learner = _learner(algorithm="mappo")
    batch = _batch(learner)
    before = {k: v.clone() for k, v in _params(learner.policy).items()}
    learner.update(batch, torch.Generator().manual_seed(0))
    assert set(learner.last_factors) == {"selection", "behavior"}
    assert all(torch.equal(f, torch.ones_like(f)) for f in learner.last_factors.values())  # no HAPPO factor
    changed = {k.split(".")[0] for k, v in _params(learner.policy).items() if not torch.equal(v, before[k])}
    assert changed == {"selection", "behavior"}
    happo = _learner()
    happo.update(_batch(happo), torch.Generator().manual_seed(0))
    assert not torch.equal(happo.last_factors["behavior"], torch.ones_like(happo.last_factors["behavior"]))


def test_ppo_updates_both_actors_as_one_agent_on_the_joint_ratio():
    learner = _learner(algorithm="ppo")
    batch = _batch(learner)
    before = {k: v.clone() for k, v in _params(learner.policy).items()}
    stats = learner.update(batch, torch.Generator().manual_seed(0))
    assert list(learner.last_factors) == ["joint"] and "losses/joint/policy_loss" in stats
    changed = {k.split(".")[0] for k, v in _params(learner.policy).items() if not torch.equal(v, before[k])}
    assert changed == {"selection", "behavior"}


def test_per_dimension_behavior_ratios_clip_each_dimension_and_pass_on_the_joint_factor():
    learner = _learner(behavior_ratio="per_dim", agent_order="fixed")
    batch = _batch(learner)
    before = learner.policy.behavior.net[-1].bias.detach().clone()
    stats = learner.update(batch, torch.Generator().manual_seed(0))
    assert not torch.equal(learner.policy.behavior.net[-1].bias, before)
    assert math.isfinite(stats["losses/behavior/policy_loss"]) and 0 <= stats["losses/behavior/clipfrac"] <= 1
    lp, _ = learner.policy.evaluate_behavior(batch.flat("behavior_obs"), batch.flat("raw_behavior"), per_dim=True)
    joint, _ = learner.policy.evaluate_behavior(batch.flat("behavior_obs"), batch.flat("raw_behavior"))
    assert lp.shape == (batch.flat("raw_behavior").shape[0], 2 * V)
    assert torch.allclose(lp.sum(-1), joint, atol=1e-5)  # the dimensions' log-probs sum to the joint one
