"""How far any stop rule that reads the state can go: every rule of a family, replayed on a sample bank, chosen on
the reported questions themselves — an upper bound on the family, never a method.

    python -m eval.stop_bound --width 8 --out results/stop-bound-gsm8k-test-n200

A state is what the bank world's policy sees before it decides: n samples drawn, the leading answer held by k of
them, and the samples' confidences. Two families, each rule at the first sample stopping always, never, or when its
confidence (`--summary`) clears a threshold of the training grid (`dear.debate.replay_orders.threshold_grid` on the
fit shelf), and at n = width always:
- **count rules**: at n = 2 … width − 1 stop when k ≥ 1 (always), 2, 3 or never; scored with the plain vote and
  with the confidence-weighted vote (CISC, tau fitted for CISC-3 on the fit shelf);
- **share rules**: from n = 2 (or 3) on, stop when the confidence-weighted leader's share of the CISC weights is at
  least s (s = 0.5 … 1 by `SHARE_STEP`); scored with the weighted vote.
Every rule is replayed over the same seeded orders as `eval.bank_replay`. DEAR's bank-world policy reads these
states (its stop and how many it draws; every agent's confidence), so where no rule reaches the goal of `eval.goal`
even chosen on the test questions, a policy reaching it would have to read more than these states hold.

Writes OUT/bound.md (per family the best rule within the goal's token budget, with its paired 95 % interval against
adaptive SC from 2 until 2 agree; the joint accuracy–token frontier up to the baseline's tokens) and OUT/bound.csv
(the frontier).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dear import metrics
from dear.atomic import atomic_write_text
from dear.bank.store import Bank, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.replay_orders import ReplayQuestion, fit_tau, permuted, threshold_grid
from dear.debate.sampling_rules import cisc_weights
from dear.llm.registry import is_synthetic
from dear.vote import key_correct, tally, weighted_tally
from eval import goal
from eval.bank_replay import STOP_TAU_K, add_shelf_args, find_shelf, load

PROG = "python -m eval.stop_bound"
NEVER = math.inf  # a leader count no state reaches: never stop there
LATER_CHOICES = (1, 2, 3, NEVER)  # stop at n >= 2 when the leader holds at least this many samples
SHARE_STEP = 0.025  # the share rules' grid of s
SHARE_FROM = (2, 3)  # the share rules' first n


@dataclass(frozen=True)
class Paths:
    """Every (question, order) debate drawn to the end: per draw n = 1 … width, the leader's count, the score of
    stopping there (plain and confidence-weighted vote, ties as expected values) and the tokens so far; plus the
    first sample's confidence (-inf when it has none or no answer) and the question each debate belongs to."""

    leader: np.ndarray  # (debates, width)
    share: np.ndarray  # the confidence-weighted leader's share of the CISC weights
    plain: np.ndarray
    weighted: np.ndarray
    tokens: np.ndarray
    first_confidence: np.ndarray  # (debates,)
    question: np.ndarray  # (debates,) question index


def paths_of(questions: Sequence[ReplayQuestion], tau: float) -> Paths:
    names = ("leader", "share", "plain", "weighted", "tokens", "first", "question")
    rows: dict[str, list] = {k: [] for k in names}
    for qi, q in enumerate(questions):
        for order in q.orders:
            s = permuted(q.samples, order)
            conf = s.confidence or (None,) * len(s.keys)
            leader, share, plain, weighted, tokens = [], [], [], [], []
            for n in range(1, len(s.keys) + 1):
                keys, right = list(s.keys[:n]), key_correct(list(s.keys[:n]), list(s.correct[:n]))
                weights = cisc_weights(conf[:n], tau)
                leader.append(tally(keys).top)
                share.append(leader_share(keys, weights))
                plain.append(tally(keys).score(right))
                weighted.append(weighted_tally(keys, weights).score(right))
                tokens.append(sum(s.tokens[:n]))
            first = conf[0] if s.keys[0] is not None and conf[0] is not None else -math.inf
            for k, v in zip(names, (leader, share, plain, weighted, tokens, first, qi)):
                rows[k].append(v)
    return Paths(*(np.asarray(rows[k], dtype=float) for k in names[:-1]), np.asarray(rows["question"], dtype=int))


def leader_share(keys: Sequence[str | None], weights: Sequence[float]) -> float:
    """The heaviest answer's share of all the voters' weight (a voter without an answer dilutes it; 0: none)."""
    mass: dict[str, float] = {}
    for k, w in zip(keys, weights):
        if k is not None:
            mass[k] = mass.get(k, 0.0) + w
    return max(mass.values(), default=0.0) / (sum(weights) or 1.0)


@dataclass(frozen=True)
class StopRule:
    """Stop at the first sample when its confidence >= `first` (-inf: always, inf: never); at draw n >= 2 when the
    leader holds >= `later[n - 2]` samples; at the last draw always. `weighted`: the vote at the stop."""

    first: float
    later: tuple[float, ...]
    weighted: bool

    def describe(self, levels: dict[float, str]) -> str:
        first = {-math.inf: "always", math.inf: "never"}.get(self.first, f"conf ≥ {levels.get(self.first, '')}")
        later = " ".join("–" if x == NEVER else "any" if x == 1 else f"≥{x:.0f}" for x in self.later)
        return f"n=1: {first}; n=2…: {later}; {'weighted' if self.weighted else 'plain'} vote"


@dataclass(frozen=True)
class ShareRule:
    """Stop at the first sample when its confidence >= `first`; from draw `start` on when the confidence-weighted
    leader's share >= `share`; at the last draw always. Votes with the weights."""

    first: float
    share: float
    start: int
    weighted: bool = True

    def describe(self, levels: dict[float, str]) -> str:
        first = {-math.inf: "always", math.inf: "never"}.get(self.first, f"conf ≥ {levels.get(self.first, '')}")
        return f"n=1: {first}; from n={self.start}: weighted share ≥ {self.share:.3g}; weighted vote"


def stop_index(p: Paths, rule: StopRule | ShareRule) -> np.ndarray:
    """Each debate's draw index (0-based) at which the rule stops."""
    if isinstance(rule, ShareRule):
        stop = p.share >= rule.share
        stop[:, :rule.start - 1] = False
    else:
        stop = p.leader >= np.array([NEVER, *rule.later, 1.0])[None, :]  # the first column: by confidence
    stop[:, 0] = p.first_confidence >= rule.first
    stop[:, -1] = True
    return stop.argmax(axis=1)


def per_question(p: Paths, values: np.ndarray) -> np.ndarray:
    """Order-averaged per question."""
    return np.bincount(p.question, weights=values) / np.bincount(p.question)


def outcome(p: Paths, rule: StopRule | ShareRule) -> tuple[np.ndarray, float]:
    """The rule's per-question order-averaged scores and its tokens per question."""
    idx, rows = stop_index(p, rule), np.arange(len(p.leader))
    scores = (p.weighted if rule.weighted else p.plain)[rows, idx]
    return per_question(p, scores), float(p.tokens[rows, idx].mean())


def families(width: int, thresholds: Sequence[float]) -> dict[str, list[StopRule | ShareRule]]:
    firsts = (-math.inf, *[t for t in thresholds if math.isfinite(t)], math.inf)
    shares = np.round(np.arange(0.5, 1.0 + 1e-9, SHARE_STEP), 6)
    return {"count rules": [StopRule(f, tuple(later), w) for f in firsts
                            for later in itertools.product(LATER_CHOICES, repeat=width - 2) for w in (False, True)],
            "share rules": [ShareRule(f, float(s), start) for f in firsts for s in shares for start in SHARE_FROM]}


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (accuracy, tokens) points no other beats in both, cheapest first (ties: the first)."""
    best, out = -math.inf, []
    for i in sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0])):
        if points[i][0] > best:
            out.append(i)
            best = points[i][0]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shelf_args(p, 8, "the shelf of the threshold grid and tau")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    require_at_least(a, 3, "width")
    require_at_least(a, 1, "orders", "n_boot")
    if a.width > 9:
        raise ValueError(f"--width {a.width}: the family grows 4^(width-2); at most 9")
    return a


@dataclass(frozen=True)
class ScoredRule:
    family: str
    rule: StopRule | ShareRule
    scores: np.ndarray  # per question, order-averaged
    tokens: float

    @property
    def accuracy(self) -> float:
        return float(self.scores.mean())


def best_within(scored: Sequence[ScoredRule], budget: float) -> ScoredRule | None:
    """The most accurate rule spending at most `budget` tokens per question (ties: the cheaper)."""
    within = [x for x in scored if x.tokens <= budget]
    return max(within, key=lambda x: (x.accuracy, -x.tokens)) if within else None


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    bank = Bank.open(a.bank)
    test_key = find_shelf(bank, a.benchmark, a.split, a.max_tokens)
    fit_key = find_shelf(bank, a.fit_benchmark or a.benchmark, a.fit_split, a.max_tokens)
    if fit_key == test_key:
        raise ValueError(f"--fit-split: the threshold grid would come from the reported shelf ({test_key.name})")
    test = load(bank, test_key, a.summary, a.width, a.orders, a.seed)
    fit = load(bank, fit_key, a.summary, a.width, a.orders, a.seed)
    tau = fit_tau(fit.questions, STOP_TAU_K).value
    grid = threshold_grid(fit.questions)
    paths = paths_of(test.questions, tau)
    scored = [ScoredRule(name, r, *outcome(paths, r)) for name, rules in families(a.width, grid).items() for r in rules]
    base_scores, base_tokens = outcome(paths, StopRule(math.inf, (2.0,) * (a.width - 2), False))  # adaptive SC
    levels = {t: f"{t:.4g}" for t in grid}
    budget = goal.TOKENS * base_tokens
    synthetic = is_synthetic(test.llm) or is_synthetic(fit.llm)
    source = ("SYNTHETIC: the shelves were generated by a simulated backend." if synthetic else
              f"Real replayed samples of `{bank.manifest['model_file']}` (bank `{shown_path(a.bank)}`), no model "
              "called, nothing synthetic.")
    counts = ", ".join(f"{sum(x.family == f for x in scored)} {f}" for f in dict.fromkeys(x.family for x in scored))
    lines = [f"# Every stop rule of two state families, chosen on the reported questions: {test_key.benchmark} "
             f"{test_key.split}", "", f"Command: `{command_line(PROG, argv)}`", "",
             f"{source} {counts} (module docstring) on `{test_key.name}` ({len(test.questions)} questions, first "
             f"{a.width} samples, {a.orders} seeded orders, seed {a.seed}); the first sample's thresholds are the "
             f"`{a.summary}` quantiles of `{fit_key.name}`, CISC tau {tau:g} fitted there. **Chosen on the reported "
             "questions: an upper bound on each family, not a method.**", "",
             f"Baseline, adaptive SC from 2 until 2 agree (the count rule that stops at k ≥ 2 from n = 2 on): "
             f"{100 * base_scores.mean():.1f} % at {base_tokens:.0f} tokens/question. Goal ({goal.BENCHMARK}): "
             f"{goal.text()}; token budget {budget:.0f}.", "",
             "| family | best rule within the budget | accuracy % | tokens/question | tokens / baseline's | − baseline, "
             "points [95 % CI] | goal met |", "|---|---|---:|---:|---:|---|:-:|"]
    for family in dict.fromkeys(x.family for x in scored):
        best = best_within([x for x in scored if x.family == family], budget)
        if best is None:
            lines.append(f"| {family} | none spends within the budget | | | | | no |")
            continue
        d = metrics.paired_bootstrap_diff(best.scores, base_scores, n_boot=a.n_boot, seed=a.seed)
        lines.append(f"| {family} | {best.rule.describe(levels)} | {100 * best.accuracy:.1f} | {best.tokens:.0f} | "
                     f"{best.tokens / base_tokens:.2f} | {100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] "
                     f"| {'yes' if goal.accuracy_ok(d) else '**no**'} |")
    points = [(x.accuracy, x.tokens) for x in scored]
    front = [scored[i] for i in frontier(points)]
    lines += ["", "Both families' joint accuracy–token frontier up to the baseline's tokens:", "",
              "| family | rule | accuracy % | tokens/question | tokens / baseline's |", "|---|---|---:|---:|---:|"]
    lines += [f"| {x.family} | {x.rule.describe(levels)} | {100 * x.accuracy:.1f} | {x.tokens:.0f} | "
              f"{x.tokens / base_tokens:.2f} |" for x in front if x.tokens <= 1.05 * base_tokens]
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "bound.md", "\n".join(lines) + "\n")
    with (a.out / "bound.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["family", "rule", "accuracy", "tokens_per_question", "tokens_over_baseline", "within_budget",
                    "synthetic"])
        for x in front:
            w.writerow([x.family, x.rule.describe(levels), x.accuracy, x.tokens, x.tokens / base_tokens,
                        x.tokens <= budget, synthetic])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
