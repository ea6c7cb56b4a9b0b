"""Confident stop along its whole threshold grid: where the rule family can sit between single CoT and adaptive SC,
replayed on a sample bank (no model call).

    python -m eval.threshold_curve --width 8 --out results/threshold-curve-gsm8k-test-n200

`eval.bank_replay` reports confident stop at the threshold each token price selects on training questions; with a
few dozen training questions neighbouring prices select the same threshold, so the rows leave gaps. Here every point
of the threshold grid (`dear.debate.replay_orders.threshold_grid`: the quantiles of the training samples'
confidences, fixed before any reported question is read) is one row, replayed on the training shelf and on the
reported shelf over the same seeded orders as `eval.bank_replay`, with CISC's tau fitted on the training shelf.
Nothing is chosen on the reported questions: the curve shows the family, not a method. Each row gives its accuracy,
tokens and their ratio to adaptive SC from 2 (until 2 agree), the paired 95 % bootstrap interval of the accuracy
difference to it, and whether the row has the shape issue 56 asks of DEAR (`eval.goal`).

Writes OUT/curve.md and OUT/curve.csv.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from dear import metrics
from dear.atomic import atomic_write_text
from dear.bank.store import Bank, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.replay_orders import QUANTILE_LEVELS, fit_tau, permuted, threshold_grid
from dear.debate.sampling_rules import CONFIDENT_STOP, DEFAULT_PARAMS, RuleParams, stops_at_first
from eval import goal
from eval.bank_replay import (BASELINE, STOP_TAU_K, RowResult, RowSpec, add_shelf_args, evaluate, find_shelf,
                              load)

log = logging.getLogger("eval.threshold_curve")
PROG = "python -m eval.threshold_curve"


def curve_rows(questions, thresholds: Sequence[float], tau: float) -> list[RowResult]:
    """Confident stop at every threshold, on `questions` (ReplayQuestion), with CISC weights at `tau`."""
    return [evaluate(RowSpec(f"threshold {t:.4g}", CONFIDENT_STOP, RuleParams(tau=tau, threshold=t)), questions)
            for t in thresholds]


def first_stop_share(questions, threshold: float) -> float:
    """The share of (question, order) debates whose first sample ends the draw at `threshold`."""
    stops = [stops_at_first(permuted(q.samples, o), threshold) for q in questions for o in q.orders]
    return sum(stops) / len(stops)


def meets_goal(row: RowResult, base: RowResult, diff: metrics.CI) -> bool:
    return goal.tokens_ok(row.tokens, base.tokens) and goal.accuracy_ok(diff)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shelf_args(p, 9, "the training shelf's split")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    require_at_least(a, 3, "width")
    require_at_least(a, 1, "orders", "n_boot")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    bank = Bank.open(a.bank)
    test_key = find_shelf(bank, a.benchmark, a.split, a.max_tokens)
    fit_key = find_shelf(bank, a.fit_benchmark or a.benchmark, a.fit_split, a.max_tokens)
    if fit_key == test_key:
        raise ValueError(f"--fit-split: the training shelf is the reported one ({test_key.name})")
    test = load(bank, test_key, a.summary, a.width, a.orders, a.seed)
    fit = load(bank, fit_key, a.summary, a.width, a.orders, a.seed)
    tau = fit_tau(fit.questions, STOP_TAU_K).value
    grid = threshold_grid(fit.questions)
    levels = [f"{100 * q:.0f} %" for q in QUANTILE_LEVELS][: len(grid) - 1] + ["never"]
    base_test = evaluate(RowSpec("adaptive SC", BASELINE, DEFAULT_PARAMS), test.questions)
    base_fit = evaluate(RowSpec("adaptive SC", BASELINE, DEFAULT_PARAMS), fit.questions)
    on_test, on_fit = curve_rows(test.questions, grid, tau), curve_rows(fit.questions, grid, tau)
    diffs = [metrics.paired_bootstrap_diff(r.scores, base_test.scores, n_boot=a.n_boot, seed=a.seed) for r in on_test]
    lines = [f"# Confident stop along its threshold grid: {test_key.benchmark} {test_key.split}", "",
             f"Command: `{command_line(PROG, argv)}`", "",
             f"Real replayed samples of `{bank.manifest['model_file']}` (bank `{shown_path(a.bank)}`), no model called, "
             f"nothing synthetic. Thresholds: the quantiles of the `{a.summary}` of every sample of `{fit_key.name}` "
             f"({len(fit.questions)} training questions), CISC tau {tau:g} fitted there; reported shelf "
             f"`{test_key.name}` ({len(test.questions)} questions), first {a.width} samples, {a.orders} seeded orders "
             f"(seed {a.seed}). Nothing is chosen on the reported questions. Baseline `{BASELINE}`: test "
             f"{100 * base_test.accuracy:.1f} % at {base_test.tokens:.0f} tokens, train {100 * base_fit.accuracy:.1f} % "
             f"at {base_fit.tokens:.0f}. Goal shape (issue 56): {goal.text()}.", "",
             "| threshold (quantile of train confidences) | stops at the first sample, test % | train accuracy % | "
             "train tokens/q | test accuracy % | test tokens/q | tokens / baseline's | − baseline, points [95 % CI] "
             "| goal shape |",
             "|---|---:|---:|---:|---:|---:|---:|---|:-:|"]
    rows_csv = []
    for t, level, ft, tt, d in zip(grid, levels, on_fit, on_test, diffs):
        shaped = meets_goal(tt, base_test, d)
        text_t = "inf" if math.isinf(t) else f"{t:.4g}"
        lines.append(f"| {text_t} ({level}) | {100 * first_stop_share(test.questions, t):.1f} | {100 * ft.accuracy:.1f} | "
                     f"{ft.tokens:.0f} | {100 * tt.accuracy:.1f} | {tt.tokens:.0f} | {tt.tokens / base_test.tokens:.2f} "
                     f"| {100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {'yes' if shaped else ''} |")
        rows_csv.append({"threshold": t, "quantile": level, "train_accuracy": ft.accuracy, "train_tokens": ft.tokens,
                         "test_accuracy": tt.accuracy, "test_tokens": tt.tokens,
                         "tokens_over_baseline": tt.tokens / base_test.tokens, "minus_baseline": d.mean,
                         "ci_low": d.low, "ci_high": d.high, "goal_shape": shaped, "synthetic": False})
    met = [r for r in rows_csv if r["goal_shape"]]
    lines += ["", (f"{len(met)} of {len(rows_csv)} thresholds have the goal shape." if met else
                   "No threshold of the grid has the goal shape: confident stop cannot cut adaptive SC's tokens to "
                   f"{goal.TOKENS:g} × while staying within {100 * goal.POINTS:g} point of its accuracy on these "
                   "questions."),
              ""]
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "curve.md", "\n".join(lines))
    with (a.out / "curve.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_csv[0]))
        w.writeheader()
        w.writerows(rows_csv)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
