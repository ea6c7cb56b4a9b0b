"""The group baseline: each debate's advantage measured against the other debates of its group.

With `rollout.group_size` G > 1 the G debates of a group share the question and the debate seed, so the same
random draws; what differs between them is the policy's sampled actions. Subtracting, at every step, the mean
advantage of the group's *other* debates (leave-one-out, as RLOO / GRPO do with returns) removes what the
question and the draws did to all of them — most of the return's spread — and keeps what the actions did. The
baseline is unbiased: the other debates' advantages do not depend on this debate's actions. GAE still gives each
debate's state-dependent advantage first; the critic is trained on the uncentred returns.

    Â_i,t ← Â_i,t − Σ_{j∈g(i), j≠i} v_j,t Â_j,t / Σ_{j∈g(i), j≠i} v_j,t

where v_j,t = 1 for steps debate j took (0 after an early stop); a debate with no other valid member at a step
keeps its advantage."""

from __future__ import annotations

import torch


def group_centred(advantages: torch.Tensor, group: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(E, T) advantages minus the leave-one-out mean of their group's others (`group`: (E,) ids)."""
    v = torch.ones_like(advantages) if valid is None else valid.to(advantages.dtype)
    _, idx = torch.unique(group, return_inverse=True)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    sums = torch.zeros(n_groups, advantages.shape[1], dtype=advantages.dtype, device=advantages.device)
    counts = torch.zeros_like(sums)
    sums.index_add_(0, idx, advantages * v)
    counts.index_add_(0, idx, v)
    others = counts[idx] - v
    loo = (sums[idx] - advantages * v) / others.clamp(min=1)
    return torch.where(others > 0, advantages - loo, advantages)
