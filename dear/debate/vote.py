"""Plurality vote over normalised answer keys with a seeded tie-break."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class VoteResult:
    answer: str | None  # winning normalised key; None when no agent gave a parsable answer
    correct: bool
    tie: bool  # True when several keys shared the top count and the RNG picked one
    counts: dict[str, int] = field(default_factory=dict)


def plurality(keys: Sequence[str | None], rng: np.random.Generator) -> tuple[str | None, bool, dict[str, int]]:
    """Return (winner, tie, counts). None answers do not vote."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None, False, {}
    top = max(counts.values())
    # Sort the leaders so the seeded pick does not depend on agent order.
    leaders = sorted(k for k, c in counts.items() if c == top)
    winner = leaders[int(rng.integers(len(leaders)))] if len(leaders) > 1 else leaders[0]
    return winner, len(leaders) > 1, dict(counts)


def vote(keys: Sequence[str | None], correct: Sequence[bool], rng: np.random.Generator) -> VoteResult:
    """Plurality over `keys`; the winner is correct iff the agents that gave it were graded correct."""
    winner, tie, counts = plurality(keys, rng)
    if winner is None:
        return VoteResult(answer=None, correct=False, tie=False, counts={})
    ok = any(c for k, c in zip(keys, correct) if k == winner)
    return VoteResult(answer=winner, correct=ok, tie=tie, counts=counts)
