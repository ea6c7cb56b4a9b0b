"""DEAR's realized action frequencies per exchange round, which the random controls match.

For exchange round r (1..R), over a method's finished debates:

- ``stop[r]``: the share of the debates that had run round r − 1 and ended there (stopped before round r);
- ``kinds[r]``: the shares of round r's turns that revised (read peers and answered again), kept (a silent turn:
  no call) and drew a fresh sample, in `dear.policy.KINDS` order;
- ``density[r]``: the peers a revising turn read / (V − 1), averaged over round r's revising turns.

A paper-action policy's control draws pairs at its read density over *all* turns (`dear.metrics`'
``read_density``, the paper's random mask); the extended control draws each agent's kind, the stop, and a reviser's
pairs at these frequencies, so it spends its turns the way DEAR did, only not where DEAR chose to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dear.debate.trace import DebateTrace


@dataclass(frozen=True)
class ActionFrequencies:
    stop: list[float]  # per exchange round 1..R
    kinds: list[tuple[float, float, float]]  # revise, keep, fresh per exchange round 1..R
    density: list[float]  # per exchange round 1..R, among revising turns

    def to_json(self) -> dict:
        return asdict(self)


def turn_kind(turn) -> int:
    """The turn's kind as an index into dear.policy.KINDS (revise 0, keep 1, fresh 2)."""
    return 2 if turn.fresh else 1 if turn.silent else 0


def action_frequencies(traces: Sequence[DebateTrace], n_rounds: int) -> ActionFrequencies:
    """The frequencies above over `traces` (finished debates of V agents, R = n_rounds). A round no debate reached
    gets stop 1 after a round every debate stopped before, kinds uniform and density 0 (never played)."""
    if not traces:
        raise ValueError("action_frequencies: no traces")
    v = traces[0].n_agents
    stop, kinds, density = [], [], []
    for r in range(1, n_rounds + 1):
        reached = [t for t in traces if len(t.rounds) >= r]  # ran round r - 1
        went_on = [t for t in reached if len(t.rounds) > r]
        stop.append(1.0 - len(went_on) / len(reached) if reached else 1.0)
        turns = [a for t in went_on for a in t.rounds[r]]
        counts = [sum(turn_kind(a) == k for a in turns) for k in range(3)]
        kinds.append(tuple(c / len(turns) for c in counts) if turns else (1 / 3, 1 / 3, 1 / 3))
        revising = [a for a in turns if turn_kind(a) == 0]
        density.append(sum(len(a.peers) for a in revising) / (len(revising) * (v - 1)) if revising else 0.0)
    return ActionFrequencies(stop, kinds, density)
