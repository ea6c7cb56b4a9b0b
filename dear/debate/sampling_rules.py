"""Sampling rules over one question's independent samples, read in draw order (a prefix of a wide round 0):

- `cot`: the first sample; `sc-k`: the plurality over the first k (sc-3 is the round-0 majority of 3 agents);
- `adaptive-sc-a`: start from the first `start` samples (the debates' V, default 3), add one sample at a time
  until `a` samples share an answer or all are used, then the plurality over those used — the decisions of
  `dear.debate.protocols.AdaptiveSCProtocol`. Its fresh sample k sends round-0 agent k's request (same messages,
  sampling and seed), so on a backend whose answer depends only on the request, as a real model's does, it is that
  sample (tests/dear/debate/test_sampling_rules.py); the sim backend draws a fresh turn from the drawing agent's own
  random stream, so there it is the same only in distribution.

A rule's score is its vote's expected correctness over tied leaders (`dear.vote`, the project's tie rule); its
tokens are prompt + completion of the samples it used. Used offline by `simworld.sampling_validation` (real vs
simulated samples) and by `eval.run`'s adaptive self-consistency methods (on the stored round 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dear.debate.trace import AgentTurn, DebateTrace
from dear.vote import key_correct, tally

ROUND0_AGENTS = 3  # the debates' V: adaptive rules start from this many samples unless told otherwise
# How a round's answers agree: what a regulator sees after round 0 (simworld.sampling_validation, policy_states)
AGREEMENT_STATES = ("unanimous", "two agree", "all differ")


def agreement_of(keys: Sequence[str | None]) -> str:
    """All answers alike, at least two alike, or all different (a no-answer agrees with nobody)."""
    top = tally(keys).top
    return AGREEMENT_STATES[0] if top == len(keys) else AGREEMENT_STATES[1] if top >= 2 else AGREEMENT_STATES[2]


@dataclass(frozen=True)
class Samples:
    """One question's independent samples, in draw order."""

    keys: tuple[str | None, ...]
    correct: tuple[bool, ...]
    tokens: tuple[int, ...]  # prompt + completion per sample

    @classmethod
    def of(cls, trace: DebateTrace) -> Samples:
        """The samples of a trace's round 0."""
        return cls.of_turns(trace.rounds[0])

    @classmethod
    def of_turns(cls, turns: Sequence[AgentTurn]) -> Samples:
        return cls(tuple(t.answer_key for t in turns), tuple(bool(t.correct) for t in turns),
                   tuple(int(t.prompt_tokens + t.completion_tokens) for t in turns))


@dataclass(frozen=True)
class Outcome:
    score: float  # expected correctness of the plurality over the samples used (ties 1/k)
    used: int  # samples used
    tokens: int


def rules_for(width: int) -> list[str]:
    """The rules a width supports: cot, sc-3/5/width, adaptive-sc-2/3."""
    sc = sorted({k for k in (ROUND0_AGENTS, 5, width) if k <= width})
    return ["cot"] + [f"sc-{k}" for k in sc] + [f"adaptive-sc-{a}" for a in (2, 3) if width >= ROUND0_AGENTS]


def samples_used(s: Samples, rule: str, start: int = ROUND0_AGENTS) -> int:
    """How many of the samples (a prefix) a rule reads; adaptive rules start from the first `start`."""
    if rule == "cot":
        return 1
    name, _, arg = rule.rpartition("-")
    if name not in ("sc", "adaptive-sc") or not arg.isdigit():
        raise ValueError(f"unknown rule {rule!r}; known: cot, sc-K, adaptive-sc-A")
    k = int(arg)
    if name == "sc":
        if k > len(s.keys):
            raise ValueError(f"rule {rule!r} needs {k} samples, the question has {len(s.keys)}")
        return k
    n = min(start, len(s.keys))
    while n < len(s.keys) and tally(s.keys[:n]).top < k:
        n += 1
    return n


def rule_outcome(s: Samples, rule: str, start: int = ROUND0_AGENTS) -> Outcome:
    """The rule's vote over the samples it uses: score (ties as expected values), samples used, their tokens."""
    n = samples_used(s, rule, start)
    keys, correct = s.keys[:n], s.correct[:n]
    return Outcome(tally(keys).score(key_correct(keys, correct)), n, int(sum(s.tokens[:n])))
