"""When two answers are the same answer: the one rule every vote uses (final answer, per-round plurality,
regulator features, rewards, statistics, simulator fits).

Two normalised answer keys vote together exactly when the project's grader would call them equal:

- numeric / integer: equal value. `normalize_answer` already maps equal values to one key (`1,000` = `1000.00`),
  so two keys are the same answer iff they are the same string.
- choice: the same option letter (again the key itself).
- math: the same key, or math-verify's equivalence in both directions (`\\frac{5}{4}` = `1.25`,
  `\\frac{\\sqrt2}{2}` = `\\frac{1}{\\sqrt2}`, `\\dfrac34` = `\\frac{3}{4}`), under the grader's guards: inputs
  that could make sympy hang are never compared, and a comparison that raises or times out counts as "not
  equal" (counted in `STATS`). An answer math-verify cannot parse stays its own key; it never merges with
  everything.

`AnswerClasses` applies the rule to one question's answers: every key maps to the first key seen that it
equals (its class representative), so downstream code compares representatives as plain strings. Classes are
built greedily against representatives, so an equivalence that is not transitive (rare: rounding) cannot chain
unrelated answers together. Pair verdicts are cached process-wide, so a debate re-checks no pair it has seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dear.tasks.types import AnswerKind

_EXACT_KINDS = ("numeric", "integer", "choice")


@dataclass
class EquivalenceStats:
    """Process-wide counts of math comparisons (reports print them)."""

    checks: int = 0  # math-verify comparisons made (cache misses)
    undecided: int = 0  # comparisons that raised, timed out or were skipped as risky: counted "not equal"

    def reset(self) -> None:
        self.checks = self.undecided = 0


STATS = EquivalenceStats()


def _math_equal(a: str, b: str) -> bool:
    from dear.tasks.grade import math_keys_equal

    STATS.checks += 1
    verdict = math_keys_equal(a, b)
    if verdict is None:
        STATS.undecided += 1
        return False
    return verdict


@lru_cache(maxsize=65536)
def _math_pair(a: str, b: str) -> bool:
    return _math_equal(a, b)


def same_answer(a: str | None, b: str | None, kind: AnswerKind) -> bool:
    """Whether two normalised keys are the same answer (None, no answer, is never the same as anything)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    if kind in _EXACT_KINDS:
        return False
    lo, hi = sorted((a, b))  # the verdict is symmetric: cache one order
    return _math_pair(lo, hi)


class AnswerClasses:
    """One question's answer keys grouped by `same_answer`; `canonical(key)` is the key's class representative
    (the first key seen that it equals, else the key itself)."""

    def __init__(self, kind: AnswerKind):
        self.kind = kind
        self._reps: list[str] = []
        self._of: dict[str, str] = {}

    def canonical(self, key: str | None) -> str | None:
        if key is None or self.kind in _EXACT_KINDS:
            return key
        rep = self._of.get(key)
        if rep is None:
            rep = next((r for r in self._reps if same_answer(key, r, self.kind)), None)
            if rep is None:
                self._reps.append(key)
                rep = key
            self._of[key] = rep
        return rep

    @property
    def members(self) -> dict[str, str]:
        """Every key seen -> its representative."""
        return dict(self._of)
