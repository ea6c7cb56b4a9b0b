"""What the interventions did and cost over a set of traces, for the reports: `summarize_interventions` and
`judged_pairs` (each judge verdict with the two round outcomes FOCUS labels it by)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dear.debate.interventions.config import AGENDA_STAGES
from dear.debate.trace import DebateTrace


@dataclass
class InterventionSummary:
    """What the interventions did and cost over a set of traces."""

    n_debates: int
    calls: dict[str, int]  # extra calls by kind ("regenerate" = discarded debater rounds)
    tokens: dict[str, int]  # their prompt + completion tokens by kind
    debater_tokens: int  # kept debater turns
    judge_verdicts: int = 0  # judged round pairs, skipped ones (no call needed) included
    judge_skipped: int = 0
    judge_flagged: int = 0
    judge_malformed: int = 0
    policy_advice: int = 0
    policy_malformed: int = 0
    regenerated_rounds: int = 0
    moderator_rated: int = 0
    moderator_actions: dict[str, int] = field(default_factory=dict)
    moderator_malformed: int = 0
    stage_rounds: dict[str, int] = field(default_factory=dict)  # exchange rounds run in each agenda stage

    @property
    def extra_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def overhead(self) -> float:
        """Extra tokens / debater tokens."""
        return self.extra_tokens / self.debater_tokens if self.debater_tokens else math.nan

    @property
    def rejection_rate(self) -> float:
        """Share of rated answers the moderator ignored or demoted."""
        rejected = self.moderator_actions.get("ignore", 0) + self.moderator_actions.get("demote", 0)
        return rejected / self.moderator_rated if self.moderator_rated else math.nan

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"debates": self.n_debates, "debater_tokens": self.debater_tokens,
                               "extra_tokens": self.extra_tokens, "overhead": self.overhead}
        for k in sorted(self.calls):
            row[f"{k}_calls"], row[f"{k}_tokens"] = self.calls[k], self.tokens.get(k, 0)
        row.update(judge_verdicts=self.judge_verdicts, judge_skipped=self.judge_skipped, judge_flagged=self.judge_flagged,
                   judge_malformed=self.judge_malformed, policy_advice=self.policy_advice,
                   policy_malformed=self.policy_malformed, regenerated_rounds=self.regenerated_rounds,
                   moderator_rated=self.moderator_rated, moderator_malformed=self.moderator_malformed,
                   rejection_rate=self.rejection_rate)
        for a in ("accept", "ignore", "demote"):
            row[f"moderator_{a}"] = self.moderator_actions.get(a, 0)
        for s in AGENDA_STAGES:
            row[f"rounds_{s}"] = self.stage_rounds.get(s, 0)
        return row


def summarize_interventions(traces: Sequence[DebateTrace]) -> InterventionSummary:
    calls: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    s = InterventionSummary(len(traces), {}, {}, sum(t.total_tokens for t in traces))
    for t in traces:
        for c in t.extra_calls:
            if c.kind == "agenda":
                stages[c.result.get("stage", "?")] += 1
                continue
            skipped = bool(c.result.get("skipped"))
            if not skipped:
                calls[c.kind] += 1
                tokens[c.kind] += c.prompt_tokens + c.completion_tokens
            malformed = bool(c.result.get("malformed"))
            if c.kind == "judge":
                s.judge_verdicts += 1
                s.judge_skipped += int(skipped)
                s.judge_flagged += int(bool(c.result.get("drifted")))
                s.judge_malformed += int(malformed)
            elif c.kind == "policy":
                s.policy_advice += int(not malformed)
                s.policy_malformed += int(malformed)
            elif c.kind == "regenerate":
                s.regenerated_rounds += 1
            elif c.kind == "moderator":
                s.moderator_rated += 1
                s.moderator_malformed += int(malformed)
                actions[c.result.get("action", "?")] += 1
    return replace(s, calls=dict(calls), tokens=dict(tokens), moderator_actions=dict(actions),
                   stage_rounds=dict(stages))


def judged_pairs(traces: Sequence[DebateTrace]) -> list[tuple[bool, dict, dict]]:
    """(judge said drift, previous round's answers/correct, judged round's answers/correct) of every judge call,
    including calls on rounds that were later regenerated (their turns are in `discarded_rounds`)."""
    out = []
    for t in traces:
        for c in t.extra_calls:
            if c.kind == "judge" and "prev" in c.result and "cur" in c.result:
                out.append((bool(c.result.get("drifted")), c.result["prev"], c.result["cur"]))
    return out
