"""How far any stop rule that reads the state can go: every rule of a family, replayed on a sample bank, chosen on
the reported questions themselves — an upper bound on the family, never a method.

    python -m eval.stop_bound --width 8 --out results/stop-bound-gsm8k-test-n200

A state is what the bank world's policy sees before it decides: n samples drawn, the leading answer held by k of
them, and the first sample's confidence. The family: at the first sample stop always, never, or when its confidence
(`--summary`) clears a threshold of the training grid (`dear.debate.replay_orders.threshold_grid` on the fit shelf);
at n = 2 … width − 1 stop when k ≥ 1 (always), 2, 3 or never; at n = width stop. Each rule is scored with the plain
vote and with the confidence-weighted vote (CISC, tau fitted for CISC-3 on the fit shelf), over the same seeded
orders as `eval.bank_replay`. DEAR's bank-world policy reads these states (its stop and how many it draws; its
observation holds every agent's confidence, not the first sample's alone), so where no rule of the family reaches
the goal of `eval.goal` even chosen on the test questions, a policy reaching it would have to read more than (n, k)
and the first sample's confidence.

Writes OUT/bound.md (the family's accuracy–token frontier up to the baseline's tokens, and the best rule within
the goal's token budget with its paired 95 % interval against adaptive SC from 2 until 2 agree) and OUT/bound.csv.
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
from dear.confidence import SUMMARIES
from dear.debate.replay_orders import ReplayQuestion, fit_tau, permuted, threshold_grid
from dear.debate.sampling_rules import cisc_weights
from dear.llm.registry import is_synthetic
from dear.vote import key_correct, tally, weighted_tally
from eval import goal
from eval.bank_replay import DEFAULT_BANK, STOP_TAU_K, find_shelf, load

PROG = "python -m eval.stop_bound"
NEVER = math.inf  # a leader count no state reaches: never stop there
LATER_CHOICES = (1, 2, 3, NEVER)  # stop at n >= 2 when the leader holds at least this many samples


@dataclass(frozen=True)
class Paths:
    """Every (question, order) debate drawn to the end: per draw n = 1 … width, the leader's count, the score of
    stopping there (plain and confidence-weighted vote, ties as expected values) and the tokens so far; plus the
    first sample's confidence (-inf when it has none or no answer) and the question each debate belongs to."""

    leader: np.ndarray  # (debates, width)
    plain: np.ndarray
    weighted: np.ndarray
    tokens: np.ndarray
    first_confidence: np.ndarray  # (debates,)
    question: np.ndarray  # (debates,) question index


def paths_of(questions: Sequence[ReplayQuestion], tau: float) -> Paths:
    rows: dict[str, list] = {k: [] for k in ("leader", "plain", "weighted", "tokens", "first", "question")}
    for qi, q in enumerate(questions):
        for order in q.orders:
            s = permuted(q.samples, order)
            conf = s.confidence or (None,) * len(s.keys)
            leader, plain, weighted, tokens = [], [], [], []
            for n in range(1, len(s.keys) + 1):
                keys, right = list(s.keys[:n]), key_correct(list(s.keys[:n]), list(s.correct[:n]))
                leader.append(tally(keys).top)
                plain.append(tally(keys).score(right))
                weighted.append(weighted_tally(keys, cisc_weights(conf[:n], tau)).score(right))
                tokens.append(sum(s.tokens[:n]))
            first = conf[0] if s.keys[0] is not None and conf[0] is not None else -math.inf
            for k, v in zip(rows, (leader, plain, weighted, tokens, first, qi)):
                rows[k].append(v)
    return Paths(*(np.asarray(rows[k], dtype=float) for k in ("leader", "plain", "weighted", "tokens", "first")),
                 np.asarray(rows["question"], dtype=int))


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


def stop_index(p: Paths, rule: StopRule) -> np.ndarray:
    """Each debate's draw index (0-based) at which the rule stops."""
    need = np.array([NEVER, *rule.later, 1.0])  # the first column is decided by confidence
    stop = p.leader >= need[None, :]
    stop[:, 0] = p.first_confidence >= rule.first
    stop[:, -1] = True
    return stop.argmax(axis=1)


def per_question(p: Paths, values: np.ndarray) -> np.ndarray:
    """Order-averaged per question."""
    return np.bincount(p.question, weights=values) / np.bincount(p.question)


def outcome(p: Paths, rule: StopRule) -> tuple[np.ndarray, float]:
    """The rule's per-question order-averaged scores and its tokens per question."""
    idx, rows = stop_index(p, rule), np.arange(len(p.leader))
    scores = (p.weighted if rule.weighted else p.plain)[rows, idx]
    return per_question(p, scores), float(p.tokens[rows, idx].mean())


def family(width: int, thresholds: Sequence[float]) -> list[StopRule]:
    firsts = (-math.inf, *[t for t in thresholds if math.isfinite(t)], math.inf)
    return [StopRule(f, tuple(later), w) for f in firsts
            for later in itertools.product(LATER_CHOICES, repeat=width - 2) for w in (False, True)]


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
    p.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank directory (default %(default)s)")
    p.add_argument("--benchmark", default="gsm8k", help="the reported shelf's benchmark (default %(default)s)")
    p.add_argument("--split", default="test", help="the reported shelf's split (default %(default)s)")
    p.add_argument("--fit-benchmark", default=None, help="the fit shelf's benchmark (default: --benchmark)")
    p.add_argument("--fit-split", default="train", help="the shelf of the threshold grid and tau (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="the shelves' token limit (default: the one found)")
    p.add_argument("--summary", choices=SUMMARIES, default="mean_logprob", help="(default %(default)s)")
    p.add_argument("--width", type=int, default=8, help="samples per question read (default %(default)s)")
    p.add_argument("--orders", type=int, default=20, help="seeded orders per question (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders and the bootstrap (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    require_at_least(a, 3, "width")
    require_at_least(a, 1, "orders", "n_boot")
    if a.width > 9:
        raise ValueError(f"--width {a.width}: the family grows 4^(width-2); at most 9")
    return a


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
    rules = family(a.width, grid)
    results = [outcome(paths, r) for r in rules]
    points = [(float(s.mean()), t) for s, t in results]
    base_rule = StopRule(math.inf, (2.0,) * (a.width - 2), False)  # adaptive SC from 1 (= from 2) until 2 agree
    base_scores, base_tokens = outcome(paths, base_rule)
    levels = {t: f"{t:.4g}" for t in grid}
    budget = goal.TOKENS * base_tokens
    within = [i for i, (_, t) in enumerate(points) if t <= budget]
    best = max(within, key=lambda i: (points[i][0], -points[i][1])) if within else None
    synthetic = is_synthetic(test.llm) or is_synthetic(fit.llm)
    source = ("SYNTHETIC: the shelves were generated by a simulated backend." if synthetic else
              f"Real replayed samples of `{bank.manifest['model_file']}` (bank `{shown_path(a.bank)}`), no model "
              "called, nothing synthetic.")
    lines = [f"# Every stop rule of a state family, chosen on the reported questions: {test_key.benchmark} "
             f"{test_key.split}", "", f"Command: `{command_line(PROG, argv)}`", "",
             f"{source} {len(rules)} rules (module docstring) on `{test_key.name}` ({len(test.questions)} "
             f"questions, first {a.width} samples, {a.orders} seeded orders, seed {a.seed}); the first sample's "
             f"thresholds are the `{a.summary}` quantiles of `{fit_key.name}`, CISC tau {tau:g} fitted there. "
             "**Chosen on the reported questions: an upper bound on the family, not a method.**", "",
             f"Baseline, adaptive SC from 2 until 2 agree (the family's rule that stops at k ≥ 2 from n = 2 on): "
             f"{100 * base_scores.mean():.1f} % at {base_tokens:.0f} tokens/question. Goal ({goal.BENCHMARK}): "
             f"{goal.text()}; token budget {budget:.0f}.", ""]
    if best is None:
        lines.append("No rule of the family spends within the budget.")
    else:
        d = metrics.paired_bootstrap_diff(results[best][0], base_scores, n_boot=a.n_boot, seed=a.seed)
        met = goal.accuracy_ok(d)
        lines.append(f"Best rule within the budget: {rules[best].describe(levels)} — {100 * points[best][0]:.1f} % at "
                     f"{points[best][1]:.0f} tokens ({points[best][1] / base_tokens:.2f} ×), "
                     f"{100 * d.mean:+.1f} points [{100 * d.low:+.1f}, {100 * d.high:+.1f}] against the baseline: "
                     + ("the goal is within the family's reach." if met else
                        "**no rule of the family meets the goal, even chosen on these questions.**"))
    lines += ["", "The family's accuracy–token frontier up to the baseline's tokens:", "",
              "| rule | accuracy % | tokens/question | tokens / baseline's |", "|---|---:|---:|---:|"]
    shown = [i for i in frontier(points) if points[i][1] <= 1.05 * base_tokens]
    for i in shown:
        lines.append(f"| {rules[i].describe(levels)} | {100 * points[i][0]:.1f} | {points[i][1]:.0f} | "
                     f"{points[i][1] / base_tokens:.2f} |")
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "bound.md", "\n".join(lines) + "\n")
    with (a.out / "bound.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rule", "accuracy", "tokens_per_question", "tokens_over_baseline", "within_budget", "synthetic"])
        for i in frontier(points):
            w.writerow([rules[i].describe(levels), points[i][0], points[i][1], points[i][1] / base_tokens,
                        points[i][1] <= budget, synthetic])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
