"""Who a policy's selection reads, by profile: for each exchange round and each (reader, read) pair of profiles, the
share of ordered pairs it read and the mean probability it gave them.

Both a training run's simulated debates (`python -m train.read_rates`) and an evaluation's real ones (`python -m
eval.read_probabilities`) count their pairs here, so the two tables mean the same thing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dear.policy import pair_order


@dataclass(frozen=True)
class ReadRate:
    """How often agents of profile `reader` read agents of profile `read` before exchange round `round`."""

    round: int
    reader: str
    read: str
    reads: int
    pairs: int
    probability: float  # mean P(read) the selection gave these pairs (NaN for the extended action set)

    @property
    def rate(self) -> float:
        return self.reads / self.pairs if self.pairs else float("nan")


class ReadCounter:
    """Counts, pair by pair, what a selection chose (its mask) and the probability it gave (its P(read))."""

    def __init__(self, n_agents: int):
        self.order = pair_order(n_agents)
        self.reads: Counter = Counter()
        self.pairs: Counter = Counter()
        self.probability: Counter = Counter()

    def add(self, round_: int, who: Sequence[str], mask: np.ndarray, probabilities: Sequence[float]) -> None:
        """One debate's decision before `round_`: `who[i]` names seat i's profile, `mask[i, j]` says whether i read
        j, `probabilities[k]` is P(read) of the k-th pair of `pair_order` (NaN when it has none)."""
        for k, (i, j) in enumerate(self.order):
            key = (round_, who[i], who[j])
            self.pairs[key] += 1
            self.reads[key] += int(bool(mask[i][j]))
            self.probability[key] += float(probabilities[k])

    def rates(self) -> list[ReadRate]:
        return [ReadRate(r, a, b, self.reads[r, a, b], n, self.probability[r, a, b] / n)
                for (r, a, b), n in sorted(self.pairs.items())]


def probability_cell(p: float) -> str:
    """Three decimals, or two significant digits below 0.001, so a tiny probability does not read as zero."""
    return f"{p:.3f}" if p == 0 or p >= 0.001 else f"{p:.1e}"


def table(rates: Sequence[ReadRate]) -> list[str]:
    """The rates as a Markdown table."""
    return (["| round | reader | reads | rate | P(read) | pairs |", "|---:|---|---|---:|---:|---:|"]
            + [f"| {x.round} | {x.reader} | {x.read} | {x.rate:.2f} | {probability_cell(x.probability)} | {x.pairs} |"
               for x in rates])
