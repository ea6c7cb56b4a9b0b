"""The plurality vote over answer keys: the one place that counts votes, finds the leaders and scores a vote.
Used by the debate engine (final answer), metrics (per-round group answer), the regulator (plurality features)
and training statistics.

Keys are compared as strings: callers pass class representatives (`dear.tasks.equivalence.AnswerClasses`), so
equivalent answers (`5/4`, `1.25`) vote together. `None` (no parsable answer) never votes.

The tie rule, stated once: a vote's score is its expected correctness over its tied leaders — a k-way tie with
the correct answer among the leaders scores 1/k (`Tally.score`, `VoteResult.score`). That score is the primary
accuracy of every method and every round. The belief-weighted rule (`weighted_tally`) ranks keys by summed
weights instead of counts, under the same tie rule. The seeded pick (`Tally.pick`) still names one answer (the answer a
user gets); its correctness is kept as a secondary number. Leaders are sorted, so the pick does not depend on
agent order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Tally:
    """Votes of one round: counts per key and the plurality leaders (several on a tie, none when nobody answered)."""

    counts: dict[str, int]
    leaders: tuple[str, ...]  # sorted
    top: int  # votes of each leader (0 when nobody answered)

    @property
    def tie(self) -> bool:
        return len(self.leaders) > 1

    def score(self, key_is_correct: dict[str, bool]) -> float:
        """Expected correctness over the tied leaders (1/k for a k-way tie holding the correct answer; 0 when
        nobody answered)."""
        if not self.leaders:
            return 0.0
        return sum(bool(key_is_correct.get(k, False)) for k in self.leaders) / len(self.leaders)

    def pick(self, rng: np.random.Generator) -> str | None:
        """The winner: the only leader, or a seeded pick among tied leaders (None when nobody answered).
        Draws from `rng` only on a tie."""
        if not self.leaders:
            return None
        return self.leaders[int(rng.integers(len(self.leaders)))] if self.tie else self.leaders[0]


def tally(keys: Sequence[str | None]) -> Tally:
    """Count the answer keys of one round and find the plurality leaders."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return Tally(counts={}, leaders=(), top=0)
    top = max(counts.values())
    return Tally(counts=dict(counts), leaders=tuple(sorted(k for k, c in counts.items() if c == top)), top=top)


def weighted_tally(keys: Sequence[str | None], weights: Sequence[float]) -> Tally:
    """The leaders by each key's summed weight instead of its count (the belief-weighted rule); weights within
    1e-9 of the top tie. `counts` stay the plain votes; `top` is the most votes any leader has."""
    if len(weights) != len(keys):
        raise ValueError(f"weighted_tally: {len(weights)} weights for {len(keys)} keys")
    plain = tally(keys)
    if not plain.counts:
        return plain
    mass: dict[str, float] = {}
    for k, w in zip(keys, weights):
        if k is not None:
            mass[k] = mass.get(k, 0.0) + float(w)
    best = max(mass.values())
    leaders = tuple(sorted(k for k, m in mass.items() if m >= best - 1e-9))
    return Tally(counts=plain.counts, leaders=leaders, top=max(plain.counts[k] for k in leaders))


def key_correct(keys: Sequence[str | None], correct: Sequence[bool]) -> dict[str, bool]:
    """Whether each answer key was graded correct (True if any agent giving it was graded correct)."""
    out: dict[str, bool] = {}
    for k, c in zip(keys, correct):
        if k is not None:
            out[k] = out.get(k, False) or bool(c)
    return out


@dataclass(frozen=True)
class VoteResult:
    answer: str | None  # the seeded pick among the leaders; None when no agent gave a parsable answer
    correct: bool  # the seeded pick is correct
    tie: bool  # True when several keys shared the top count and the RNG picked one
    counts: dict[str, int] = field(default_factory=dict)
    score: float = 0.0  # expected correctness over the tied leaders: the primary accuracy


def vote(keys: Sequence[str | None], correct: Sequence[bool], rng: np.random.Generator,
         weights: Sequence[float] | None = None) -> VoteResult:
    """Plurality over `keys` (or, with `weights`, the largest summed weight): its score over tied leaders and a
    seeded pick; a key is correct iff an agent that gave it was graded correct."""
    t = tally(keys) if weights is None else weighted_tally(keys, weights)
    winner = t.pick(rng)
    if winner is None:
        return VoteResult(answer=None, correct=False, tie=False, counts={})
    kc = key_correct(keys, correct)
    return VoteResult(answer=winner, correct=kc[winner], tie=t.tie, counts=t.counts, score=t.score(kc))
