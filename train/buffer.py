"""Rollout storage for one HAPPO iteration and GAE(gamma, lambda) from the shared critic.

Every debate has exactly R steps (one per exchange round), so a batch is a dense (E, R) grid of
transitions: E episodes x R steps, flattened to N = E*R for the update. A debate that failed (a backend request
gave up) ends early; the trainer removes its whole row (`select`) before the update, so the grid stays dense.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class RolloutBatch:
    """Transitions of E complete episodes of T steps, stored as (E, T, ...) tensors (float32)."""

    selection_obs: torch.Tensor  # (E, T, V(2V+1))
    pairs: torch.Tensor  # (E, T, V(V-1)) selection action
    behavior_obs: torch.Tensor  # (E, T, V, 2V+2) behavior input computed from the chosen mask
    raw_behavior: torch.Tensor  # (E, T, V, 2) behavior action (raw, pre-sigmoid)
    logp_selection: torch.Tensor  # (E, T) log-prob at rollout time (one joint ratio per agent)
    logp_behavior: torch.Tensor  # (E, T)
    state: torch.Tensor  # (E, T, S) critic input
    rewards: torch.Tensor  # (E, T)
    dones: torch.Tensor  # (E, T) 1 where the episode ended after this step

    @property
    def num_episodes(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_steps(self) -> int:
        return self.rewards.shape[1]

    @classmethod
    def concat(cls, parts: list["RolloutBatch"]) -> "RolloutBatch":
        return cls(**{f.name: torch.cat([getattr(p, f.name) for p in parts], 0) for f in fields(cls)})

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """The same batch on `device` (the learner's); tensors already there are shared, not copied."""
        return RolloutBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, keep: torch.Tensor) -> "RolloutBatch":
        """The episodes where the bool (E,) `keep` is True (e.g. the debates that did not fail)."""
        return RolloutBatch(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})

    def flat(self, name: str) -> torch.Tensor:
        x = getattr(self, name)
        return x.reshape(-1, *x.shape[2:])

    def check_finite(self) -> None:
        for f in fields(self):
            x = getattr(self, f.name)
            if not torch.isfinite(x).all():
                raise FloatingPointError(f"non-finite values in rollout field '{f.name}'")


@dataclass(frozen=True)
class Advantages:
    """GAE results of a batch, each (E, T): critic values V(s_t), advantages Â_t and returns Â_t + V(s_t)."""

    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> Advantages:
    """GAE over (E, T) grids. `values` are de-normalised V(s_t); `last_values` (E,) bootstraps after T.

    A done at step t cuts both the bootstrap V(s_{t+1}) and the recursion.
    """
    num_steps = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(num_steps)):
        next_values = last_values if t == num_steps - 1 else values[:, t + 1]
        not_done = 1.0 - dones[:, t]
        delta = rewards[:, t] + gamma * next_values * not_done - values[:, t]
        last_gae = delta + gamma * gae_lambda * not_done * last_gae
        advantages[:, t] = last_gae
    return Advantages(values=values, advantages=advantages, returns=advantages + values)
