"""`python -m eval.bank_combine`: one report over several `eval.bank_replay` reports (one per benchmark), and the
real evaluation's goal checked for every DEAR policy row they hold.

    python -m eval.bank_combine --out results/bank-report \\
        results/bank-replay-gsm8k-test-n200-dear results/bank-replay-math500-test-dear results/bank-replay-gpqa-test-dear

Each directory's `summary.csv` is read as written (rows, paired differences to adaptive SC from 2 until 2 agree,
frontier flags); nothing is recomputed, so every number keeps the command in its directory's `summary.md`.
`OUT/summary.md` puts the rows side by side (one column group per benchmark) and checks, per policy row and
benchmark, the goal of a real evaluation (issue 56):

- on the accuracy–token frontier of its benchmark's rows;
- on GSM8K, the accuracy and token parts of `eval.goal`;
- no confidence rule (CISC, confident stop) dominates it.

With `--live DIR` (repeatable; `eval.run` results directories) the methods a bank cannot replay (MAD, MAD-stop,
the paper's DEAR, any DEAR whose turns read peers: `eval.live_rows`) join, per benchmark, on the questions they share
with the bank report: every replayed row restricted to those questions (its `per_question.csv`) beside each live
method, each with its paired difference to the baseline on them and the frontier of that table; the goal then also
asks that no live method dominate the policy on those questions.

Real and synthetic reports are never combined.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dear import metrics
from dear.atomic import atomic_write_text
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.metrics import CI
from eval import goal
from eval.bank_replay import BASELINE, PER_QUESTION, POLICY_RULE, on_frontier
from eval.live_rows import LiveMethod, live_methods_of

PROG = "python -m eval.bank_combine"
CONFIDENCE_RULES = ("cisc-", "confident-stop")
NEEDED = ("label", "rule", "accuracy", "minus_baseline", "diff_ci_low", "diff_ci_high", "tokens_per_question",
          "on_frontier", "n_questions", "synthetic", "shelf", "benchmark", "policy")


@dataclass(frozen=True)
class ReportRow:
    label: str
    rule: str
    policy: str  # "" for a sampling rule
    accuracy: float
    diff: CI  # minus the baseline, paired 95 % interval
    tokens: float
    frontier: bool


@dataclass(frozen=True)
class Benchmark:
    """One bank_replay report: its shelf, question count and rows."""

    path: Path
    benchmark: str
    shelf: str
    n_questions: int
    synthetic: bool
    rows: tuple[ReportRow, ...]

    @property
    def baseline(self) -> ReportRow:
        return next(r for r in self.rows if r.rule == BASELINE)


def read_report(path: Path) -> Benchmark:
    """A bank_replay directory's summary.csv; ValueError naming the file and what is missing."""
    f = path / "summary.csv"
    if not f.is_file():
        raise ValueError(f"{f}: not found (give eval.bank_replay output directories)")
    with f.open(encoding="utf-8", newline="") as fh:
        table = list(csv.DictReader(fh))
    missing = [c for c in NEEDED if not table or c not in table[0]]
    if missing:
        raise ValueError(f"{f}: no column {', '.join(missing)}; write the report again with the current "
                         "python -m eval.bank_replay")
    rows = tuple(ReportRow(r["label"], r["rule"], r["policy"], float(r["accuracy"]),
                     CI(float(r["minus_baseline"]), float(r["diff_ci_low"]), float(r["diff_ci_high"])),
                     float(r["tokens_per_question"]), r["on_frontier"] == "True") for r in table)
    if not any(r.rule == BASELINE for r in rows):
        raise ValueError(f"{f}: no row of the baseline {BASELINE}")
    if len({(r["benchmark"], r["shelf"], r["synthetic"]) for r in table}) != 1:
        raise ValueError(f"{f}: rows of several shelves")
    first = table[0]
    return Benchmark(path, first["benchmark"], first["shelf"], int(first["n_questions"]), first["synthetic"] == "True",
                     rows)


def dominating(b: Benchmark, row: ReportRow) -> list[ReportRow]:
    """The benchmark's other rows with accuracy >= and tokens <= the row's, strictly better in one."""
    return [o for o in b.rows if o is not row and o.accuracy >= row.accuracy and o.tokens <= row.tokens
            and (o.accuracy, o.tokens) != (row.accuracy, row.tokens)]


@dataclass(frozen=True)
class LiveTable:
    """One benchmark's rows on the questions its live methods share with the bank report: replayed rows restricted
    to them, then the live methods; paired differences to the baseline and the frontier, on those questions."""

    benchmark: str
    questions: tuple[str, ...]
    rows: tuple[ReportRow, ...]
    sources: tuple[str, ...]  # the live rows' labels


def per_question(b: Benchmark) -> dict[str, dict[str, tuple[float, float]]]:
    """Row label -> question id -> (order-averaged score, tokens), from the report's per_question.csv."""
    f = b.path / PER_QUESTION
    if not f.is_file():
        raise ValueError(f"{f}: not found; write the report again with the current python -m eval.bank_replay "
                         "(--live pairs its rows per question)")
    out: dict[str, dict[str, tuple[float, float]]] = {}
    with f.open(encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            out.setdefault(r["label"], {})[r["question_id"]] = (float(r["score"]), float(r["tokens"]))
    return out


def live_table(b: Benchmark, live: Sequence[LiveMethod], n_boot: int, seed: int) -> LiveTable | None:
    """The benchmark's live table (None when no live method debated it)."""
    mine = [m for m in live if m.benchmark == b.benchmark]
    if not mine:
        return None
    replayed = per_question(b)
    base = replayed[b.baseline.label]
    shared = [q for q in base if all(q in m.scores for m in mine)]
    if not shared:
        raise ValueError(f"{b.benchmark}: the live methods ({', '.join(str(m.source) for m in mine)}) share no "
                         f"question with {b.path}")
    series = [(r.label, r.rule, r.policy, [replayed[r.label][q] for q in shared]) for r in b.rows]
    series += [(f"{m.label} (live, `{m.source.name}`)", m.method, "", list(zip(*m.on(shared)))) for m in mine]
    base_scores = [base[q][0] for q in shared]
    points = [(float(np.mean([x[0] for x in v])), float(np.mean([x[1] for x in v]))) for *_, v in series]
    frontier = on_frontier(points)
    rows = tuple(ReportRow(label, rule, policy, acc,
                           metrics.paired_bootstrap_diff([x[0] for x in v], base_scores, n_boot=n_boot, seed=seed),
                           tokens, front)
                 for (label, rule, policy, v), (acc, tokens), front in zip(series, points, frontier))
    return LiveTable(b.benchmark, tuple(shared), rows, tuple(s[0] for s in series[len(b.rows):]))


def live_lines(t: LiveTable) -> list[str]:
    lines = ["", f"## {t.benchmark}: the methods run live, on the {len(t.questions)} questions they share with the "
             "bank", "", f"Replayed rows restricted to these questions beside the live ones ({', '.join(t.sources)}); "
             f"Δ: paired bootstrap 95 % CI over these questions to `{BASELINE}`; ★ frontier of this table.", "",
             "| row | acc % | Δ [95 % CI] | tokens |", "|---|---:|---|---:|"]
    lines += [f"| {r.label} | {_cell(r)} |" for r in t.rows]
    return lines


@dataclass(frozen=True)
class GoalCheck:
    """The goal's parts for one policy row on one benchmark (None: the part does not apply there)."""

    frontier: bool
    accuracy_ok: bool | None
    tokens_ratio: float
    tokens_ok: bool | None
    confidence_dominators: tuple[str, ...]
    # the live methods that dominate it on the questions they share with the bank (None: no live method ran there)
    live_dominators: tuple[str, ...] | None = None

    @property
    def met(self) -> bool:
        return (self.frontier and not self.confidence_dominators and not self.live_dominators
                and self.accuracy_ok is not False and self.tokens_ok is not False)


def check_goal(b: Benchmark, row: ReportRow, live: LiveTable | None = None) -> GoalCheck:
    on_goal = b.benchmark == goal.BENCHMARK
    conf = tuple(o.label for o in dominating(b, row) if o.rule.startswith(CONFIDENCE_RULES))
    return GoalCheck(row.frontier, goal.accuracy_ok(row.diff) if on_goal else None, row.tokens / b.baseline.tokens,
                     goal.tokens_ok(row.tokens, b.baseline.tokens) if on_goal else None, conf,
                     None if live is None else live_dominators(live, row))


def live_dominators(t: LiveTable, row: ReportRow) -> tuple[str, ...]:
    """The live rows with accuracy >= and tokens <= the row's on the shared questions, strictly better in one (the
    replayed rows judge it on every question of its report, not here)."""
    mine = next(r for r in t.rows if r.label == row.label)
    return tuple(o.label for o in t.rows if o.label in t.sources and o.accuracy >= mine.accuracy
                 and o.tokens <= mine.tokens and (o.accuracy, o.tokens) != (mine.accuracy, mine.tokens))


def _pts(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _cell(row: ReportRow | None) -> str:
    if row is None:
        return "– | – | –"
    mean, low, high = row.diff.mean, row.diff.low, row.diff.high
    star = " ★" if row.frontier else ""
    return f"{_pts(row.accuracy)}{star} | {_pts(mean, True)} [{_pts(low, True)}, {_pts(high, True)}] | {row.tokens:.0f}"


def _yes(x: bool | None) -> str:
    return "–" if x is None else "yes" if x else "**no**"


def markdown(benches: Sequence[Benchmark], command: str, live: Sequence[LiveTable | None] = ()) -> str:
    real = not benches[0].synthetic
    lines = ["# Sampling rules and DEAR on the sample banks, side by side", "", f"Command: `{command}`", "",
             ("Every number is a replay of the real model's stored samples (no model called, nothing simulated)"
              + ("; the rows marked live are the real model's live `eval.run` debates on the shared questions."
                 if any(live) else ".") if real else "SYNTHETIC: the shelves were generated by a simulated backend."), "",
             "Sources (each with its command in its `summary.md`): " + "; ".join(
                 f"`{b.path}` ({b.benchmark}, shelf `{b.shelf}`, {b.n_questions} questions)" for b in benches) + ".",
             "", f"Per benchmark: order-averaged accuracy % (★ on that benchmark's accuracy–token frontier), its "
             f"difference to `{BASELINE}` in points with the paired bootstrap 95 % CI, tokens per question. A row "
             "absent from a report is –.", ""]
    head = "| row | " + " | ".join(f"{b.benchmark} acc % | Δ [95 % CI] | tokens" for b in benches) + " |"
    lines += [head, "|---|" + "---:|---|---:|" * len(benches)]
    labels = list(dict.fromkeys(r.label for b in benches for r in b.rows))
    for label in labels:
        cells = [_cell(next((r for r in b.rows if r.label == label), None)) for b in benches]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## The goal, per DEAR policy and benchmark", "",
              f"Goal: on every benchmark on the frontier and dominated by no confidence rule; on {goal.BENCHMARK} "
              f"also {goal.text()}.", "",
              "| policy | benchmark | frontier | dominating live methods (shared questions) | accuracy ok | "
              "tokens × baseline | tokens ok | dominating confidence rules | goal met |",
              "|---|---|:-:|---|:-:|---:|:-:|---|:-:|"]
    tables = dict(zip((b.benchmark for b in benches), live)) if live else {}
    policies = list(dict.fromkeys(r.policy for b in benches for r in b.rows if r.rule == POLICY_RULE))
    for policy in policies:
        for b in benches:
            row = next((r for r in b.rows if r.rule == POLICY_RULE and r.policy == policy), None)
            if row is None:
                lines.append(f"| `{policy}` | {b.benchmark} | – | – | – | – | – | not evaluated | – |")
                continue
            g = check_goal(b, row, tables.get(b.benchmark))
            live_cell = "–" if g.live_dominators is None else ", ".join(g.live_dominators) or "none"
            lines.append(f"| `{policy}` | {b.benchmark} | {_yes(g.frontier)} | {live_cell} | "
                         f"{_yes(g.accuracy_ok)} | "
                         f"{g.tokens_ratio:.2f} | {_yes(g.tokens_ok)} | "
                         f"{', '.join(g.confidence_dominators) or 'none'} | {_yes(g.met)} |")
    if not policies:
        lines.append("| (no policy row: give eval.bank_replay --policy) | | | | | | | | |")
    for table in live:
        if table is not None:
            lines += live_lines(table)
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", type=Path, help="eval.bank_replay output directories")
    p.add_argument("--out", type=Path, required=True, help="output directory (summary.md)")
    p.add_argument("--live", type=Path, action="append", default=[],
                   help="an eval.run results directory whose live methods (MAD, MAD-stop, DEAR...) join on the "
                        "questions they share with a report (repeatable)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of the live tables (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    a = p.parse_args(argv)
    require_at_least(a, 1, "n_boot")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    benches = [read_report(p) for p in a.reports]
    if len({b.synthetic for b in benches}) > 1:
        raise ValueError("real and synthetic reports are never combined: "
                         + ", ".join(f"{b.path} ({'synthetic' if b.synthetic else 'real'})" for b in benches))
    live = [m for d in a.live for m in live_methods_of(d)]
    tables = [live_table(b, live, a.n_boot, a.seed) for b in benches]
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "summary.md", markdown(benches, command_line(PROG, argv), tables))
    print((a.out / "summary.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
