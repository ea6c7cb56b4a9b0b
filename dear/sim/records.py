"""Logged debates as the fit reads them: per round and agent, the answer, its correctness, the sampling and who
was read; the agent-to-agent transitions between rounds. Read from DebateTrace JSON (real or simulated)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dear.vote import tally

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Turn:
    """One agent's turn in one round."""

    agent: int
    answer: str | None  # normalised answer key
    correct: bool
    temperature: float
    top_p: float
    peers: tuple[int, ...]  # agents read in this turn's prompt


@dataclass
class DebateRecord:
    """One logged debate: its question and its turns, rounds[r][agent]."""

    question_id: str
    rounds: list[list[Turn]]  # rounds[r][agent]

    @property
    def n_agents(self) -> int:
        return len(self.rounds[0]) if self.rounds else 0


@dataclass(frozen=True)
class Transition:
    """One agent from round r to r + 1."""

    debate: int  # index into the record list
    agent: int
    round: int  # the new round (r + 1)
    own: str | None
    own_correct: bool
    n_read: int  # peers read (with an answer)
    n_agr: int
    n_dis: int
    gold_share: float  # among the plurality of disagreeing peers' answers: fraction that is correct
    temperature: float
    top_p: float
    new: str | None
    new_correct: bool


def _turn_from_dict(d: dict[str, Any], where: str) -> Turn:
    """One agent turn of a DebateTrace dict (ValueError naming `where` if a field is missing or malformed)."""
    try:
        return Turn(
            agent=int(d["agent"]),
            answer=None if d.get("answer_key") is None else str(d["answer_key"]),
            correct=bool(d["correct"]),
            temperature=float(d["temperature"]),
            top_p=float(d.get("top_p", 0.9)),
            peers=tuple(int(j) for j in d.get("peers") or ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: bad agent turn ({type(e).__name__}: {e})") from e


def record_from_dict(d: dict[str, Any], where: str) -> DebateRecord | None:
    """One DebateTrace dict → a record (None for a failed debate: its rounds are incomplete)."""
    if not isinstance(d, dict) or "rounds" not in d:
        raise ValueError(f"{where}: not a DebateTrace (no 'rounds' key)")
    if d.get("failed"):
        log.warning("%s: skipping failed debate %s", where, d.get("debate_id"))
        return None
    order = d.get("pool_order")
    if order is not None and list(order) != list(range(len(order))):
        # The sim's per-agent parameters belong to pool positions; a shuffled seating would mix them up.
        raise ValueError(f"{where}: seats the pool in the order {list(order)}; the fit reads debates in pool order "
                         "(collect the corpus without shuffled profiles)")
    rounds = [[_turn_from_dict(t, f"{where} round {r}") for t in turns] for r, turns in enumerate(d["rounds"])]
    for r, turns in enumerate(rounds):
        if [t.agent for t in turns] != list(range(len(turns))):
            raise ValueError(f"{where}: round {r} agents are {[t.agent for t in turns]}, expected 0..V-1")
    if not rounds:
        return None
    return DebateRecord(str(d.get("question_id", where)), rounds)


def read_traces(path: str | Path) -> list[DebateRecord]:
    """DebateTrace JSONL → records. Failed debates (trace.failed) are skipped: their rounds are incomplete."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"traces file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from e
            rec = record_from_dict(d, where)
            if rec is not None:
                out.append(rec)
    if not out:
        raise ValueError(f"{path}: no usable debates")
    return out


def transitions(records: Sequence[DebateRecord]) -> list[Transition]:
    """Every agent's step from round r to r + 1 of every record, with what it read before the step."""
    out = []
    for k, rec in enumerate(records):
        for r in range(1, len(rec.rounds)):
            prev, cur = rec.rounds[r - 1], rec.rounds[r]
            gold = next((t.answer for t in prev + cur if t.correct and t.answer is not None), None)
            for t in cur:
                own = prev[t.agent]
                read = [prev[j].answer for j in t.peers if prev[j].answer is not None]
                n_agr = sum(a == own.answer for a in read) if own.answer is not None else 0
                # the plurality of the disagreeing peers' answers (dear.vote): the share of its leaders that is right
                dis = tally([a for a in read if a != own.answer])
                share = sum(a == gold for a in dis.leaders) / len(dis.leaders) if dis.leaders else 0.0
                out.append(Transition(
                    debate=k, agent=t.agent, round=r, own=own.answer, own_correct=own.correct,
                    n_read=len(read), n_agr=n_agr, n_dis=len(read) - n_agr, gold_share=share,
                    temperature=t.temperature, top_p=t.top_p, new=t.answer, new_correct=t.correct,
                ))
    return out



def write_records(records: Sequence[DebateRecord], path: str | Path) -> None:
    """Write records as minimal DebateTrace-shaped JSONL (the fields `read_traces` reads), e.g. for tests."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            rounds = [[{"agent": t.agent, "round": r, "answer_key": t.answer, "correct": t.correct,
                        "temperature": t.temperature, "top_p": t.top_p, "peers": list(t.peers)} for t in turns]
                      for r, turns in enumerate(rec.rounds)]
            f.write(json.dumps({"question_id": rec.question_id, "rounds": rounds}) + "\n")
