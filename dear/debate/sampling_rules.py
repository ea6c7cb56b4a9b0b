"""Sampling rules over one question's independent samples, read in draw order (a prefix of a wide round 0):

- `cot`: the first sample; `sc-k`: the plurality over the first k (sc-3 is the round-0 majority of 3 agents);
- `adaptive-sc-a`: start from the first `start` samples (the debates' V, default 3), add one sample at a time
  until `a` samples share an answer or all are used, then the plurality over those used — the decisions of
  `dear.debate.protocols.SamplingRuleProtocol`. Its fresh sample k sends round-0 agent k's request (same messages,
  sampling and seed), so on a backend whose answer depends only on the request, as a real model's does, it is that
  sample (tests/dear/debate/test_sampling_rules.py); the sim backend draws a fresh turn from the drawing agent's own
  random stream, so there it is the same only in distribution;
- `adaptive-sc-A-from-S`: the same with an explicit start: the first S samples, then one at a time until A share an
  answer or all are used; the plurality over those used (`adaptive-sc-A` is `adaptive-sc-A-from-3`);
- `esc-W` (ESC, Li et al. 2024, early-stopping self-consistency): draw windows of W samples; stop after the first
  window whose W answers are all the same (none missing); the plurality over every sample drawn (all samples when
  no window is unanimous).

Rules that read the samples' confidences (`Samples.confidence`, one scalar per sample, higher = more confident;
their parameters in `RuleParams`):
- `cisc-K` (CISC, Taubenfeld et al. 2025, confidence-informed SC): the first K samples, each voting with weight
  softmax(confidence / tau) over the K;
- `confident-stop` (ReASC / DeepConf online): draw one sample; if it has an answer and its confidence is at least
  `threshold`, stop with its answer; else go on as adaptive SC from that one sample until `agree` share an answer
  (or all are used), and vote over those used with the CISC weights.
A sample without a confidence (None) weighs as the least confident sample it votes with (all None: equal weights)
and never clears the threshold.

A rule's score is its vote's expected correctness over tied leaders (`dear.vote`, the project's tie rule; weighted
votes through `weighted_tally`); its tokens are prompt + completion of the samples it used. Used offline by
`simworld.sampling_validation` (real vs simulated samples), by `eval.run`'s adaptive self-consistency methods (on the
stored round 0) and by `eval.bank_replay` (on a sample bank, order-averaged by `dear.debate.replay_orders`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dear.confidence import record_of
from dear.debate.trace import AgentTurn, DebateTrace
from dear.vote import Tally, key_correct, tally, weighted_tally

ROUND0_AGENTS = 3  # the debates' V: adaptive rules start from this many samples unless told otherwise
# The confidence summary (dear.confidence.SUMMARIES) the confidence rules read from a turn, live and stored alike
RULE_SUMMARY = "mean_logprob"
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
    # One confidence scalar per sample (the summary the confidence rules read; None: that sample has none);
    # None: no confidences at all (the confidence rules refuse such samples).
    confidence: tuple[float | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.confidence is not None and len(self.confidence) != len(self.keys):
            raise ValueError(f"Samples: {len(self.confidence)} confidences for {len(self.keys)} samples")

    @classmethod
    def of(cls, trace: DebateTrace) -> Samples:
        """The samples of a trace's round 0."""
        return cls.of_turns(trace.rounds[0])

    @classmethod
    def of_turns(cls, turns: Sequence[AgentTurn]) -> Samples:
        """The turns as samples, with each one's `RULE_SUMMARY` confidence (None where the backend sent none: the
        turn's "missing" marker); no confidences at all when no turn asked for log-probabilities (a confidence rule
        then refuses them rather than count them equally)."""
        asked = any(t.confidence is not None for t in turns)
        return cls(tuple(t.answer_key for t in turns), tuple(bool(t.correct) for t in turns),
                   tuple(int(t.prompt_tokens + t.completion_tokens) for t in turns),
                   tuple(turn_confidence(t) for t in turns) if asked else None)


def turn_confidence(turn: AgentTurn) -> float | None:
    """A turn's `RULE_SUMMARY` confidence: None for a turn without log-probabilities (none asked, or a "missing"
    marker) or whose summary is undefined."""
    record = record_of(turn.confidence)
    return None if record is None else record.value(RULE_SUMMARY)


@dataclass(frozen=True)
class Outcome:
    score: float  # expected correctness of the plurality over the samples used (ties 1/k)
    used: int  # samples used
    tokens: int


def rules_for(width: int) -> list[str]:
    """The rules a width supports: cot, sc-3/5/width, adaptive-sc-2/3."""
    sc = sorted({k for k in (ROUND0_AGENTS, 5, width) if k <= width})
    return ["cot"] + [f"sc-{k}" for k in sc] + [f"adaptive-sc-{a}" for a in (2, 3) if width >= ROUND0_AGENTS]


CONFIDENT_STOP = "confident-stop"
_FROM = re.compile(r"adaptive-sc-(\d+)-from-(\d+)")
KNOWN = "cot, sc-K, adaptive-sc-A, adaptive-sc-A-from-S, esc-W, cisc-K, confident-stop"


@dataclass(frozen=True)
class RuleParams:
    """The confidence rules' parameters (fitted on training questions by `dear.debate.replay_orders`)."""

    tau: float = 0.1  # CISC softmax temperature, in the confidence's units (mean log-probs differ by ~0.1)
    threshold: float = math.inf  # confident-stop: a first sample at least this confident ends the draw (inf: never)
    agree: int = 2  # confident-stop: after an unconfident first sample, draw until this many share an answer

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"RuleParams: tau must be > 0, got {self.tau}")


DEFAULT_PARAMS = RuleParams()
# The confidence rules' parameters fitted on GSM8K train questions (eval.bank_replay --params-out): what eval.run and
# dear.serve run cisc-K and confident-stop with unless told otherwise, on every benchmark (zero-shot, as the policy)
DEFAULT_RULE_PARAMS = Path(__file__).resolve().parents[2] / "configs" / "rule-params-gsm8k-train.json"


@dataclass(frozen=True)
class FittedParams:
    """Per-rule parameters fitted on training questions, with where they came from (a JSON file)."""

    rules: dict[str, RuleParams]
    summary: str  # the confidence summary they were fitted on
    provenance: dict[str, Any]  # command, fit shelf, questions, token price

    def of(self, rule: str) -> RuleParams:
        """The rule's parameters; a rule that reads no confidence needs none (DEFAULT_PARAMS)."""
        if not is_weighted(rule):
            return DEFAULT_PARAMS
        if rule not in self.rules:
            raise ValueError(f"no fitted parameters for rule {rule!r} (fitted: {', '.join(self.rules) or 'none'}); "
                             f"fit them with python -m eval.bank_replay --params-out FILE")
        return self.rules[rule]

    def to_json(self) -> str:
        rules = {name: {"tau": p.tau, "threshold": None if math.isinf(p.threshold) else p.threshold, "agree": p.agree}
                 for name, p in self.rules.items()}
        return json.dumps({"summary": self.summary, **self.provenance, "rules": rules}, indent=2) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> FittedParams:
        """Read a params file; a clear error naming the file for a missing file, a bad key or another summary than
        the one the rules read (`RULE_SUMMARY`)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"rule params file {path} does not exist; fit one with "
                                    "python -m eval.bank_replay --params-out FILE")
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("summary") != RULE_SUMMARY:
            raise ValueError(f"{path}: fitted on confidence summary {d.get('summary')!r}; the rules read "
                             f"{RULE_SUMMARY!r}")
        rules = {}
        for name, p in d.get("rules", {}).items():
            try:
                threshold = math.inf if p.get("threshold") is None else float(p["threshold"])
                rules[name] = RuleParams(tau=float(p["tau"]), threshold=threshold, agree=int(p.get("agree", 2)))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: rules.{name}: {e}") from None
        return cls(rules, d["summary"], {k: v for k, v in d.items() if k not in ("summary", "rules")})


def _unknown(rule: str) -> ValueError:
    return ValueError(f"unknown rule {rule!r}; known: {KNOWN}")


def _adaptive_used(keys: Sequence[str | None], agree: int, start: int) -> int:
    """Samples read by adaptive SC: the first `start`, then one more until `agree` share an answer or none is left."""
    n = min(start, len(keys))
    while n < len(keys) and tally(keys[:n]).top < agree:
        n += 1
    return n


def _esc_used(keys: Sequence[str | None], window: int) -> int:
    """Samples read by ESC: whole windows up to the first unanimous one (an answer in every slot); else all."""
    for end in range(window, len(keys) + 1, window):
        first = keys[end - window]
        if first is not None and all(k == first for k in keys[end - window:end]):
            return end
    return len(keys)


def _prefix(s: Samples, rule: str, k: int) -> int:
    if k > len(s.keys):
        raise ValueError(f"rule {rule!r} needs {k} samples, the question has {len(s.keys)}")
    return k


def confidences(s: Samples, rule: str) -> tuple[float | None, ...]:
    """The samples' confidences, which `rule` reads: an error naming it when the samples carry none."""
    if s.confidence is None:
        raise ValueError(f"rule {rule!r} reads confidences; these samples have none")
    return s.confidence


def stops_at_first(s: Samples, threshold: float) -> bool:
    """confident-stop's test: the first sample has an answer and a confidence of at least `threshold`."""
    if not s.keys:
        return False
    c = confidences(s, CONFIDENT_STOP)[0]
    return s.keys[0] is not None and c is not None and c >= threshold


def samples_used(s: Samples, rule: str, start: int = ROUND0_AGENTS, params: RuleParams = DEFAULT_PARAMS) -> int:
    """How many of the samples (a prefix) a rule reads; `adaptive-sc-A` starts from the first `start`."""
    if rule == "cot":
        return 1
    if rule == CONFIDENT_STOP:
        return 1 if stops_at_first(s, params.threshold) else _adaptive_used(s.keys, params.agree, 1)
    if m := _FROM.fullmatch(rule):
        agree, first = int(m[1]), int(m[2])
        if first < 1:
            raise ValueError(f"rule {rule!r}: start from at least 1 sample")
        return _adaptive_used(s.keys, agree, first)
    name, _, arg = rule.rpartition("-")
    if name not in ("sc", "adaptive-sc", "esc", "cisc") or not arg.isdigit():
        raise _unknown(rule)
    k = int(arg)
    if name == "sc":
        return _prefix(s, rule, k)
    if name == "adaptive-sc":
        return _adaptive_used(s.keys, k, start)
    if k < 1:
        raise ValueError(f"rule {rule!r}: needs at least 1 sample")
    return _esc_used(s.keys, k) if name == "esc" else _prefix(s, rule, k)


def rule_start(rule: str, start: int = ROUND0_AGENTS) -> int:
    """The samples a rule draws before its first decision: 1 for `cot` and `confident-stop`, S for
    `adaptive-sc-A-from-S`, `start` for `adaptive-sc-A`, one window for `esc-W`, and K for `sc-K` / `cisc-K`
    (they decide nothing: they draw all K at once)."""
    if rule in ("cot", CONFIDENT_STOP):
        return 1
    if m := _FROM.fullmatch(rule):
        return int(m[2])
    name, _, arg = rule.rpartition("-")
    if name not in ("sc", "adaptive-sc", "esc", "cisc") or not arg.isdigit():
        raise _unknown(rule)
    return start if name == "adaptive-sc" else int(arg)


def samples_needed(rule: str, start: int = ROUND0_AGENTS) -> int:
    """The fewest samples a rule must be able to read to make its decisions: its start and the agreement it waits
    for (`adaptive-sc-A`: A; `confident-stop`: 2, the unconfident first sample and one that agrees), one ESC window,
    or all K of `sc-K` / `cisc-K`."""
    first = rule_start(rule, start)
    if m := _FROM.fullmatch(rule):
        return max(int(m[1]), first)
    if rule == CONFIDENT_STOP:
        return DEFAULT_PARAMS.agree
    name, _, arg = rule.rpartition("-")
    return max(int(arg), first) if name == "adaptive-sc" else first


# An answer no sample can share (the draw that might come next): a rule reading it would have to go on
_UNSEEN = Samples((None,), (False,), (0,), (None,))


def rule_done(s: Samples, rule: str, start: int = ROUND0_AGENTS, params: RuleParams = DEFAULT_PARAMS) -> bool:
    """Whether a rule that has drawn the samples `s` (in draw order) stops there: it reads no further sample even
    when one more could be drawn. This is `samples_used` itself, asked with one unseen sample appended, so a live
    draw stops exactly where the replay of the same samples does (`sc-K` / `cisc-K`: once K are drawn)."""
    name, _, arg = rule.rpartition("-")
    if name in ("sc", "cisc") and arg.isdigit():
        return len(s.keys) >= int(arg)
    more = Samples(s.keys + _UNSEEN.keys, s.correct + _UNSEEN.correct, s.tokens + _UNSEEN.tokens,
                   None if s.confidence is None else s.confidence + _UNSEEN.confidence)
    return samples_used(more, rule, start, params) <= len(s.keys)


def cisc_weights(confidence: Sequence[float | None], tau: float) -> list[float]:
    """softmax(confidence / tau) over the voting samples; a missing confidence counts as the lowest present one
    (the least weight), and equal weights when none is present."""
    present = [c for c in confidence if c is not None]
    floor = min(present, default=0.0)
    z = [(floor if c is None else c) / tau for c in confidence]
    top = max(z, default=0.0)
    e = [math.exp(x - top) for x in z]  # shifted by the largest: no overflow, same softmax
    total = sum(e)
    return [x / total for x in e]


def is_weighted(rule: str) -> bool:
    """Whether the rule's vote weighs samples by confidence (cisc-K, confident-stop) rather than counting them."""
    return rule == CONFIDENT_STOP or rule.startswith("cisc-")


def _votes(s: Samples, rule: str, n: int, params: RuleParams) -> Tally:
    keys = s.keys[:n]
    if not is_weighted(rule):
        return tally(keys)
    return weighted_tally(keys, cisc_weights(confidences(s, rule)[:n], params.tau))


def rule_outcome(s: Samples, rule: str, start: int = ROUND0_AGENTS, params: RuleParams = DEFAULT_PARAMS) -> Outcome:
    """The rule's vote over the samples it uses: score (ties as expected values), samples used, their tokens."""
    n = samples_used(s, rule, start, params)
    keys, correct = s.keys[:n], s.correct[:n]
    return Outcome(_votes(s, rule, n, params).score(key_correct(keys, correct)), n, int(sum(s.tokens[:n])))
