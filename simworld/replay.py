"""The simulator replayed on logged schedules: the same per-agent temperatures, top-p and peer masks as logged
debates, on fresh synthetic questions, driving `SimBackend` with the metadata the debate engine sends."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dear.llm.base import ChatMessage, ChatRequest
from dear.sim.backend import SimBackend
from dear.sim.records import DebateRecord, Turn
from dear.tasks.synthetic import load_synthetic

BOXED = re.compile(r"\\boxed\{([^}]*)\}")  # the sim's final answer


@dataclass(frozen=True)
class Schedule:
    """What a logged debate did, per round and agent: sampling and who was read (round 0 reads nobody)."""

    temperature: tuple[tuple[float, ...], ...]  # [round][agent]
    top_p: tuple[tuple[float, ...], ...]
    peers: tuple[tuple[tuple[int, ...], ...], ...]

    @classmethod
    def of(cls, rec: DebateRecord) -> Schedule:
        return cls(
            tuple(tuple(t.temperature for t in turns) for turns in rec.rounds),
            tuple(tuple(t.top_p for t in turns) for turns in rec.rounds),
            tuple(tuple(t.peers for t in turns) for turns in rec.rounds),
        )

    @classmethod
    def mad(cls, n_agents: int = 3, n_rounds: int = 1, temperature: float = 0.7, top_p: float = 0.9) -> Schedule:
        full = tuple(tuple(j for j in range(n_agents) if j != i) for i in range(n_agents))
        none = tuple(() for _ in range(n_agents))
        return cls(
            tuple(tuple([temperature] * n_agents) for _ in range(n_rounds + 1)),
            tuple(tuple([top_p] * n_agents) for _ in range(n_rounds + 1)),
            (none,) + tuple(full for _ in range(n_rounds)),
        )


def simulate(backend: SimBackend, schedules: Sequence[Schedule], replicates: int = 1, seed: int = 0,
             split: str = "test") -> list[DebateRecord]:
    """Run every schedule on `replicates` fresh synthetic questions each, round by round in one batch per round,
    driving the backend with the same metadata the debate engine sends."""
    jobs = [(s, k) for s in schedules for k in range(replicates)]
    questions = load_synthetic(len(jobs), seed=seed, split=split)
    n_rounds = max(len(s.peers) for s in schedules)
    answers: list[list[list[str | None]]] = [[] for _ in jobs]
    records = [DebateRecord(q.id, []) for q in questions]
    for r in range(n_rounds):
        reqs, where = [], []
        for n, ((s, _), q) in enumerate(zip(jobs, questions)):
            if r >= len(s.peers):
                continue
            for a in range(len(s.peers[r])):
                peers = s.peers[r][a]
                meta = {"debate_id": f"synthetic/{q.id}", "question_id": q.id, "agent": a, "round": r,
                        "own_answer": answers[n][r - 1][a] if r else None,
                        "peer_answers": [answers[n][r - 1][j] for j in peers] if r else [],
                        "question_text": q.question}
                reqs.append(ChatRequest((ChatMessage("user", q.question),), temperature=s.temperature[r][a],
                                        top_p=s.top_p[r][a], max_tokens=4096, seed=seed * 1_000_003 + n * 97 + a * 7 + r,
                                        metadata=meta))
                where.append((n, a))
        comps = backend.generate(reqs)
        for n in {n for n, _ in where}:
            answers[n].append([None] * len(jobs[n][0].peers[r]))
            records[n].rounds.append([])
        for (n, a), req, c in zip(where, reqs, comps):
            m = BOXED.findall(c.text)
            ans = m[-1] if m else None
            answers[n][r][a] = ans
            records[n].rounds[r].append(Turn(a, ans, ans == questions[n].gold, req.temperature, req.top_p,
                                             tuple(jobs[n][0].peers[r][a])))
    return records


def random_schedules(n: int, n_agents: int = 3, rounds: int = 1, mask_p: float = 0.5, t_min: float = 0.1,
                     t_max: float = 1.2, seed: int = 0, temperature0: float = 0.7, top_p: float = 0.9) -> list[Schedule]:
    """n random schedules: round 0 at temperature0, then random masks (each ordered pair read with probability
    mask_p) and per-agent temperatures in [t_min, t_max] in every exchange round."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        temps = [tuple([temperature0] * n_agents)]
        peers = [tuple(() for _ in range(n_agents))]
        for _ in range(rounds):
            mask = rng.random((n_agents, n_agents)) < mask_p
            np.fill_diagonal(mask, False)
            peers.append(tuple(tuple(int(j) for j in np.flatnonzero(mask[i])) for i in range(n_agents)))
            temps.append(tuple(float(t) for t in rng.uniform(t_min, t_max, n_agents)))
        out.append(Schedule(tuple(temps), tuple(tuple([top_p] * n_agents) for _ in temps), tuple(peers)))
    return out
