"""Who moved to whose answer in a mixed pool: each agent's step from one round to the next, grouped by its own
profile and the profiles it read, with C→I / I→C counts and the answers it adopted by the profile that held them.

A step is one agent from round r − 1 to round r of a finished debate (r ≥ 1). It *moved* when its parsed answer
changed; it *adopted* from profile Q when it moved to an answer that a peer of profile Q, read in that step, gave in
round r − 1 (a peer of each profile holding the answer counts once for that profile). A missing answer counts as
wrong, as everywhere in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dear.debate.trace import AgentTurn, DebateTrace

NOBODY = "nobody"


@dataclass
class ProfileStep:
    """The steps of agents of one profile that read one set of profiles."""

    profile: str  # the agent's profile
    read: str  # the profiles it read, sorted and joined by "+", or "nobody"
    n: int = 0
    was_correct: int = 0
    correct_to_incorrect: int = 0
    was_incorrect: int = 0
    incorrect_to_correct: int = 0
    moved: int = 0
    adopted: dict[str, list[int]] = field(default_factory=dict)  # source profile -> [adoptions, correct ones]


def _profile(turn: AgentTurn) -> str:
    return turn.profile or "default"


def profile_steps(traces: Sequence[DebateTrace]) -> list[ProfileStep]:
    """Every step of every finished trace, grouped by (agent profile, profiles read), in order of first appearance."""
    rows: dict[tuple[str, str], ProfileStep] = {}
    for t in traces:
        if t.failed:
            continue
        for r in range(1, len(t.rounds)):
            prev = {x.agent: x for x in t.rounds[r - 1]}
            for turn in t.rounds[r]:
                own = prev.get(turn.agent)
                if own is None:
                    continue
                peers = [prev[j] for j in turn.peers if j in prev]
                read = "+".join(sorted({_profile(p) for p in peers})) or NOBODY
                row = rows.setdefault((_profile(turn), read), ProfileStep(_profile(turn), read))
                _count(row, own, turn, peers)
    return list(rows.values())


def _count(row: ProfileStep, own: AgentTurn, new: AgentTurn, peers: Sequence[AgentTurn]) -> None:
    row.n += 1
    if own.correct:
        row.was_correct += 1
        row.correct_to_incorrect += not new.correct
    else:
        row.was_incorrect += 1
        row.incorrect_to_correct += bool(new.correct)
    if new.answer_key == own.answer_key:
        return
    row.moved += 1
    if new.answer_key is None:
        return
    for source in sorted({_profile(p) for p in peers if p.answer_key == new.answer_key}):
        counts = row.adopted.setdefault(source, [0, 0])
        counts[0] += 1
        counts[1] += bool(new.correct)
