"""Observed rates of logged debates (real or simulated): round-0 accuracy and unanimity, C→I and I→C of every
transition, sliced by how many of the peers read agreed and by temperature; the rows of the fit reports."""

from __future__ import annotations

from collections.abc import Sequence

from dear.metrics import Ratio
from dear.sim.records import DebateRecord, Transition, transitions

TEMP_BINS = ((0.0, 0.5), (0.5, 0.9), (0.9, 2.01))


def _agree_slice(t: Transition) -> str:
    """The transition's slice by the peers it read: nobody, or how many of them shared its answer (0, 1, 2+)."""
    if t.n_read == 0:
        return "read none"
    return f"agree={min(t.n_agr, 2)}{'+' if t.n_agr >= 2 else ''}"


def _temp_slice(t: float) -> str:
    """The temperature bin of a new turn."""
    for lo, hi in TEMP_BINS:
        if lo <= t < hi:
            return f"T∈[{lo:.1f},{min(hi, 2.0):.1f})"
    return f"T∈[{TEMP_BINS[-1][0]:.1f},2.0]"


def compute_stats(records: Sequence[DebateRecord]) -> dict[str, Ratio]:
    """Observed rates keyed by a readable name (the rows of the report)."""
    stats: dict[str, Ratio] = {}
    r0 = [t for rec in records for t in rec.rounds[0]]
    stats["round-0 accuracy"] = Ratio(sum(t.correct for t in r0), len(r0))
    unan = [len({t.answer for t in rec.rounds[0]}) == 1 and rec.rounds[0][0].answer is not None for rec in records]
    stats["round-0 unanimous questions"] = Ratio(sum(unan), len(unan))
    trs = transitions(records)
    slices: dict[str, list[Transition]] = {"all": trs}
    for t in trs:
        slices.setdefault(_agree_slice(t), []).append(t)
    for t in trs:
        slices.setdefault(_temp_slice(t.temperature), []).append(t)
    order = ["all", "read none", "agree=0", "agree=1", "agree=2+"] + [_temp_slice(lo) for lo, _ in TEMP_BINS]
    for name in order:
        group = slices.get(name, [])
        c = [t for t in group if t.own_correct]
        w = [t for t in group if not t.own_correct]
        stats[f"C→I {name}"] = Ratio(sum(not t.new_correct for t in c), len(c))
        stats[f"I→C {name}"] = Ratio(sum(t.new_correct for t in w), len(w))
    if records:
        last = [t for rec in records for t in rec.rounds[-1]]
        stats["last-round accuracy"] = Ratio(sum(t.correct for t in last), len(last))
    return stats
