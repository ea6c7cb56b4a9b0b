"""The goal of a real evaluation (issue 56), in one place: where a method must sit against adaptive SC started at 2
samples until 2 agree (`eval.bank_replay.BASELINE`) on GSM8K, the benchmark the policy is trained on.

A method meets the accuracy part when its accuracy is at least the baseline's minus `POINTS` and the lower bound of
the paired 95 % interval of the difference at least `FLOOR`; the token part when it spends at most `TOKENS` × the
baseline's tokens per question. (On every benchmark it must also be on the accuracy–token frontier and dominated by
no confidence rule: `eval.bank_combine`.)
"""

from __future__ import annotations

from dear.metrics import CI

BENCHMARK = "gsm8k"
POINTS = 0.01  # at least the baseline's accuracy minus one point ...
FLOOR = -0.03  # ... the paired interval's lower bound at least minus three points ...
TOKENS = 0.75  # ... at most three quarters of its tokens per question


def accuracy_ok(diff: CI) -> bool:
    """The accuracy part, on the paired difference to the baseline (accuracy units)."""
    return diff.mean >= -POINTS and diff.low >= FLOOR


def tokens_ok(tokens: float, baseline_tokens: float) -> bool:
    return tokens <= TOKENS * baseline_tokens


def text() -> str:
    """The goal as a report states it."""
    return (f"tokens ≤ {TOKENS:g} × the baseline's, difference ≥ {-100 * POINTS:+g} point, the paired interval's "
            f"lower bound ≥ {100 * FLOOR:+g} points")
