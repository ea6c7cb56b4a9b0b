"""Sampling rules over a pool that mixes reply modes (e.g. `cot` and `pot` samples of the same question).

A fixed mixing rule is a *schedule* and a sampling rule of `dear.debate.sampling_rules`: the schedule says which
mode the n-th sample comes from, each mode's samples are drawn in their own order, and the interleaved sequence is
read by the rule as one question's samples. So `adaptive-sc-2-from-2` on the schedule `pot, cot, cot, ...` is "a
program first and a chain of thought beside it; more chains of thought until two answers agree", and `cisc-3` on
`pot, cot, pot` is CISC over both modes.

- `SCHEDULES`: the named schedules, as patterns of mode positions (0 = the first mode named, 1 = the second), the
  last element repeating: `alternate` (0, 1, 0, 1, ...), `alternate-second-first` (1, 0, 1, 0, ...), `second-then-first`
  (1, 0, 0, ...), `first-then-second` (0, 1, 1, ...), and the seats of a three-agent pool taking turns,
  `seats-first-second-first` (0, 1, 0, 0, 1, 0, ...) and `seats-second-first-second` (1, 0, 1, 1, 0, 1, ...).
- `interleave(by_mode, positions)`: the sequence a schedule draws (until a mode it asks for runs out).
- `drawn(by_mode, mode_orders, schedule)`: what a rule reads in one replay: each mode's samples in its own order,
  interleaved by the schedule (or one mode alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from dear.debate.replay_orders import permuted
from dear.debate.sampling_rules import Samples

# name -> (the pattern's head, the mode position repeated after it)
SCHEDULES: dict[str, tuple[tuple[int, ...], int | None]] = {
    "alternate": ((0, 1), None),  # None: the head itself repeats
    "alternate-second-first": ((1, 0), None),
    "second-then-first": ((1,), 0),
    "first-then-second": ((0,), 1),
    # the seats of a pool (a, b, a) or (b, a, b) taking turns, one sample each (a world with env.fresh_per_round: 1
    # where every agent asks): what a policy that always asks draws
    "seats-first-second-first": ((0, 1, 0), None),
    "seats-second-first-second": ((1, 0, 1), None),
}


def pattern(schedule: str, length: int) -> tuple[int, ...]:
    """The mode position of each of the first `length` draws of a named schedule."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    head, tail = SCHEDULES[schedule]
    if tail is None:
        return tuple(head[i % len(head)] for i in range(length))
    return tuple(head[i] if i < len(head) else tail for i in range(length))


def interleave(by_mode: Sequence[Samples], positions: Sequence[int]) -> Samples:
    """The samples a schedule draws: draw i is the next unused sample of mode `positions[i]`; the sequence ends where
    a mode it asks for has none left. Confidences stay with their samples (None for a sample of a mode without
    them; no confidences at all when no mode drawn has any)."""
    taken = [0] * len(by_mode)
    picks: list[tuple[int, int]] = []
    for m in positions:
        if not 0 <= m < len(by_mode):
            raise ValueError(f"interleave: mode position {m} for {len(by_mode)} modes")
        if taken[m] >= len(by_mode[m].keys):
            break
        picks.append((m, taken[m]))
        taken[m] += 1
    if not picks:
        raise ValueError("interleave: no sample drawn")

    def pick(field: str):
        return tuple(getattr(by_mode[m], field)[i] for m, i in picks)

    def confidence(m: int, i: int) -> float | None:
        c = by_mode[m].confidence
        return None if c is None else c[i]

    any_confidence = any(by_mode[m].confidence is not None for m, _ in picks)
    return Samples(pick("keys"), pick("correct"), pick("tokens"),
                   tuple(confidence(m, i) for m, i in picks) if any_confidence else None)


def drawn(by_mode: Sequence[Samples], mode_orders: Sequence[tuple[int, ...]], schedule: str | None,
          mode: int = 0) -> Samples:
    """The samples a rule reads in one replay: mode m's samples in the order `mode_orders[m]`, interleaved by the named
    `schedule` as long as the modes last (None: mode `mode`'s alone)."""
    ordered = [permuted(samples, order) for samples, order in zip(by_mode, mode_orders)]
    if schedule is None:
        return ordered[mode]
    return interleave(ordered, pattern(schedule, sum(len(s.keys) for s in ordered)))
