"""HAPPO update (Kuba et al., ICLR 2022) for DEAR's two heterogeneous agents and their shared critic.

Per iteration the agents are updated one after another (default: selection, then behavior, because
behavior acts on the chosen topology). The first agent maximises the clipped PPO objective on the
normalised advantage Â; every later agent maximises it on M·Â, where M is the product of the
already-updated agents' probability ratios new/old over the same batch (detached). Each agent has
ONE joint action per step (all pairs / all V LLM agents together), so each contributes one ratio.

Two ablations share the code (`happo.algorithm`): "mappo" updates the agents one after another without the
factor (M = 1 for every agent: each maximises the clipped objective on Â alone, as MAPPO's independent
ratios), and "ppo" treats the two as one agent with the joint ratio π_sel·π_beh, one clip and one step of
both optimisers (single-agent PPO on the joint action).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from dear.policy import Critic, JointPolicy
from train.buffer import Advantages, RolloutBatch, compute_gae
from train.group_baseline import group_centred
from train.config import HAPPOConfig
from train.valuenorm import ValueNorm

AGENTS = ("selection", "behavior")
ALGORITHMS = ("happo", "mappo", "ppo")


@dataclass
class AgentSpec:
    """How the trainer sees one RL agent: its parameters, stored log-probs and an evaluator."""

    name: str
    module: nn.Module
    old_logp: torch.Tensor  # (N,) log-probs at rollout time
    evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # idx -> (logp (n,), entropy (n,))
    ent_coef: float
    optimizers: tuple[str, ...] = ()  # the optimizers it steps (default: the one named like the agent)
    per_dim: bool = False  # `evaluate` gives (n, D) log-probs: one clipped ratio per action dimension


def joint_agent(agents: list[AgentSpec]) -> AgentSpec:
    """Several agents as one (single-agent PPO): summed log-probs (the joint ratio), entropies weighted by each
    agent's coefficient, every member's parameters and optimizer."""

    def evaluate(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = [a.evaluate(idx) for a in agents]
        return sum(lp for lp, _ in out), sum(a.ent_coef * ent for a, (_, ent) in zip(agents, out))

    return AgentSpec("joint", nn.ModuleList([a.module for a in agents]), sum(a.old_logp for a in agents), evaluate,
                     1.0, tuple(a.name for a in agents))


def happo_factor(new_logps: list[torch.Tensor], old_logps: list[torch.Tensor]) -> torch.Tensor:
    """M = prod_k pi_k^new(a_k|o_k) / pi_k^old(a_k|o_k) over previously updated agents (1 when none)."""
    if not new_logps:
        raise ValueError("happo_factor needs at least one agent's log-probs")
    log_m = sum((n - o for n, o in zip(new_logps, old_logps)), torch.zeros_like(new_logps[0]))
    return torch.exp(log_m).detach()


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, weighted_adv: torch.Tensor, clip_coef: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CleanRL's clipped PPO loss on a (possibly factor-weighted) advantage; plus KL/clip diagnostics.
    (n, D) log-probs (one ratio per action dimension) give the sum over dimensions of their clipped losses, so
    each dimension is pushed as hard as the joint ratio would push it, with its own clip."""
    logratio = logp - old_logp
    ratio = logratio.exp()
    pg1 = -weighted_adv * ratio
    pg2 = -weighted_adv * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    per_sample = torch.max(pg1, pg2)
    loss = (per_sample.sum(-1) if per_sample.dim() > 1 else per_sample).mean()
    with torch.no_grad():
        diag = {
            "approx_kl": ((ratio - 1) - logratio).mean(),
            "old_approx_kl": (-logratio).mean(),
            "clipfrac": ((ratio - 1.0).abs() > clip_coef).float().mean(),
        }
    return loss, diag


def explained_variance(y_pred: torch.Tensor, y_true: torch.Tensor) -> float:
    var_y = torch.var(y_true)
    return float("nan") if var_y == 0 else float(1 - torch.var(y_true - y_pred) / var_y)


def resolve_device(device: str | torch.device) -> torch.device:
    """`run.device`: "auto" = CUDA when present, else CPU; otherwise any torch device string ("cuda:1")."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"run.device: {device!r} is not a torch device (use auto, cpu, cuda or cuda:N)") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"run.device: {device!r} but torch.cuda.is_available() is False; use run.device=auto or cpu")
    return resolved


class HAPPO:
    """Learner state: the joint policy, the critic, their optimisers and the value normaliser.

    Everything the update touches lives on `device` (networks and their input-normaliser buffers, value
    normaliser, Adam moments, the batch); rollouts stay on CPU and get CPU copies of the weights.
    """

    def __init__(self, policy: JointPolicy, critic: Critic, cfg: HAPPOConfig, device: str | torch.device = "cpu"):
        self.device = resolve_device(device)
        # Modules move before the optimisers are built, so the optimisers hold the device parameters.
        self.policy, self.critic, self.cfg = policy.to(self.device), critic.to(self.device), cfg
        self.value_norm = ValueNorm().to(self.device)
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            "selection": torch.optim.Adam(policy.selection.parameters(), lr=cfg.lr_selection, eps=1e-5),
            "behavior": torch.optim.Adam(policy.behavior.parameters(), lr=cfg.lr_behavior, eps=1e-5),
            "critic": torch.optim.Adam(critic.parameters(), lr=cfg.lr_critic, eps=1e-5),
        }
        # M used for each agent in the last update (kept for tests and diagnostics).
        self.last_factors: dict[str, torch.Tensor] = {}

    def set_lr_fraction(self, frac: float) -> None:
        """Every optimiser's learning rate = frac × its configured one (CleanRL's linear annealing)."""
        base = {"selection": self.cfg.lr_selection, "behavior": self.cfg.lr_behavior, "critic": self.cfg.lr_critic}
        for name, opt in self.optimizers.items():
            for group in opt.param_groups:
                group["lr"] = frac * base[name]

    # -- values ------------------------------------------------------------------------------------
    @torch.no_grad()
    def values(self, state: torch.Tensor) -> torch.Tensor:
        """De-normalised V(s) for any leading shape."""
        v = self.critic(state.to(self.device))
        return self.value_norm.denormalize(v) if self.cfg.value_norm else v

    def advantages(self, batch: RolloutBatch) -> Advantages:
        """Values, advantages and returns, each (E, T); episodes are complete, so no bootstrap value. Debates in
        groups (rollout.group_size > 1) get advantages centred on their group's others (train/group_baseline.py);
        the returns the critic learns stay GAE's."""
        values = self.values(batch.state)
        last = torch.zeros_like(values[:, -1])
        gae = compute_gae(batch.rewards, values, batch.dones, last, self.cfg.gamma, self.cfg.gae_lambda)
        if batch.group is None:  # a batch saved before groups existed
            return gae
        return replace(gae, advantages=group_centred(gae.advantages, batch.group, batch.valid))

    # -- update ------------------------------------------------------------------------------------
    def agent_order(self, generator: torch.Generator) -> list[str]:
        trainable = [a for a in AGENTS if getattr(self.policy, f"{a}_trainable")]
        if self.cfg.agent_order == "random" and len(trainable) > 1:
            perm = torch.randperm(len(trainable), generator=generator).tolist()
            trainable = [trainable[i] for i in perm]
        return trainable

    def _agents(self, batch: RolloutBatch, rows: torch.Tensor) -> dict[str, AgentSpec]:
        """The RL agents over the batch's valid steps `rows` (flattened indices)."""
        def flat(name: str) -> torch.Tensor | None:
            x = batch.flat(name)
            return None if x is None else x[rows]

        sel_obs, pairs, kinds, stop = flat("selection_obs"), flat("pairs"), flat("kinds"), flat("stop")
        beh_obs, raw, active = flat("behavior_obs"), flat("raw_behavior"), flat("behavior_active")
        # per-dimension ratios for the behavior agent (single-agent PPO keeps one joint ratio)
        per_dim = self.cfg.behavior_ratio == "per_dim" and self.cfg.algorithm != "ppo"

        def at(x: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
            return None if x is None else x[idx]

        return {
            "selection": AgentSpec(
                "selection", self.policy.selection, flat("logp_selection"),
                lambda idx: self.policy.evaluate_selection(sel_obs[idx], pairs[idx], at(kinds, idx), at(stop, idx)),
                self.cfg.ent_coef_selection,
            ),
            "behavior": AgentSpec(
                "behavior", self.policy.behavior, flat("logp_behavior"),
                lambda idx: self.policy.evaluate_behavior(beh_obs[idx], raw[idx], per_dim, at(active, idx)),
                self.cfg.ent_coef_behavior, per_dim=per_dim,
            ),
        }

    def _minibatches(self, n: int, generator: torch.Generator):
        # The permutation comes from the CPU generator, so the minibatches are the same on every device.
        perm = torch.randperm(n, generator=generator)
        return torch.tensor_split(perm, self.cfg.num_minibatches)

    def update(self, batch: RolloutBatch, generator: torch.Generator) -> dict[str, float]:
        """One HAPPO iteration on a complete-episode batch. Returns CleanRL-named scalars."""
        cfg = self.cfg
        batch.check_finite()
        batch = batch.to(self.device)
        gae = self.advantages(batch)
        rows = batch.valid_rows()  # steps a debate took: an early stop leaves no-op steps behind it
        adv, returns, values = (x.reshape(-1)[rows] for x in (gae.advantages, gae.returns, gae.values))
        if cfg.norm_adv and adv.numel() > 1:
            # Normalised once over the whole batch (as HARL), so every agent sees the same Â.
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        n = adv.numel()
        stats: dict[str, float] = {}
        agents = self._agents(batch, rows)
        factor = torch.ones(n, device=self.device)
        self.last_factors = {}
        order = self.agent_order(generator)
        if cfg.algorithm == "ppo" and len(order) > 1:
            agents["joint"] = joint_agent([agents[name] for name in order])
            order = ["joint"]
        for position, name in enumerate(order):
            agent = agents[name]
            self.last_factors[name] = factor.clone()
            weighted_adv = factor * adv
            old_logp = agent.old_logp
            if agent.per_dim:  # per-dimension log-probs before this agent's update: the rollout's, per dimension
                with torch.no_grad():
                    old_logp = agent.evaluate(torch.arange(n, device=self.device))[0]
                weighted_adv = weighted_adv.unsqueeze(-1)
            epochs_run, grad_norm = self._fit_agent(agent, name, old_logp, weighted_adv, n, generator)
            # Diagnostics and the next agent's factor on the full batch under the updated policy.
            with torch.no_grad():
                all_idx = torch.arange(n, device=self.device)
                new_logp, entropy = agent.evaluate(all_idx)
                pg_loss, diag = clipped_surrogate(new_logp, old_logp, weighted_adv, cfg.clip_coef)
                if agent.per_dim:  # the next agent's factor is the joint ratio
                    new_logp, old_logp = new_logp.sum(-1), old_logp.sum(-1)
                if cfg.algorithm == "happo":  # MAPPO: every agent on Â alone
                    factor = factor * happo_factor([new_logp], [old_logp])
            p = f"losses/{name}/"
            stats.update({
                p + "policy_loss": pg_loss.item(),
                p + "entropy": entropy.mean().item(),
                p + "approx_kl": diag["approx_kl"].item(),
                p + "old_approx_kl": diag["old_approx_kl"].item(),
                p + "clipfrac": diag["clipfrac"].item(),
                p + "grad_norm": float(grad_norm),
                p + "epochs": float(epochs_run),
                p + "update_position": float(position),
                p + "happo_factor_mean": self.last_factors[name].mean().item(),
            })
        stats.update(self._update_critic(batch.flat("state")[rows], returns, values, generator))
        stats["losses/explained_variance"] = explained_variance(values, returns)
        if cfg.obs_norm:
            # After the update, so the next rollout and its PPO ratios use the same statistics.
            self.policy.selection.obs_norm.update(batch.flat("selection_obs")[rows])
            self.policy.behavior.obs_norm.update(batch.flat("behavior_obs")[rows])
            self.critic.obs_norm.update(batch.flat("state")[rows])
        stats["charts/advantage_std_raw"] = float(
            (returns - values).std().item()) if n > 1 else 0.0
        return stats

    def _fit_agent(self, agent: AgentSpec, name: str, old_logp: torch.Tensor, weighted_adv: torch.Tensor, n: int,
                   generator: torch.Generator) -> tuple[int, float]:
        """One agent's clipped-surrogate epochs over minibatches (stopping early past `target_kl`); returns the
        epochs run and the last gradient norm."""
        cfg = self.cfg
        opts = [self.optimizers[k] for k in (agent.optimizers or (name,))]
        params = list(agent.module.parameters())
        epochs_run, grad_norm = 0, 0.0
        for _epoch in range(cfg.update_epochs):
            epochs_run += 1
            kls = []
            for idx in self._minibatches(n, generator):
                idx = idx.to(self.device)
                logp, entropy = agent.evaluate(idx)
                pg_loss, diag = clipped_surrogate(logp, old_logp[idx], weighted_adv[idx], cfg.clip_coef)
                loss = pg_loss - agent.ent_coef * entropy.mean()
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite {name} policy loss ({loss.item()})")
                for opt in opts:
                    opt.zero_grad()
                loss.backward()
                grad_norm = float(nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
                for opt in opts:
                    opt.step()
                self._bound_behavior_std(agent)
                kls.append(diag["approx_kl"])
            if cfg.target_kl is not None and torch.stack(kls).mean() > cfg.target_kl:
                break
        return epochs_run, grad_norm

    def _bound_behavior_std(self, agent: AgentSpec) -> None:
        if self.cfg.log_std_max is not None and "behavior" in (agent.optimizers or (agent.name,)):
            self.policy.behavior.bound_log_std_(self.cfg.log_std_max)

    def _update_critic(self, state: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       generator: torch.Generator) -> dict[str, float]:
        cfg = self.cfg
        state = state.to(self.device)
        if cfg.value_norm:
            self.value_norm.update(returns)
            target = self.value_norm.normalize(returns)
            old_v = self.value_norm.normalize(values)
        else:
            target, old_v = returns, values
        opt = self.optimizers["critic"]
        for _epoch in range(cfg.update_epochs):
            for idx in self._minibatches(returns.numel(), generator):
                idx = idx.to(self.device)
                v = self.critic(state[idx])
                if cfg.clip_vloss:
                    v_clipped = old_v[idx] + torch.clamp(v - old_v[idx], -cfg.clip_coef, cfg.clip_coef)
                    v_loss = 0.5 * torch.max((v - target[idx]) ** 2, (v_clipped - target[idx]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((v - target[idx]) ** 2).mean()
                if not torch.isfinite(v_loss):
                    raise FloatingPointError(f"non-finite value loss ({v_loss.item()})")
                opt.zero_grad()
                (cfg.vf_coef * v_loss).backward()
                nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                opt.step()
        return {"losses/value_loss": v_loss.item()}

    # -- state -------------------------------------------------------------------------------------
    def optimizer_state(self) -> dict:
        """Adam states with every tensor copied to CPU, so a checkpoint loads on any machine."""
        return {k: _to_cpu(o.state_dict()) for k, o in self.optimizers.items()}

    def load_optimizer_state(self, state: dict) -> None:
        """torch's `Optimizer.load_state_dict` casts the moments to each parameter's device (`step` stays
        a CPU scalar, as torch keeps it), so a CPU checkpoint resumes on `self.device`."""
        for k, o in self.optimizers.items():
            o.load_state_dict(state[k])


def _to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    return tree
