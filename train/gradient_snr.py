"""How much learning signal one iteration carries: the signal-to-noise ratio of the policy-gradient estimate for
each action dimension, at a chosen point of the policy space (synthetic worlds make this cheap).

    python -m train.gradient_snr --config sim-stylised --batches 8
    python -m train.gradient_snr --config sim-stylised --batches 8 --at p=0,T=0.1,top_p=0.9

For every batch of `rollout.episodes_per_iter` debates (the trainer's own collection, seeds of iterations
0, 1, ...), it takes the advantages HAPPO uses (GAE on the untrained critic — with `rollout.group_size` > 1
centred on each debate's group, train/group_baseline.py — normalised over the batch: at the start and without
groups this is the shaped return minus its mean) and the score-function gradient of the clipped objective at
ratio 1 with respect to three directions of the policy:

- `T`, `top-p`: the behavior Gaussian's mean (raw units), every agent moved together;
- `read`: the selection logits, every pair moved together (the read density's direction).

Per direction it prints the gradient's mean over the pooled debates, its standard error, the SNR of one batch
(mean / standard error at one batch's size) and how many batches an SNR of 2 needs. A dimension whose one-batch
SNR is far below 1 moves by noise: a learner needs many iterations to find its direction, however it steps.
`--at` moves the starting point: read probability p, temperature T and top-p (the policy's mean) — e.g. the
neighbourhood of a world's known optimum. Every number is synthetic when the config's backend is.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dear.cli import run as run_cli
from dear.policy import from_sampling
from train.buffer import RolloutBatch
from train.config import load_config
from train.runner import Trainer

PROG = "python -m train.gradient_snr"
DIRECTIONS = ("T", "top-p", "read")


@dataclass(frozen=True)
class Direction:
    """The pooled gradient estimate along one direction of the policy."""

    name: str
    mean: float  # per debate
    stderr: float  # of the pooled mean
    snr_one_batch: float
    batches_for_snr_2: float


def parse_point(text: str) -> dict[str, float]:
    """`p=0,T=0.1,top_p=0.9` -> {"p": 0.0, "T": 0.1, "top_p": 0.9} (any subset)."""
    point = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in ("p", "T", "top_p"):
            raise ValueError(f"--at: expected p=..., T=..., top_p=... separated by commas, got {part!r}")
        point[key.strip()] = float(value)
    return point


def move_policy(trainer: Trainer, point: dict[str, float]) -> None:
    """Put the policy's starting point at `point`: the pair logits' bias at logit(p), the behavior mean at T/top-p."""
    policy, cfg = trainer.policy, trainer.policy.config
    with torch.no_grad():
        if "p" in point:
            p = min(max(point["p"], 1e-4), 1 - 1e-4)
            policy.selection.net[-1].bias[: policy.selection.n_pairs].fill_(math.log(p / (1 - p)))
    if "T" in point or "top_p" in point:
        raw = from_sampling(point.get("T", cfg.fixed_temperature), point.get("top_p", cfg.fixed_top_p),
                            cfg.temperature_range, cfg.top_p_range, cfg.behavior_map)
        policy.behavior.set_mean_bias(*raw)


def batch_gradients(trainer: Trainer, batch: RolloutBatch) -> np.ndarray:
    """(episodes, 3) per-debate gradient of the objective's estimate along T, top-p and read."""
    gae = trainer.learner.advantages(batch)
    adv = gae.advantages
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy = trainer.policy
    with torch.no_grad():
        mean = policy.behavior(batch.behavior_obs)
        sigma = policy.behavior.log_std.exp()
        logits = policy.selection(batch.selection_obs)[..., : policy.selection.n_pairs]
    score_behavior = ((batch.raw_behavior - mean) / sigma ** 2).sum(2)  # (E, T, 2), agents moved together
    score_read = (batch.pairs - torch.sigmoid(logits)).sum(-1, keepdim=True)  # (E, T, 1)
    per_step = adv.unsqueeze(-1) * torch.cat([score_behavior, score_read], -1)
    return per_step.sum(1).numpy()  # a debate's steps share its noise: sum them, then treat debates as samples


def measure(config: str, overrides: Sequence[str], batches: int, point: dict[str, float]) -> list[Direction]:
    cfg = load_config(config, [*overrides, "logging.progress=false"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, run_dir=f"{tmp}/run")
        try:
            move_policy(trainer, point)
            grads = []
            for it in range(batches):
                results, _ = trainer.collect(it)
                grads.append(batch_gradients(trainer, RolloutBatch.concat([r.batch for r in results])))
        finally:
            trainer.close()
    g = np.concatenate(grads)
    per_batch = len(g) / batches
    out = []
    for k, name in enumerate(DIRECTIONS):
        m, sd = float(g[:, k].mean()), float(g[:, k].std(ddof=1))
        snr1 = abs(m) / (sd / math.sqrt(per_batch)) if sd > 0 else math.inf
        out.append(Direction(name, m, sd / math.sqrt(len(g)), snr1, (2 / snr1) ** 2 if snr1 > 0 else math.inf))
    return out


def table(directions: Sequence[Direction], header: str) -> str:
    lines = [header, "", "| direction | gradient (per debate) | std. error (pooled) | SNR of one batch | "
             "batches for SNR 2 |", "|---|---:|---:|---:|---:|"]
    for d in directions:
        lines.append(f"| {d.name} | {d.mean:+.4f} | {d.stderr:.4f} | {d.snr_one_batch:.2f} | "
                     f"{d.batches_for_snr_2:.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="sim-stylised", help="a train config name or path")
    ap.add_argument("--batches", type=int, default=8, help="iterations' worth of debates to pool")
    ap.add_argument("--at", default="", help="starting point, e.g. p=0,T=0.1,top_p=0.9 (default: the config's)")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. run.seed=2")
    a = ap.parse_args(argv)
    if a.batches < 2:
        raise ValueError("--batches must be at least 2")
    directions = measure(a.config, a.overrides, a.batches, parse_point(a.at))
    command = " ".join([PROG, "--config", a.config, "--batches", str(a.batches),
                        *(["--at", a.at] if a.at else []), *a.overrides])
    print(table(directions, f"Gradient SNR (synthetic when the backend is sim): `{command}`"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
