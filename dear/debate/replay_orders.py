"""Order-averaged replay of the sampling rules (`dear.debate.sampling_rules`) over one question's stored samples, and
the confidence rules' parameters fitted on training questions.

A rule reads its samples in draw order, so on stored samples its score depends on the order they were stored in.
Replay averages it over P seeded permutations of the question's sample indices (`orders`): derived from the seed and
the question id alone, so every rule is replayed on the same orders, and a question's orders never depend on which
other questions are in the set. The stored order's outcome is kept beside the average. Single CoT's exact average
over positions (every sample first once) is its replay over `rotations`.

Fitting (on training questions only; deterministic, exhaustive over a grid, ties to the larger grid value):
- `fit_tau`: CISC's softmax temperature maximising the mean order-averaged score of `cisc-K`;
- `fit_threshold`: confident-stop's threshold maximising the mean order-averaged utility of its outcomes (the caller's
  objective, e.g. envs.reward.objective at a token price: score - price * tokens / 1000), over
  quantiles of the training samples' confidences and +inf (never stop at the first sample).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dear.debate.sampling_rules import (CONFIDENT_STOP, DEFAULT_PARAMS, Outcome, RuleParams, Samples, rule_outcome,
                                        stops_at_first)

Order = tuple[int, ...]  # sample indices in the order a rule draws them
TAU_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
QUANTILE_LEVELS = tuple(i / 20 for i in range(21))  # 0, 5, ..., 100 % of the training confidences
TIE = 1e-12  # objectives closer than this are equal (then the larger grid value wins)


def _question_number(question_id: str) -> int:
    """A stable 64-bit number of a question id (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(question_id.encode("utf-8")).digest()[:8], "little")


def orders(n_samples: int, n_orders: int, seed: int, question_id: str) -> tuple[Order, ...]:
    """P = `n_orders` seeded permutations of a question's sample indices 0..n_samples-1, from seed and id only."""
    if seed < 0:
        raise ValueError(f"orders: seed must be >= 0, got {seed}")
    rng = np.random.default_rng([seed, _question_number(question_id)])
    return tuple(tuple(int(i) for i in rng.permutation(n_samples)) for _ in range(n_orders))


def rotations(n_samples: int) -> tuple[Order, ...]:
    """The n cyclic rotations of the stored order: every sample drawn first exactly once."""
    return tuple(tuple((start + i) % n_samples for i in range(n_samples)) for start in range(n_samples))


def permuted(s: Samples, order: Order) -> Samples:
    """The samples in the order given (every field, confidences too)."""
    def pick(values):
        return tuple(values[i] for i in order)

    return Samples(pick(s.keys), pick(s.correct), pick(s.tokens),
                   None if s.confidence is None else pick(s.confidence))


@dataclass(frozen=True)
class Replayed:
    """A rule on one question: its means over the orders, and its outcome in the stored order."""

    score: float
    used: float
    tokens: float
    stored: Outcome


def replayed(s: Samples, rule: str, params: RuleParams, draw_orders: Sequence[Order]) -> Replayed:
    """Mean score, samples used and tokens of `rule` over `draw_orders`, plus its stored-order outcome."""
    if not draw_orders:
        raise ValueError("replayed: no orders")
    runs = [rule_outcome(permuted(s, o), rule, params=params) for o in draw_orders]
    return Replayed(float(np.mean([r.score for r in runs])), float(np.mean([r.used for r in runs])),
                    float(np.mean([r.tokens for r in runs])), rule_outcome(s, rule, params=params))


@dataclass(frozen=True)
class ReplayQuestion:
    """One question's samples and the orders every rule is replayed on."""

    question_id: str
    samples: Samples
    orders: tuple[Order, ...]

    @classmethod
    def of(cls, question_id: str, samples: Samples, n_orders: int, seed: int) -> ReplayQuestion:
        return cls(question_id, samples, orders(len(samples.keys), n_orders, seed, question_id))


def mean_replayed_score(questions: Sequence[ReplayQuestion], rule: str, params: RuleParams) -> float:
    """The mean over questions of the rule's order-averaged score."""
    return float(np.mean([replayed(q.samples, rule, params, q.orders).score for q in questions]))


@dataclass(frozen=True)
class Fit:
    """A fitted parameter: its value, its training objective, and the grid it was chosen from."""

    value: float
    objective: float
    grid: tuple[float, ...]


def _best(grid: Sequence[float], objectives: Sequence[float]) -> Fit:
    """The grid point of the largest objective; on a tie (within TIE) the larger grid value."""
    top = max(objectives)
    best = max((i for i, v in enumerate(objectives) if v >= top - TIE), key=lambda i: grid[i])
    return Fit(float(grid[best]), float(objectives[best]), tuple(float(g) for g in grid))


def fit_tau(train: Sequence[ReplayQuestion], k: int, grid: Sequence[float] = TAU_GRID,
            base: RuleParams = DEFAULT_PARAMS) -> Fit:
    """CISC's tau: the grid point maximising the mean order-averaged score of `cisc-k` on the training questions."""
    if not train:
        raise ValueError("fit_tau: no training questions")
    rule = f"cisc-{k}"
    return _best(grid, [mean_replayed_score(train, rule, replace(base, tau=t)) for t in grid])


def threshold_grid(train: Sequence[ReplayQuestion], levels: Sequence[float] = QUANTILE_LEVELS) -> tuple[float, ...]:
    """Quantiles of every training sample's confidence (None left out), distinct and ascending, then +inf."""
    present = [c for q in train for c in (q.samples.confidence or ()) if c is not None]
    cuts = sorted({float(x) for x in np.quantile(present, levels)}) if present else []
    return (*cuts, math.inf)


def fit_threshold(train: Sequence[ReplayQuestion], utility: Callable[[Outcome], float],
                  params: RuleParams = DEFAULT_PARAMS, grid: Sequence[float] | None = None) -> Fit:
    """confident-stop's threshold (tau and agree from `params`): the grid point (default `threshold_grid`)
    maximising the mean over training questions of the order-averaged `utility` of the rule's outcome."""
    if not train:
        raise ValueError("fit_threshold: no training questions")
    grid = threshold_grid(train) if grid is None else tuple(grid)
    # The threshold only decides whether the first sample ends the draw: compute both branches once per order.
    stop_p, go_p = replace(params, threshold=-math.inf), replace(params, threshold=math.inf)
    draws = []  # per question: (first sample, utility if stopped, utility if not) per order
    for q in train:
        runs = []
        for o in q.orders:
            s = permuted(q.samples, o)
            stop, go = (rule_outcome(s, CONFIDENT_STOP, params=p) for p in (stop_p, go_p))
            runs.append((s, utility(stop), utility(go)))
        draws.append(runs)

    def mean_objective(threshold: float) -> float:
        return float(np.mean([np.mean([stop if stops_at_first(s, threshold) else go for s, stop, go in runs])
                              for runs in draws]))

    return _best(grid, [mean_objective(t) for t in grid])
