"""Running mean/variance of value targets (value normalisation, as in HARL/MAPPO).

The critic predicts normalised values; GAE works on de-normalised ones. Statistics are exact
(parallel Welford over batches, float64) so a resumed run reproduces the same numbers bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueNorm(nn.Module):
    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1).to(torch.float64)
        if x.numel() == 0:
            return
        b_mean, b_var, b_n = x.mean(), x.var(unbiased=False), float(x.numel())
        if self.count.item() == 0:
            self.mean.copy_(b_mean)
            self.var.copy_(b_var)
            self.count.fill_(b_n)
            return
        delta = b_mean - self.mean
        total = self.count + b_n
        m2 = self.var * self.count + b_var * b_n + delta.pow(2) * self.count * b_n / total
        self.mean.add_(delta * b_n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var.clamp_min(self.eps))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.to(torch.float64) - self.mean) / self.std()).to(x.dtype)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.float64) * self.std() + self.mean).to(x.dtype)
