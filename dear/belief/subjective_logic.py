"""Subjective-logic opinions from pairwise evidence (docs/DESIGN.md §3), batched over (B debates, V agents).

Agent i's evidence about its peers is row i of e (self EXCLUDED: e_ii never counts):

    E_i = sum_{j != i} e_ij,   S_i = E_i + V,   b_ij = e_ij / S_i (b_ii = 0),   u_i = V / S_i

so u_i + sum_j b_ij = 1. An agent whose peers all disagree with it (small e_ij) is the most uncertain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Evidence may exceed [0, 1] by float rounding only; anything further is a caller bug worth reporting.
_RANGE_TOL = 1e-5


@dataclass
class Opinion:
    """Per-agent opinions: b[bt, i, k] = agent i's belief mass on agent k's answer; u[bt, i] its uncertainty."""

    b: torch.Tensor  # (B, V, V), b[:, i, i] = 0 when built by `opinions`
    u: torch.Tensor  # (B, V)

    @property
    def batch_size(self) -> int:
        return int(self.b.shape[0])

    @property
    def num_agents(self) -> int:
        return int(self.b.shape[-1])


def check_square_batch(name: str, x: torch.Tensor) -> None:
    """Raise ValueError unless x is (B, V, V) with B >= 1 and V >= 2."""
    if x.ndim != 3 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must have shape (B, V, V), got {tuple(x.shape)}; add a batch axis with "
                         "x[None] for one debate")
    if x.shape[-1] < 2:
        raise ValueError(f"{name} has V={x.shape[-1]} agents; a debate needs V >= 2")
    if x.shape[0] == 0:
        raise ValueError(f"{name} has an empty batch axis: shape {tuple(x.shape)}")


def opinions(e: torch.Tensor) -> Opinion:
    """(B, V, V) pairwise evidence in [0, 1] -> Opinion(b (B, V, V), u (B, V)), self excluded."""
    if isinstance(e, np.ndarray):
        e = torch.from_numpy(e)
    if not isinstance(e, torch.Tensor):
        raise ValueError(f"evidence must be a torch tensor or numpy array, got {type(e).__name__}")
    if not e.is_floating_point():
        e = e.float()
    check_square_batch("evidence", e)
    if not bool(torch.isfinite(e).all()):
        b, i, j = (int(k) for k in torch.nonzero(~torch.isfinite(e))[0])
        raise ValueError(f"evidence[{b}, {i}, {j}] is NaN or inf")
    if bool(((e < -_RANGE_TOL) | (e > 1 + _RANGE_TOL)).any()):
        b, i, j = (int(k) for k in torch.nonzero((e < -_RANGE_TOL) | (e > 1 + _RANGE_TOL))[0])
        raise ValueError(f"evidence[{b}, {i}, {j}] = {float(e[b, i, j]):.6g} is outside [0, 1]")
    num_agents = e.shape[-1]
    eye = torch.eye(num_agents, dtype=torch.bool, device=e.device)
    off_diagonal = e.clamp(0.0, 1.0).masked_fill(eye, 0.0)
    strength = off_diagonal.sum(dim=-1) + num_agents  # S_i = E_i + V
    return Opinion(b=off_diagonal / strength.unsqueeze(-1), u=num_agents / strength)
