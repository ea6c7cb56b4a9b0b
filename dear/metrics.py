"""Debate metrics on plain per-debate arrays (docs/DESIGN.md §8). Floor 1: no project imports.

A debate is described by `ScoredDebate`: the answer key and the correctness of every agent in every round
(`answers[r][i]`, `correct[r][i]`), the final vote's score and the tokens. Keys are class representatives
(equivalent answers share one key: `dear.tasks.equivalence`). Single-call methods (single CoT,
self-consistency) are records with one round.

Conventions (the edge cases, stated once):
- No answer: an agent whose answer could not be parsed has key None. None never votes and is never the
  plurality; it counts as incorrect in accuracy and transitions; it has 0 agreeing peers; it is not "in the
  minority" and is left out of HCR/BCR (it holds no position that could conform or be corrected).
- Agreement: agent i's agreeing peers are the other agents with the same non-None key in the same round.
- One tie rule (dear.vote): a vote's score is the fraction of its tied leaders that are correct, the expected
  correctness of a uniform tie-break (1/k for a k-way tie holding the correct answer; deterministic, no RNG).
  It is the per-round group score and the final accuracy (`ScoredDebate.score`), so per-question scores are
  fractional where tied. A round where nobody answered scores 0. The debate's seeded pick (`final_correct`) is
  reported beside it as a secondary accuracy ("seeded tie pick"); ties are counted.
- A key is correct when any agent holding it was graded correct (agents with equal keys share a grade).
- HCR (harmful conformity rate): cases (agent i, round r -> r+1) where i is correct at r, i's key is held by
  fewer agents than the plurality key and no plurality key is correct; HCR = share of them wrong at r+1.
  BCR (beneficial correction rate): i is wrong at r (with an answer), in the minority, and every plurality
  key is correct; BCR = share of them correct at r+1. Mixed ties (some leaders right, some wrong) enter neither.
- Narrow HCR / BCR (the paper's reading): the same cases, but only agents that read at least one peer in round
  r+1 (a case needs ``peers_read``), and the change counted is adopting the round-r plurality's answer: narrow
  HCR = share of the correct-minority cases whose round-(r+1) answer is a (wrong) round-r plurality key;
  narrow BCR = share of the wrong-minority cases whose round-(r+1) answer is a (correct) plurality key.
- Truncation: an agent answer whose completion was cut at the token limit (finish_reason "length").
- Read density of round r >= 1: peers read / (V - 1), averaged over agents and debates.
- Drift (problem-drift paper, seed 000): s_r = per-round group score, FOCUS_r = s_r - s_{r-1}. Round r >= 1
  is drifted when s_r < max(s_0..s_{r-1}). A debate drifted when any round did; it recovered when a round after
  its first drift reaches the best score before that drift (as in the paper's code). Rounds spent drifted =
  the number of drifted rounds.
- Rates with an empty denominator are NaN (printed as "-"), never 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dear.vote import key_correct, tally

TRANSITIONS = ("C->C", "C->I", "I->C", "I->I")


# ---------------------------------------------------------------- records and small value types
@dataclass(frozen=True)
class ScoredDebate:
    """One debate (or one single-call method run) as plain arrays."""

    answers: Sequence[Sequence[str | None]]  # [round][agent] normalised answer key, None = no answer
    correct: Sequence[Sequence[bool]]  # [round][agent]
    final_correct: bool  # the final vote's seeded pick is correct (secondary accuracy)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tie: bool = False  # the final vote was decided by the seeded tie-break
    failed: bool = False  # the debate hit a backend error
    final_grader: str = "none"  # grader that decided the final answer ("none" when there was no answer)
    question_id: str = ""
    peers_read: Sequence[Sequence[int]] | None = None  # [round][agent] peers shown in the prompt (None = unknown)
    truncated: Sequence[Sequence[bool]] | None = None  # [round][agent] cut at the token limit (None = unknown)
    final_score: float | None = None  # the final vote's score over tied leaders (None: the last round's)

    def __post_init__(self) -> None:
        if len(self.answers) != len(self.correct):
            raise ValueError(
                f"ScoredDebate {self.question_id!r}: answers has {len(self.answers)} rounds, "
                f"correct has {len(self.correct)}"
            )
        for r, (a, c) in enumerate(zip(self.answers, self.correct)):
            if len(a) != len(c):
                raise ValueError(
                    f"ScoredDebate {self.question_id!r}: round {r} has {len(a)} answers but {len(c)} grades"
                )
        for name in ("peers_read", "truncated"):
            arr = getattr(self, name)
            if arr is not None and [len(x) for x in arr] != [len(a) for a in self.answers]:
                raise ValueError(f"ScoredDebate {self.question_id!r}: {name} does not have the answers' shape")

    @property
    def n_rounds(self) -> int:
        return len(self.answers)

    @property
    def score(self) -> float:
        """The primary accuracy of this debate: the final vote's expected correctness over tied leaders (given,
        or the last round's plurality score); 0 for a failed debate."""
        if self.final_score is not None:
            return float(self.final_score)
        if self.failed or not self.answers:
            return 0.0
        return round_vote(self.answers[-1], self.correct[-1]).score

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Ratio:
    """A rate with its numerator and denominator (so reports can show both)."""

    num: int
    den: int

    @property
    def rate(self) -> float:
        return self.num / self.den if self.den else math.nan

    def __add__(self, other: Ratio) -> Ratio:
        return Ratio(self.num + other.num, self.den + other.den)


@dataclass(frozen=True)
class CI:
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class RoundVote:
    leaders: tuple[str, ...]  # plurality keys (several on a tie; empty when nobody answered)
    top: int  # votes of each leader
    counts: dict[str, int]
    score: float  # fraction of leaders that are correct (0 when nobody answered)

    @property
    def tie(self) -> bool:
        return len(self.leaders) > 1


@dataclass(frozen=True)
class Conformity:
    hcr: Ratio
    bcr: Ratio


@dataclass(frozen=True)
class Drift:
    scores: np.ndarray  # (R+1,) per-round group score
    focus: np.ndarray  # (R,) FOCUS_r for r = 1..R
    drifted: bool
    first_drift_round: int | None
    recovered: bool
    rounds_drifted: int


# ---------------------------------------------------------------- per-round building blocks
def round_vote(keys: Sequence[str | None], correct: Sequence[bool]) -> RoundVote:
    """Plurality of one round (`dear.vote.tally`); ties are kept (all leaders), None never votes."""
    t = tally(keys)
    if not t.leaders:
        return RoundVote(leaders=(), top=0, counts={}, score=0.0)
    return RoundVote(leaders=t.leaders, top=t.top, counts=t.counts, score=t.score(key_correct(keys, correct)))


def round_scores(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> np.ndarray:
    """(R+1,) group score per round (plurality, fractional on ties)."""
    return np.array([round_vote(a, c).score for a, c in zip(answers, correct)], dtype=float)


def agreeing_peers(keys: Sequence[str | None]) -> np.ndarray:
    """(V,) number of *other* agents sharing each agent's key (0 for no answer)."""
    counts = tally(keys).counts
    return np.array([counts[k] - 1 if k is not None else 0 for k in keys], dtype=int)


def transitions(correct: Sequence[Sequence[bool]]) -> np.ndarray:
    """(R, 4) counts of agent transitions r -> r+1 in TRANSITIONS order (C->C, C->I, I->C, I->I)."""
    c = np.asarray(correct, dtype=bool)
    if c.ndim != 2 or c.shape[0] < 2:
        return np.zeros((0, 4), dtype=int)
    a, b = c[:-1], c[1:]
    return np.stack(
        [(a & b).sum(1), (a & ~b).sum(1), (~a & b).sum(1), (~a & ~b).sum(1)], axis=1
    ).astype(int)


def flips_by_agreement(
    answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]
) -> dict[int, Ratio]:
    """C->I among correct agents, keyed by how many peers shared the agent's answer at round r."""
    out: dict[int, Ratio] = {}
    for r in range(len(answers) - 1):
        peers = agreeing_peers(answers[r])
        for i, ok in enumerate(correct[r]):
            if ok:
                k = int(peers[i])
                out[k] = out.get(k, Ratio(0, 0)) + Ratio(int(not correct[r + 1][i]), 1)
    return out


@dataclass(frozen=True)
class _MinorityCase:
    """Agent `agent` holds a minority answer at round `round` under a plurality that is all right or all wrong."""

    round: int
    agent: int
    correct: bool  # the agent's minority answer is correct
    leaders: tuple[str, ...]  # the plurality's answer keys


def _minority_cases(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]):
    """The HCR/BCR candidates of one debate: a correct minority under a wrong plurality (HCR) and a wrong minority
    under a right plurality (BCR); mixed ties and agents without an answer enter neither."""
    for r in range(len(answers) - 1):
        keys, ok = answers[r], correct[r]
        vote = round_vote(keys, ok)
        kc = key_correct(keys, ok)
        leaders_right = [kc[k] for k in vote.leaders]
        plurality_wrong = bool(leaders_right) and not any(leaders_right)
        plurality_right = bool(leaders_right) and all(leaders_right)
        for i, k in enumerate(keys):
            if k is None or vote.counts[k] >= vote.top:
                continue  # no answer, or not in the minority
            if (ok[i] and plurality_wrong) or (not ok[i] and plurality_right):
                yield _MinorityCase(r, i, bool(ok[i]), tuple(vote.leaders))


def conformity(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> Conformity:
    """HCR and BCR counts of one debate (see the module docstring for the exact case definitions)."""
    hcr, bcr = Ratio(0, 0), Ratio(0, 0)
    for c in _minority_cases(answers, correct):
        nxt = bool(correct[c.round + 1][c.agent])
        if c.correct:
            hcr = hcr + Ratio(int(not nxt), 1)
        else:
            bcr = bcr + Ratio(int(nxt), 1)
    return Conformity(hcr=hcr, bcr=bcr)


def conformity_narrow(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]],
                      peers_read: Sequence[Sequence[int]]) -> Conformity:
    """Narrow HCR and BCR of one debate: only agents that read a peer; the change is adopting the plurality."""
    hcr, bcr = Ratio(0, 0), Ratio(0, 0)
    for c in _minority_cases(answers, correct):
        if peers_read[c.round + 1][c.agent] == 0:
            continue
        adopted = answers[c.round + 1][c.agent] in c.leaders
        if c.correct:
            hcr = hcr + Ratio(int(adopted), 1)
        else:
            bcr = bcr + Ratio(int(adopted), 1)
    return Conformity(hcr=hcr, bcr=bcr)


def drift(scores: Sequence[float]) -> Drift:
    """FOCUS, drift and recovery of one debate from its per-round group scores."""
    s = np.asarray(scores, dtype=float)
    focus = np.diff(s)
    first: int | None = None
    pre_drift_best = -math.inf
    recovered = False
    n_drifted = 0
    for r in range(1, len(s)):
        best = s[:r].max()
        if s[r] < best:
            n_drifted += 1
            if first is None:
                first, pre_drift_best = r, best
        elif first is not None and s[r] >= pre_drift_best:
            recovered = True
    return Drift(
        scores=s,
        focus=focus,
        drifted=first is not None,
        first_drift_round=first,
        recovered=recovered,
        rounds_drifted=n_drifted,
    )


# ---------------------------------------------------------------- drift detection (DRIFTJudge vs FOCUS)
def focus_drift_label(
    prev_answers: Sequence[str | None], prev_correct: Sequence[bool],
    cur_answers: Sequence[str | None], cur_correct: Sequence[bool],
) -> bool:
    """FOCUS-based label of one judged round pair: drifted when FOCUS = s_cur - s_prev < 0."""
    return round_vote(cur_answers, cur_correct).score < round_vote(prev_answers, prev_correct).score


@dataclass(frozen=True)
class Detection:
    """A binary detector (e.g. DRIFTJudge) against reference labels (e.g. FOCUS < 0)."""

    tp: int
    fp: int
    tn: int
    fn: int

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.tn + self.fn

    @property
    def precision(self) -> float:
        return Ratio(self.tp, self.tp + self.fp).rate

    @property
    def recall(self) -> float:
        return Ratio(self.tp, self.tp + self.fn).rate

    @property
    def specificity(self) -> float:
        return Ratio(self.tn, self.tn + self.fp).rate

    @property
    def accuracy(self) -> float:
        return Ratio(self.tp + self.tn, self.n).rate

    def to_row(self) -> dict[str, float | int]:
        return {"tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn, "precision": self.precision,
                "recall": self.recall, "specificity": self.specificity, "accuracy": self.accuracy}


def detection(predicted: Sequence[bool], actual: Sequence[bool]) -> Detection:
    """Confusion counts of `predicted` against `actual` (positive = drift); rates with no denominator are NaN."""
    if len(predicted) != len(actual):
        raise ValueError(f"detection: {len(predicted)} predictions for {len(actual)} labels")
    p, a = np.asarray(predicted, dtype=bool), np.asarray(actual, dtype=bool)
    return Detection(tp=int((p & a).sum()), fp=int((p & ~a).sum()), tn=int((~p & ~a).sum()),
                     fn=int((~p & a).sum()))


# ---------------------------------------------------------------- statistics
def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> CI:
    """Mean with a seeded percentile-bootstrap CI over items (questions). Empty input -> NaNs."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return CI(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return CI(float(x.mean()), float(lo), float(hi))


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> CI:
    """Mean of a - b over the same questions with a paired bootstrap CI."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape:
        raise ValueError(f"paired_bootstrap_diff: shapes differ {a_.shape} vs {b_.shape}")
    return bootstrap_ci(a_ - b_, n_boot=n_boot, level=level, seed=seed)


# ---------------------------------------------------------------- per-method summary
@dataclass
class MethodSummary:
    n: int
    accuracy: CI  # final score, ties as expected values (the primary accuracy)
    prompt_tokens: float
    completion_tokens: float
    total_tokens: CI
    n_rounds: int  # most rounds of any debate
    round_accuracy: list[float]  # mean group score per round (debates that reached the round)
    round_n: list[int]  # debates that reached each round
    transitions: np.ndarray  # (R, 4) summed counts
    flips_by_agreement: dict[int, Ratio]
    hcr: Ratio
    bcr: Ratio
    focus: list[float]  # mean FOCUS_r, r = 1..R
    drifted: Ratio  # drifted debates / debates with >= 2 rounds
    recovered: Ratio  # recovered / drifted
    mean_rounds_drifted: float  # over debates with >= 2 rounds
    improved: int  # debates with s_R > s_0
    degraded: int  # s_R < s_0
    failed: int
    final_ties: int
    round_ties: int  # tied per-round pluralities over all rounds
    no_answer: Ratio  # agent answers without a parsable answer / all agent answers
    graders: dict[str, int] = field(default_factory=dict)
    hcr_narrow: Ratio = Ratio(0, 0)  # agents that read >= 1 peer; harmful = adopting the wrong plurality
    bcr_narrow: Ratio = Ratio(0, 0)
    truncated: Ratio = Ratio(0, 0)  # agent answers cut at the token limit / all agent answers
    truncated_no_answer: Ratio = Ratio(0, 0)  # of the truncated ones, those without an answer
    read_density: list[float] = field(default_factory=list)  # rounds 1..R: peers read / (V-1)
    accuracy_seeded: CI = CI(math.nan, math.nan, math.nan)  # the seeded tie pick's accuracy (secondary)

    def to_row(self) -> dict[str, Any]:
        """Flat dict for summary.csv (rates as floats, with their numerators and denominators)."""
        row: dict[str, Any] = {
            "n": self.n,
            "accuracy": self.accuracy.mean,
            "acc_ci_low": self.accuracy.low,
            "acc_ci_high": self.accuracy.high,
            "accuracy_seeded_pick": self.accuracy_seeded.mean,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens.mean,
            "tokens_ci_low": self.total_tokens.low,
            "tokens_ci_high": self.total_tokens.high,
        }
        for r, acc in enumerate(self.round_accuracy):
            row[f"acc_round{r}"] = acc
        for r, counts in enumerate(self.transitions):
            for name, c in zip(TRANSITIONS, counts):
                row[f"r{r}->{r + 1} {name}"] = int(c)
        for k in sorted(self.flips_by_agreement):
            ratio = self.flips_by_agreement[k]
            row[f"C->I rate peers={k}"] = ratio.rate
            row[f"C->I peers={k} num"] = ratio.num
            row[f"C->I peers={k} den"] = ratio.den
        for name, ratio in (("hcr", self.hcr), ("bcr", self.bcr), ("hcr_narrow", self.hcr_narrow),
                            ("bcr_narrow", self.bcr_narrow), ("truncation", self.truncated),
                            ("truncated_no_answer", self.truncated_no_answer)):
            row[name], row[f"{name}_num"], row[f"{name}_den"] = ratio.rate, ratio.num, ratio.den
        for r, dens in enumerate(self.read_density, start=1):
            row[f"read_density_r{r}"] = dens
        for r, f in enumerate(self.focus, start=1):
            row[f"focus_r{r}"] = f
        row.update(
            drifted_pct=100 * self.drifted.rate,
            drifted_num=self.drifted.num,
            drifted_den=self.drifted.den,
            recovered_pct=100 * self.recovered.rate,
            recovered_num=self.recovered.num,
            mean_rounds_drifted=self.mean_rounds_drifted,
            improved=self.improved,
            degraded=self.degraded,
            failed=self.failed,
            final_ties=self.final_ties,
            round_ties=self.round_ties,
            no_answer_rate=self.no_answer.rate,
            no_answer_num=self.no_answer.num,
        )
        for g in sorted(self.graders):
            row[f"grader {g}"] = self.graders[g]
        return row


@dataclass
class _Totals:
    """The running sums `summarize` takes over one method's debate records."""

    n_rounds: int
    score_sum: np.ndarray
    score_n: np.ndarray
    trans: np.ndarray
    focus_sum: np.ndarray
    focus_n: np.ndarray
    read_sum: np.ndarray
    read_n: np.ndarray
    flips: dict[int, Ratio] = field(default_factory=dict)
    hcr: Ratio = Ratio(0, 0)
    bcr: Ratio = Ratio(0, 0)
    hcr_n: Ratio = Ratio(0, 0)
    bcr_n: Ratio = Ratio(0, 0)
    truncated: Ratio = Ratio(0, 0)
    truncated_none: Ratio = Ratio(0, 0)
    no_answer: Ratio = Ratio(0, 0)
    graders: Counter = field(default_factory=Counter)
    drifted: int = 0
    recovered: int = 0
    multi: int = 0
    rounds_drifted: int = 0
    improved: int = 0
    degraded: int = 0
    round_ties: int = 0

    @classmethod
    def zeros(cls, n_rounds: int) -> _Totals:
        x = max(n_rounds - 1, 0)  # exchange rounds
        return cls(n_rounds, np.zeros(n_rounds), np.zeros(n_rounds, dtype=int), np.zeros((x, 4), dtype=int),
                   np.zeros(x), np.zeros(x, dtype=int), np.zeros(x), np.zeros(x, dtype=int))

    def add(self, rec: ScoredDebate) -> None:
        """One debate: its per-round scores, ties, no-answers, truncations and grader, then its exchanges."""
        s = round_scores(rec.answers, rec.correct)
        self.score_sum[: len(s)] += s
        self.score_n[: len(s)] += 1
        self.round_ties += sum(int(round_vote(a, c).tie) for a, c in zip(rec.answers, rec.correct))
        self.no_answer = self.no_answer + Ratio(sum(k is None for a in rec.answers for k in a),
                                                sum(map(len, rec.answers)))
        self.graders[rec.final_grader] += 1
        if rec.truncated is not None:
            cut = [k for a, t in zip(rec.answers, rec.truncated) for k, c in zip(a, t) if c]
            self.truncated = self.truncated + Ratio(len(cut), sum(map(len, rec.answers)))
            self.truncated_none = self.truncated_none + Ratio(sum(k is None for k in cut), len(cut))
        if rec.n_rounds >= 2:
            self._add_exchanges(rec, s)

    def _add_exchanges(self, rec: ScoredDebate, s: np.ndarray) -> None:
        """What a debate of several rounds adds: reads, transitions, flips, conformity and drift."""
        if rec.peers_read is not None:
            conf_n = conformity_narrow(rec.answers, rec.correct, rec.peers_read)
            self.hcr_n, self.bcr_n = self.hcr_n + conf_n.hcr, self.bcr_n + conf_n.bcr
            v = len(rec.answers[0])
            for r, peers in enumerate(rec.peers_read[1:]):
                if v > 1:
                    self.read_sum[r] += float(np.mean(peers)) / (v - 1)
                    self.read_n[r] += 1
        t = transitions(rec.correct)
        self.trans[: len(t)] += t
        for k, ratio in flips_by_agreement(rec.answers, rec.correct).items():
            self.flips[k] = self.flips.get(k, Ratio(0, 0)) + ratio
        conf = conformity(rec.answers, rec.correct)
        self.hcr, self.bcr = self.hcr + conf.hcr, self.bcr + conf.bcr
        d = drift(s)
        self.focus_sum[: len(d.focus)] += d.focus
        self.focus_n[: len(d.focus)] += 1
        self.multi += 1
        self.drifted += int(d.drifted)
        self.recovered += int(d.recovered)
        self.rounds_drifted += d.rounds_drifted
        self.improved += int(s[-1] > s[0])
        self.degraded += int(s[-1] < s[0])


def summarize(records: Sequence[ScoredDebate], seed: int = 0, n_boot: int = 2000) -> MethodSummary:
    """All §8 metrics of one method on one benchmark."""
    if not records:
        raise ValueError("summarize: no debate records")
    t = _Totals.zeros(max(rec.n_rounds for rec in records))
    for rec in records:
        t.add(rec)
    with np.errstate(invalid="ignore", divide="ignore"):
        round_acc = np.where(t.score_n > 0, t.score_sum / np.maximum(t.score_n, 1), np.nan)
        focus = np.where(t.focus_n > 0, t.focus_sum / np.maximum(t.focus_n, 1), np.nan)
        density = np.where(t.read_n > 0, t.read_sum / np.maximum(t.read_n, 1), np.nan)
    return MethodSummary(
        n=len(records),
        accuracy=bootstrap_ci([r.score for r in records], n_boot=n_boot, seed=seed),
        accuracy_seeded=bootstrap_ci([float(r.final_correct) for r in records], n_boot=n_boot, seed=seed),
        prompt_tokens=float(np.mean([r.prompt_tokens for r in records])),
        completion_tokens=float(np.mean([r.completion_tokens for r in records])),
        total_tokens=bootstrap_ci([r.total_tokens for r in records], n_boot=n_boot, seed=seed),
        n_rounds=t.n_rounds,
        round_accuracy=[float(x) for x in round_acc],
        round_n=[int(x) for x in t.score_n],
        transitions=t.trans,
        flips_by_agreement=dict(sorted(t.flips.items())),
        hcr=t.hcr,
        bcr=t.bcr,
        focus=[float(x) for x in focus],
        drifted=Ratio(t.drifted, t.multi),
        recovered=Ratio(t.recovered, t.drifted),
        mean_rounds_drifted=t.rounds_drifted / t.multi if t.multi else math.nan,
        improved=t.improved,
        degraded=t.degraded,
        failed=sum(r.failed for r in records),
        final_ties=sum(r.tie for r in records),
        round_ties=t.round_ties,
        no_answer=t.no_answer,
        graders=dict(t.graders),
        hcr_narrow=t.hcr_n,
        bcr_narrow=t.bcr_n,
        truncated=t.truncated,
        truncated_no_answer=t.truncated_none,
        read_density=[float(x) for x in density],
    )


def wilson_ci(ratio: Ratio, level: float = 0.95) -> CI:
    """Wilson score interval of a proportion (well-behaved for small n and rates near 0 or 1)."""
    if ratio.den == 0:
        return CI(math.nan, math.nan, math.nan)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    n, p = ratio.den, ratio.num / ratio.den
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return CI(p, max(0.0, centre - half), min(1.0, centre + half))
