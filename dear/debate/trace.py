"""JSON-serialisable record of a debate: every prompt, completion, parsed answer, mask, sampling and token count.

The metrics (dear/metrics.py) and the evaluation read these traces; the helper arrays give them the plain
rounds x agents views they work on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from dear.vote import VoteResult, key_correct, tally


# The finish reason of a turn whose agent has not answered yet: a debate that starts from fewer samples than agents
# (DebateConfig.start_width) seats the others waiting, with no call, no text and no answer, until a fresh turn.
WAITING = "waiting"

# AgentTurn fields written only when set (they came later; older traces and debates without profiles lack them).
_UNSET_WHEN_NONE = ("profile", "style", "confidence", "source", "program")


@dataclass
class AgentTurn:
    """One agent's call in one round."""

    agent: int
    round: int
    messages: list[dict[str, str]]  # the exact chat sent: [{"role": ..., "content": ...}, ...]
    text: str  # raw completion text ("" when the backend failed)
    reasoning: str  # parsed reasoning section (never empty; feeds the encoder)
    conclusion: str  # parsed one-sentence conclusion (never empty; feeds the encoder)
    answer: str | None  # extracted answer, None when nothing parsable
    answer_key: str | None  # normalised key used for voting
    correct: bool
    grader: str
    temperature: float
    top_p: float
    seed: int
    peers: list[int]  # agents whose previous answers were shown in this prompt (empty in round 0)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    latency_s: float
    error: str | None = None
    truncated_peers: int = 0  # peer blocks whose reasoning was cut to fit the context window
    cached: bool = False
    model_id: str = ""
    max_tokens: int = 0
    reused_prompt_tokens: int = 0  # of prompt_tokens, those the server reused from its KV cache
    guidance: str | None = None  # extra instruction appended to this turn's prompt (e.g. an intervention's advice)
    # What peers are shown of this turn instead of its reasoning and conclusion (a moderator's demotion).
    peer_summary: str | None = None
    attempt: int = 0  # 1 for a round regenerated once (its seed differs from the discarded attempt's)
    silent: bool = False  # no model call: the agent read nobody and kept its previous turn (DebateConfig.silent)
    fresh: bool = False  # an independent sample from the question alone (a "fresh" turn, RoundControl.kinds)
    # The agent's profile (dear/debate/profiles.py) in its compact form, e.g. "smoke:direct:64", and its reply
    # style; None in debates without profiles, and then left out of the JSON (traces stay as they were).
    profile: str | None = None
    style: str | None = None
    # The model's own confidence in this completion (dear/confidence.py: summaries + compact per-token arrays, or
    # {"missing": reason}); None when the debate did not ask for it (and then left out of the JSON).
    confidence: dict[str, Any] | None = None
    # Where the completion came from when not the debate's own model call: "bank:<shelf>#<index>" (a replayed real
    # sample, dear/bank/backend.py) or the live model behind a bank world; None = generated (left out of the JSON).
    source: str | None = None
    # A program-of-thought turn's program and what became of it in the sandbox (dear.debate.pot.PotRun.to_dict():
    # code, stdout/stderr capped, exit status, run time, verdict, the answer line it printed); None for the other
    # reply styles and a failed call (and then left out of the JSON). Re-grading reads it instead of running again.
    program: dict[str, Any] | None = None

    @property
    def waiting(self) -> bool:
        """The agent has not answered yet (no call so far: DebateConfig.start_width)."""
        return self.finish_reason == WAITING

    @property
    def computed_prompt_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.reused_prompt_tokens)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentTurn:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"AgentTurn.from_dict: unknown keys {sorted(unknown)}")
        return cls(**d)


@dataclass
class ExtraCall:
    """One call an intervention made outside the debaters' turns (judge, feedback, moderator), a debater
    round it threw away (regenerate), or the agenda stage a round ran in (no call: 0 tokens); its tokens are
    counted apart from the debaters'."""

    kind: str  # "judge" | "policy" | "moderator" | "regenerate" | "agenda"
    round: int  # the debate round it concerns
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # raw completion ("" for a discarded round)
    result: dict[str, Any] = field(default_factory=dict)  # parsed outcome (verdict, advice, rating, ...)
    agent: int | None = None  # the rated agent (moderator)
    error: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtraCall:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"ExtraCall.from_dict: unknown keys {sorted(unknown)}")
        return cls(**d)


@dataclass
class DebateTrace:
    debate_id: str
    question_id: str
    task: str
    question: str
    gold: str
    kind: str
    model_ids: list[str]  # per agent
    seed: int = 0
    protocol: str = ""
    rounds: list[list[AgentTurn]] = field(default_factory=list)  # rounds[r][agent]
    final_answer: str | None = None  # the vote's seeded pick among its leaders (the answer a user gets)
    final_correct: bool = False  # that pick is correct (secondary accuracy)
    tie: bool = False
    vote_counts: dict[str, int] = field(default_factory=dict)
    failed: bool = False
    error: str | None = None
    prompt_tokens: int = 0  # debaters' calls of the kept rounds
    completion_tokens: int = 0
    # Interventions (dear/debate/interventions/): their extra calls, the rounds they replaced, their tokens.
    extra_calls: list[ExtraCall] = field(default_factory=list)
    discarded_rounds: list[list[AgentTurn]] = field(default_factory=list)
    extra_prompt_tokens: int = 0
    extra_completion_tokens: int = 0
    # Expected correctness of the final vote over its tied leaders (dear.vote): the primary accuracy. None only
    # in traces written before it was recorded (`final_expected` then recomputes it from the last round).
    final_score: float | None = None
    # Which pool profile each agent ran (agent i = `DebateConfig.agent_profiles[pool_order[i]]`), when the pool's
    # order was shuffled for this debate; None = agent i ran profile i (and the key is not written).
    pool_order: list[int] | None = None
    # The final vote's rule (dear.debate.engine.DECISIONS), the paper's "last-round" included. None only in a trace
    # that never voted, or in one written before every rule was recorded (a last-round vote then left it unset);
    # `dear.debate.regrade` re-votes such a trace only by a rule it is given (eval.regrade --vote-rule), never a
    # guessed one.
    decision: str | None = None
    # A confidence-weighted vote's softmax temperature (DebateConfig.vote_tau); None (and not written) otherwise.
    vote_tau: float | None = None

    @property
    def total_tokens(self) -> int:
        """Debaters' tokens only; `extra_tokens` holds what interventions cost on top."""
        return self.prompt_tokens + self.completion_tokens

    def set_vote(self, v: VoteResult | None) -> None:
        """Record the final vote (None: no trustworthy answer, e.g. a failed debate, which scores 0)."""
        if v is None:
            self.final_answer, self.final_correct, self.tie = None, False, False
            self.vote_counts, self.final_score = {}, 0.0
            return
        self.final_answer, self.final_correct, self.tie = v.answer, bool(v.correct), bool(v.tie)
        self.vote_counts, self.final_score = dict(v.counts), float(v.score)

    @property
    def final_expected(self) -> float:
        """The primary accuracy of this debate: `final_score`, or for older traces the last round's plurality
        score over tied leaders (0 for a failed debate)."""
        if self.final_score is not None:
            return float(self.final_score)
        if self.failed or not self.rounds:
            return 0.0
        turns = self.rounds[-1]
        return tally([t.answer_key for t in turns]).score(key_correct([t.answer_key for t in turns],
                                                                      [t.correct for t in turns]))

    @property
    def extra_tokens(self) -> int:
        return self.extra_prompt_tokens + self.extra_completion_tokens

    def add_extra_call(self, call: ExtraCall) -> None:
        self.extra_calls.append(call)
        self.extra_prompt_tokens += call.prompt_tokens
        self.extra_completion_tokens += call.completion_tokens

    def drop_last_round(self) -> list[AgentTurn]:
        """Remove the last round (to run it again); its turns move to `discarded_rounds` and their tokens
        from the debaters' tally to the extra one (an ExtraCall of kind "regenerate")."""
        if len(self.rounds) < 2:
            raise ValueError(f"drop_last_round: debate {self.debate_id} has no exchange round to drop")
        turns = self.rounds.pop()
        p, c = sum(t.prompt_tokens for t in turns), sum(t.completion_tokens for t in turns)
        self.prompt_tokens -= p
        self.completion_tokens -= c
        self.discarded_rounds.append(turns)
        self.add_extra_call(ExtraCall("regenerate", turns[0].round if turns else len(self.rounds), p, c))
        return turns

    @property
    def n_agents(self) -> int:
        return len(self.model_ids)

    def add_round(self, turns: list[AgentTurn]) -> None:
        self.rounds.append(turns)
        self.prompt_tokens += sum(t.prompt_tokens for t in turns)
        self.completion_tokens += sum(t.completion_tokens for t in turns)

    # ---- plain arrays for metrics (rounds x agents) ----
    def answer_keys(self) -> list[list[str | None]]:
        return [[t.answer_key for t in turns] for turns in self.rounds]

    def correctness(self) -> np.ndarray:
        """(R+1, V) bool: agent's answer correct at each round."""
        return np.array([[t.correct for t in turns] for turns in self.rounds], dtype=bool).reshape(
            len(self.rounds), self.n_agents
        )

    def masks(self) -> np.ndarray:
        """(R+1, V, V) bool: masks[r, i, j] = agent i was shown agent j's answer in round r (all False in r=0)."""
        out = np.zeros((len(self.rounds), self.n_agents, self.n_agents), dtype=bool)
        for r, turns in enumerate(self.rounds):
            for t in turns:
                out[r, t.agent, t.peers] = True
        return out

    def tokens_per_round(self) -> np.ndarray:
        """(R+1, V) int: prompt + completion tokens of each call."""
        return np.array(
            [[t.prompt_tokens + t.completion_tokens for t in turns] for turns in self.rounds], dtype=np.int64
        ).reshape(len(self.rounds), self.n_agents)

    # ---- serialisation ----
    def to_dict(self) -> dict[str, Any]:
        """Plain data; a turn without a profile has no profile keys, a debate in pool order no `pool_order` and one
        without a recorded vote rule no `decision`, one not confidence-weighted no `vote_tau` (an older trace is written again as it was, byte for byte)."""
        d = asdict(self)
        for key in ("pool_order", "decision", "vote_tau"):
            if d[key] is None:
                del d[key]
        for key in ("rounds", "discarded_rounds"):
            for turns in d[key]:
                for turn in turns:
                    for name in _UNSET_WHEN_NONE:
                        if turn[name] is None:
                            del turn[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DebateTrace:
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"DebateTrace.from_dict: unknown keys {sorted(unknown)}")
        d["rounds"] = [[AgentTurn.from_dict(t) for t in turns] for turns in d.get("rounds", [])]
        d["discarded_rounds"] = [[AgentTurn.from_dict(t) for t in turns] for turns in d.get("discarded_rounds", [])]
        d["extra_calls"] = [ExtraCall.from_dict(c) for c in d.get("extra_calls", [])]
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> DebateTrace:
        return cls.from_dict(json.loads(s))


def voting_turns(rounds: Sequence[Sequence[AgentTurn]], decision: str = "last-round") -> list[AgentTurn]:
    """The turns whose answers vote: the last round's, or (all-answers, belief-weighted) every turn that drew a new
    sample — round 0's answers (not its waiting seats), and each later turn that was sent (a silent turn's kept answer
    is not a new sample)."""
    if not rounds:
        return []
    if decision == "last-round":
        return list(rounds[-1])
    return [t for t in rounds[0] if not t.waiting] + [t for turns in rounds[1:] for t in turns if not t.silent]


def write_jsonl(traces: Iterable[DebateTrace], path: str | Path) -> int:
    """Write one trace per line; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for t in traces:
            f.write(t.to_json() + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> list[DebateTrace]:
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(DebateTrace.from_json(line))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a DebateTrace: {e}") from e
    return out
