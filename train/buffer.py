"""Rollout storage for one HAPPO iteration and GAE(gamma, lambda) from the shared critic.

A batch is a dense (E, R) grid of transitions: E episodes x R steps (one per exchange round), flattened to
N = E*R for the update. A debate that failed (a backend request gave up) ends early; the trainer removes its whole
row (`select`) before the update. With the extended action set a debate may stop early: its later steps stay in
the grid as no-ops with `valid` = 0, and the update uses only the valid steps (`valid_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

# Fields of the extended action set: None in batches of the paper's actions (and in chunks saved before them).
EXTENDED_FIELDS = ("kinds", "stop", "behavior_active", "valid")


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
    kinds: torch.Tensor | None = None  # (E, T, V) turn kind per agent (dear.policy.KINDS index)
    stop: torch.Tensor | None = None  # (E, T) 1 where the debate stopped before this round
    behavior_active: torch.Tensor | None = None  # (E, T, V) 1 where the agent's (T, top-p) acted
    valid: torch.Tensor | None = None  # (E, T) 1 for steps the debate actually took (0 after a stop)
    group: torch.Tensor | None = None  # (E,) debates with one id share question and seed (rollout.group_size)

    def _map(self, fn) -> "RolloutBatch":
        return RolloutBatch(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                               for f in fields(self)})

    @property
    def num_episodes(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_steps(self) -> int:
        return self.rewards.shape[1]

    @property
    def extended(self) -> bool:
        return self.kinds is not None

    @classmethod
    def concat(cls, parts: list["RolloutBatch"]) -> "RolloutBatch":
        def cat(name: str):
            xs = [getattr(p, name) for p in parts]
            if any(x is None for x in xs):
                if name == "group":  # a chunk saved before groups existed: no group baseline for this batch
                    return None
                if not all(x is None for x in xs):
                    raise ValueError(f"concat: field '{name}' is missing in some parts (mixed action sets)")
                return None
            return torch.cat(xs, 0)

        return cls(**{f.name: cat(f.name) for f in fields(cls)})

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """The same batch on `device` (the learner's); tensors already there are shared, not copied."""
        return self._map(lambda x: x.to(device))

    def select(self, keep: torch.Tensor) -> "RolloutBatch":
        """The episodes where the bool (E,) `keep` is True (e.g. the debates that did not fail)."""
        return self._map(lambda x: x[keep])

    def flat(self, name: str) -> torch.Tensor | None:
        x = getattr(self, name)
        return None if x is None else x.reshape(-1, *x.shape[2:])

    def valid_rows(self) -> torch.Tensor:
        """Indices into the flattened (E*T) steps that the debates took (all of them without early stops)."""
        n = self.rewards.numel()
        if self.valid is None:
            return torch.arange(n, device=self.rewards.device)
        return torch.nonzero(self.valid.reshape(-1) > 0.5, as_tuple=False).squeeze(-1)

    def check_finite(self) -> None:
        for f in fields(self):
            x = getattr(self, f.name)
            if x is not None and not torch.isfinite(x).all():
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
