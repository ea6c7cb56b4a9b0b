"""Running mean/variance of value targets (value normalisation, as in HARL/MAPPO).

The critic predicts normalised values; GAE works on de-normalised ones. The statistics are the same exact
float64 parallel Welford as the policies' input normalisation (one feature), so a resumed run reproduces
the same numbers bit for bit.
"""

from __future__ import annotations

import torch

from dear.policy import RunningNorm


class ValueNorm(RunningNorm):
    def __init__(self, eps: float = 1e-5):
        super().__init__(dim=1, eps=eps)

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var.clamp_min(self.eps))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.to(torch.float64) - self.mean) / self.std()).to(x.dtype)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.float64) * self.std() + self.mean).to(x.dtype)
