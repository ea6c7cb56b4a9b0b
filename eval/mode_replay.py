"""Two reply modes replayed on the sample bank: each mode alone, how their errors differ, and fixed mixing rules.

    python -m eval.mode_replay --modes cot,pot --out results/mode-replay-gsm8k-test

The bank (dear/bank) holds each mode's independent samples of the same questions (e.g. chains of thought, `cot`,
and programs run in the sandbox, `pot`; `python -m dear.bank build --profile pot ...`). Only the questions both
shelves hold with at least `--width` samples are read. No model is called and no program runs: a `pot` sample's
stored sandbox run is read.

`OUT/summary.md` (and `summary.csv`, `accuracy_vs_tokens.png`):
1. **Each mode alone**: accuracy as the mean over sample positions (a bootstrap 95 % CI over questions), tokens per
   sample, the no-answer rate, and for `pot` how the sandbox ended the programs (verdicts).
2. **How their errors differ**: the correlation of the modes' per-question accuracies; how often one mode's
   majority (SC over `--width`) is right where the other's is wrong; and how often a wrong answer of one mode equals
   a wrong answer of the other (paired sample positions), beside how often two wrong answers of one mode are equal.
3. **Rules**: each mode's sampling rules, and fixed mixing rules (a schedule of modes read by a sampling rule,
   `dear.debate.mode_mixing`), each averaged over the same `--orders` seeded orders of each mode's samples, with
   a paired bootstrap 95 % CI of its difference to the better single-mode adaptive SC from 2 (accuracy). With
   `--policy DIR` (repeatable) an exported bank-world policy debates the same questions with agents of both modes
   (`--pool`, e.g. cot,pot,cot; repeatable), `--orders` bank-world debates a question, reading the same first `--width` samples
   of each mode: choosing who draws next, it chooses which mode samples next.
CISC reads the confidence summary `mean_logprob` with the tau fitted for cisc-3 on GSM8K train chains of thought
(`--rule-params`); over programs that tau is used as it is (not refitted).
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dear import metrics
from dear.bank.backend import DEFAULT_BANK as EMBEDDED_BANK
from dear.bank.replay import samples_of
from dear.bank.store import Bank, BankSample, ShelfKey, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.mode_mixing import SCHEDULES, drawn, pattern
from dear.debate.replay_orders import orders, rotations
from dear.debate.sampling_rules import (DEFAULT_PARAMS, DEFAULT_RULE_PARAMS, RULE_SUMMARY, FittedParams, RuleParams,
                                        rule_outcome)
from dear.llm.registry import is_synthetic
from eval.bank_replay import on_frontier, plot_points

PROG = "python -m eval.mode_replay"
TEMPERATURE, TOP_P = 0.7, 0.9  # the banked setting the report reads


@dataclass(frozen=True)
class ModeShelf:
    """One mode's stored samples of the reported questions (each cut to `--width`)."""

    mode: str
    key: ShelfKey
    samples: dict[str, list[BankSample]]
    llm: str


@dataclass(frozen=True)
class ModeRule:
    """A row: a sampling rule over one mode, or over a schedule of both."""

    label: str
    rule: str
    modes: tuple[int, ...]  # the mode positions drawn: (m,) alone, (0, 1) mixed
    schedule: str | None = None
    params: RuleParams = DEFAULT_PARAMS


@dataclass(frozen=True)
class RuleResult:
    spec: ModeRule
    scores: tuple[float, ...]  # per question, order-averaged
    tokens: float
    used: float
    # a policy row's mean samples a debate drew of each mode (a rule's schedule fixes its mix: None)
    by_mode: tuple[tuple[str, float], ...] | None = None

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.scores))


# ---------------------------------------------------------------- loading
def find_mode_shelf(bank: Bank, benchmark: str, split: str, mode: str, max_tokens: int | None) -> ShelfKey:
    found = [k for k in bank.keys if (k.benchmark, k.split, k.profile, k.temperature, k.top_p)
             == (benchmark, split, mode, TEMPERATURE, TOP_P) and max_tokens in (None, k.max_tokens)]
    if len(found) != 1:
        have = ", ".join(k.name for k in bank.keys) or "none"
        why = "no shelf" if not found else "several token limits (choose one with --max-tokens) for"
        raise ValueError(f"{bank.root}: {why} {benchmark} {split} {mode} t{TEMPERATURE} p{TOP_P} (shelves: {have})")
    return found[0]


def load_modes(bank: Bank, a: argparse.Namespace) -> tuple[ModeShelf, ...]:
    """Each mode's shelf, kept to the questions every mode holds with at least `--width` samples."""
    keys = [find_mode_shelf(bank, a.benchmark, a.split, m, a.max_tokens) for m in a.modes]
    shelves = [bank.shelf(k) for k in keys]
    shared = [q for q in shelves[0].questions if all(s.n_samples(q) >= a.width for s in shelves)]
    if not shared:
        raise ValueError(f"no question has {a.width} samples on every shelf ({', '.join(k.name for k in keys)})")
    return tuple(ModeShelf(m, k, {q: s.of(q)[:a.width] for q in shared},
                           str(bank.manifest["shelves"].get(k.name, {}).get("generation", {}).get("llm", "")))
                 for m, k, s in zip(a.modes, keys, shelves))


# ---------------------------------------------------------------- each mode, and how their errors differ
def mode_stats(shelf: ModeShelf, n_boot: int, seed: int) -> dict:
    """Accuracy over positions (CI over questions), tokens, no-answer rate and sandbox verdicts of one mode."""
    per_q = [float(np.mean([s.correct for s in v])) for v in shelf.samples.values()]
    every = [s for v in shelf.samples.values() for s in v]
    verdicts = Counter(s.program.get("verdict", "?") for s in every if s.program is not None)
    return {"mode": shelf.mode, "accuracy": metrics.bootstrap_ci(per_q, n_boot=n_boot, seed=seed),
            "tokens": float(np.mean([s.tokens for s in every])),
            "completion_tokens": float(np.mean([s.completion_tokens for s in every])),
            "no_answer": float(np.mean([s.answer_key is None for s in every])),
            "verdicts": {v: n / len(every) for v, n in verdicts.most_common()}}


def majority_right(samples: list[BankSample]) -> bool:
    """Whether the plurality of the samples is right (a tie counts as right only if every leader is)."""
    return rule_outcome(samples_of(samples, RULE_SUMMARY), f"sc-{len(samples)}").score == 1.0


def differences(a: ModeShelf, b: ModeShelf) -> dict:
    """How the two modes' errors differ on the same questions."""
    qs = list(a.samples)
    acc_a = [float(np.mean([s.correct for s in a.samples[q]])) for q in qs]
    acc_b = [float(np.mean([s.correct for s in b.samples[q]])) for q in qs]
    right = [(majority_right(a.samples[q]), majority_right(b.samples[q])) for q in qs]
    wrong_pairs = [(x, y) for q in qs for x, y in zip(a.samples[q], b.samples[q])
                   if not x.correct and not y.correct and x.answer_key is not None and y.answer_key is not None]
    same_wrong = [x.answer_key == y.answer_key for x, y in wrong_pairs]
    within = {m.mode: same_wrong_within(m) for m in (a, b)}
    return {"within": within, "n": len(qs), "correlation": float(np.corrcoef(acc_a, acc_b)[0, 1]) if len(qs) > 2 else float("nan"),
            "both": sum(x and y for x, y in right), "only_a": sum(x and not y for x, y in right),
            "only_b": sum(y and not x for x, y in right), "neither": sum(not x and not y for x, y in right),
            "wrong_pairs": len(wrong_pairs), "same_wrong": float(np.mean(same_wrong)) if same_wrong else float("nan")}


def same_wrong_within(shelf: ModeShelf) -> float:
    """How often two wrong answers of one mode to the same question are equal (pairs of distinct samples)."""
    equal = equal_wrong_pairs(list(shelf.samples.values()))
    return float(np.mean(equal)) if equal else float("nan")


def equal_wrong_pairs(per_question: Sequence[Sequence[BankSample]]) -> list[bool]:
    """For every pair of answered wrong samples of one question: whether their answers are equal."""
    return [x.answer_key == y.answer_key for v in per_question for i, x in enumerate(v) for y in v[i + 1:]
            if not x.correct and not y.correct and x.answer_key is not None and y.answer_key is not None]


# ---------------------------------------------------------------- rules
def rule_specs(modes: Sequence[str], width: int, tau: float) -> list[ModeRule]:
    """Each mode's rules, then the mixing rules over every schedule."""
    cisc = RuleParams(tau=tau)
    rows: list[ModeRule] = []
    for m, name in enumerate(modes):
        rows += [ModeRule(f"{name}: single sample (mean over positions)", "cot", (m,)),
                 *(ModeRule(f"{name}: SC-{k}", f"sc-{k}", (m,)) for k in sorted({3, width})),
                 ModeRule(f"{name}: adaptive SC from 2 until 2", "adaptive-sc-2-from-2", (m,)),
                 ModeRule(f"{name}: adaptive SC from 3 until 3", "adaptive-sc-3-from-3", (m,)),
                 ModeRule(f"{name}: CISC-3", "cisc-3", (m,), params=cisc)]
    for schedule in SCHEDULES:
        shown = ", ".join(modes[i] for i in pattern(schedule, 4)) + ", ..."  # 4: the seats' turns differ at the 4th
        rows += [ModeRule(f"{shown}: adaptive SC from 2 until 2", "adaptive-sc-2-from-2", (0, 1), schedule),
                 ModeRule(f"{shown}: adaptive SC from 3 until 3", "adaptive-sc-3-from-3", (0, 1), schedule)]
    rows += [ModeRule(f"{', '.join(modes[i] for i in pattern('alternate', 3))}: CISC-3", "cisc-3", (0, 1), "alternate",
                  cisc),
             ModeRule(f"both modes: SC-{2 * width}", f"sc-{2 * width}", (0, 1), "alternate")]
    return rows


def evaluate(spec: ModeRule, shelves: Sequence[ModeShelf], n_orders: int, seed: int) -> RuleResult:
    """The row's order-averaged score, tokens and samples per question (a single sample of one mode: the exact
    mean over positions, through the rotations)."""
    scores, tokens, used = [], [], []
    exact = spec.rule == "cot" and spec.schedule is None
    for q in shelves[0].samples:
        by_mode = [samples_of(s.samples[q], RULE_SUMMARY) for s in shelves]
        order_sets = [rotations(len(b.keys)) if exact else orders(len(b.keys), n_orders, seed, f"{q}/{s.mode}")
                      for b, s in zip(by_mode, shelves)]
        runs = [rule_outcome(drawn(by_mode, [o[p] for o in order_sets], spec.schedule, spec.modes[0]), spec.rule,
                             params=spec.params) for p in range(len(order_sets[spec.modes[0]]))]
        scores.append(float(np.mean([r.score for r in runs])))
        tokens.append(float(np.mean([r.tokens for r in runs])))
        used.append(float(np.mean([r.used for r in runs])))
    return RuleResult(spec, tuple(scores), float(np.mean(tokens)), float(np.mean(used)))


# ---------------------------------------------------------------- a policy that chooses which mode samples next
POLICY_RULE = "dear"  # a row of an exported policy (--policy) rather than a sampling rule


def policy_pool(modes: Sequence[str], n_agents: int, pool: Sequence[str] | None) -> tuple[str, ...]:
    """The policy's agents' modes: `pool` as given (one per agent), else the modes alternating (cot, pot, cot, ...)."""
    chosen = tuple(pool) if pool else tuple(modes[i % len(modes)] for i in range(n_agents))
    if len(chosen) != n_agents or not set(chosen) <= set(modes):
        raise ValueError(f"--pool: {n_agents} agents' modes, each one of {', '.join(modes)} (got {','.join(chosen)})")
    return chosen


def evaluate_policy(path: str, bank: Bank, shelves: Sequence[ModeShelf], pool: Sequence[str] | None, width: int,
                    n_orders: int, seed: int) -> RuleResult:
    """The exported policy debating each reported question `n_orders` times in the bank world of both modes
    (dear/bank/backend.py: each agent draws its own mode's stored samples, among each question's first `width`),
    its agents' modes `pool`; no model is called and no program runs. Per question: the order-averaged final score;
    tokens and samples drawn per debate."""
    from dear import tasks
    from dear.bank.backend import BankBackend
    from dear.debate.profiles import as_profiles
    from dear.export import load_exported
    from dear.infer import debate_bank_orders

    exported = load_exported(path)
    modes = [s.mode for s in shelves]
    agents = policy_pool(modes, exported.n_agents, pool)
    limits = {s.key.max_tokens for s in shelves}
    if len(limits) != 1:
        raise ValueError(f"--policy: the modes' shelves have different token limits ({sorted(limits)})")
    key = shelves[0].key
    backend = BankBackend(bank, key.benchmark, key.split, profile=",".join(modes), max_tokens=key.max_tokens,
                          width=width, temperature=key.temperature)
    by_id = {q.id: q for q in tasks.load(key.benchmark, key.split)}
    questions = [by_id[q] for q in shelves[0].samples]
    run = debate_bank_orders(exported, backend, questions, orders=n_orders, max_tokens=key.max_tokens, seed=seed,
                             agent_profiles=as_profiles(agents, "--pool"))
    scores = run.scores_by_question()
    samples = [[t for turns in d.trace.rounds for t in turns if (t.source or "").startswith("bank:")]
               for d in run.debates]
    by_mode = tuple((m, float(np.mean([sum(t.style == m for t in drew) for drew in samples]))) for m in modes)
    spec = ModeRule(f"DEAR `{Path(path).name}` ({', '.join(agents)})", POLICY_RULE, tuple(range(len(modes))), "policy")
    return RuleResult(spec, tuple(float(np.mean(scores[q.id])) for q in questions),
                      float(np.mean([d.trace.total_tokens for d in run.debates])),
                      float(np.mean([len(drew) for drew in samples])), by_mode)


def mode_mix(res: RuleResult) -> str:
    """A policy row's samples a debate by mode ("cot 1.20 / pot 1.05"); empty for a rule (its schedule says)."""
    return " / ".join(f"{m} {n:.2f}" for m, n in res.by_mode) if res.by_mode else ""


def baseline_of(results: Sequence[RuleResult]) -> RuleResult:
    """The better single-mode adaptive SC from 2 until 2 (by accuracy)."""
    return max((r for r in results if r.spec.schedule is None and r.spec.rule == "adaptive-sc-2-from-2"),
               key=lambda r: r.accuracy)


# ---------------------------------------------------------------- report
@dataclass(frozen=True)
class ModeReport:
    command: str
    bank: Bank
    shelves: tuple[ModeShelf, ...]
    stats: tuple[dict, ...]
    diff: dict
    results: tuple[RuleResult, ...]
    diffs: tuple[metrics.CI, ...]
    frontier: tuple[bool, ...]
    baseline: str
    n_orders: int
    seed: int
    width: int
    tau: float

    @property
    def synthetic(self) -> bool:
        return any(is_synthetic(s.llm) for s in self.shelves)


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def mode_lines(r: ModeReport) -> list[str]:
    lines = ["## Each mode alone", "",
             "| mode | accuracy % (mean over positions) [95 % CI] | tokens / sample | completion tokens / sample "
             "| no answer % | sandbox verdicts |", "|---|---|---:|---:|---:|---|"]
    for s in r.stats:
        a = s["accuracy"]
        verdicts = ", ".join(f"{v} {_pct(f)} %" for v, f in s["verdicts"].items()) or "—"
        lines.append(f"| {s['mode']} | {_pct(a.mean)} [{_pct(a.low)}, {_pct(a.high)}] | {s['tokens']:.0f} | "
                     f"{s['completion_tokens']:.0f} | {_pct(s['no_answer'])} | {verdicts} |")
    d, (ma, mb) = r.diff, (r.shelves[0].mode, r.shelves[1].mode)
    lines += ["", "## How their errors differ", "",
              f"- per-question accuracies correlate at r = {d['correlation']:.2f} over {d['n']} questions;",
              f"- the SC-{r.width} majority is right in both modes on {d['both']}, only with {ma} on {d['only_a']}, "
              f"only with {mb} on {d['only_b']}, in neither on {d['neither']} questions;",
              f"- where samples of the same position are both wrong with an answer ({d['wrong_pairs']} pairs), the "
              f"two wrong answers are equal {_pct(d['same_wrong'])} % of the time; two wrong answers of one mode "
              f"to the same question are equal " + " and ".join(f"{_pct(v)} % ({m})" for m, v in d["within"].items())
              + " of the time.", ""]
    return lines


def markdown(r: ModeReport) -> str:
    names = ", ".join(f"`{s.key.name}`" for s in r.shelves)
    source = ("SYNTHETIC: a shelf was generated by a simulated backend." if r.synthetic else
              f"Every row replays the real model's stored samples ({r.bank.manifest['model_file']}): not synthetic, "
              "no model called, no program run (a `pot` sample's stored sandbox run is read).")
    lines = [f"# Two reply modes replayed: {' and '.join(s.mode for s in r.shelves)}, "
             f"{r.shelves[0].key.benchmark} {r.shelves[0].key.split}", "", f"Command: `{r.command}`", "", source, "",
             f"- bank `{shown_path(r.bank.root)}`, shelves {names}: the {len(r.results[0].scores)} questions both hold "
             f"with at least {r.width} samples, each read as its first {r.width};",
             f"- rules: {r.n_orders} seeded orders per question and mode (seed {r.seed}), the same for every row; a "
             "mixed row draws its modes by a schedule (`dear.debate.mode_mixing`), each mode in its own order; "
             f"CISC weighs by softmax(mean_logprob / {r.tau:g}) (tau fitted for cisc-3 on GSM8K train `cot`);",
             f"- difference: to `{r.baseline}`, paired bootstrap 95 % CI over questions of the order-averaged scores; "
             "frontier: no other row has accuracy ≥ and tokens ≤, strictly better in one.", ""]
    lines += mode_lines(r)
    lines += ["## Rules", "", f"| row | rule | accuracy % | − {r.baseline}, points [95 % CI] | tokens/question "
              "| samples/question | a policy's samples by mode | frontier |", "|---|---|---:|---|---:|---:|---|:-:|"]
    for res, d, front in zip(r.results, r.diffs, r.frontier):
        lines.append(f"| {res.spec.label} | `{res.spec.rule}` | {_pct(res.accuracy)} | {_pct(d.mean, True)} "
                     f"[{_pct(d.low, True)}, {_pct(d.high, True)}] | {res.tokens:.0f} | {res.used:.2f} | "
                     f"{mode_mix(res)} | {'yes' if front else ''} |")
    lines += ["", "Adaptive SC from 1 until 2 makes the decisions of adaptive SC from 2 until 2 (no stop is possible "
              "before 2 samples), so it has no row of its own."]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("label", "rule", "schedule", "modes", "accuracy", "minus_baseline", "diff_ci_low", "diff_ci_high",
              "tokens_per_question", "samples_per_question", "policy_samples_by_mode", "on_frontier", "n_questions",
              "synthetic")


def write_report(r: ModeReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown(r), encoding="utf-8")
    with (out / "summary.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for res, d, front in zip(r.results, r.diffs, r.frontier):
            w.writerow([res.spec.label, res.spec.rule, res.spec.schedule or "",
                        "+".join(r.shelves[m].mode for m in res.spec.modes), res.accuracy, d.mean, d.low, d.high,
                        res.tokens, res.used, mode_mix(res), front, len(res.scores), r.synthetic])
    key = r.shelves[0].key
    plot_points([(x.spec.label, x.tokens, x.accuracy) for x in r.results], r.frontier,
                f"{key.benchmark} {key.split}, {' + '.join(s.mode for s in r.shelves)}, n={len(r.results[0].scores)}, "
                f"{r.n_orders} orders", r.synthetic, out / "accuracy_vs_tokens.png")


# ---------------------------------------------------------------- command
def add_mode_shelf_args(p: argparse.ArgumentParser, width: int) -> None:
    """The options the two-mode replays share: the bank, the shelves, the modes, the width, orders, seed, bootstrap."""
    p.add_argument("--bank", type=Path, default=Path(EMBEDDED_BANK), help="bank directory (default %(default)s)")
    p.add_argument("--benchmark", default="gsm8k", help="the shelves' benchmark (default %(default)s)")
    p.add_argument("--split", default="test", help="the shelves' split (default %(default)s)")
    p.add_argument("--modes", default="cot,pot", help="two reply modes, comma-separated (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="the shelves' token limit (default: the one found)")
    p.add_argument("--width", type=int, default=width, help="samples per question and mode read (default %(default)s)")
    p.add_argument("--orders", type=int, default=20, help="seeded orders per question (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders and the bootstrap (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default %(default)s)")


def two_modes(text: str) -> list[str]:
    """The --modes value as two different reply modes (a clear error naming the flag otherwise)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if len(modes) != 2 or modes[0] == modes[1]:
        raise ValueError(f"--modes: name two different reply modes, e.g. cot,pot (got {','.join(modes)!r})")
    return modes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mode_shelf_args(p, 9)
    p.add_argument("--rule-params", type=Path, default=DEFAULT_RULE_PARAMS,
                   help="fitted rule parameters; CISC reads cisc-3's tau (default %(default)s)")
    p.add_argument("--policy", action="append", default=[],
                   help="an exported bank-world policy to debate the reported questions with agents of both modes "
                        "(repeatable)")
    p.add_argument("--pool", action="append", default=[],
                   help="the policy's agents' modes, e.g. cot,pot,cot; repeatable: each policy debates with each pool "
                        "(default: the modes alternating)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    a.pool = [[m.strip() for m in pool.split(",") if m.strip()] for pool in a.pool] or [None]
    a.modes = two_modes(a.modes)
    require_at_least(a, 3, "width")
    require_at_least(a, 1, "orders", "n_boot")
    require_at_least(a, 0, "seed")
    return a


def build_report(a: argparse.Namespace, command: str) -> ModeReport:
    bank = Bank.open(a.bank)
    shelves = load_modes(bank, a)
    tau = FittedParams.load(a.rule_params).of("cisc-3").tau
    results = tuple(evaluate(spec, shelves, a.orders, a.seed) for spec in rule_specs(a.modes, a.width, tau))
    results += tuple(evaluate_policy(p, bank, shelves, pool, a.width, a.orders, a.seed)
                     for p in a.policy for pool in a.pool)
    base = baseline_of(results)
    diffs = tuple(metrics.paired_bootstrap_diff(x.scores, base.scores, n_boot=a.n_boot, seed=a.seed)
                  for x in results)
    frontier = tuple(on_frontier([(x.accuracy, x.tokens) for x in results]))
    stats = tuple(mode_stats(s, a.n_boot, a.seed) for s in shelves)
    return ModeReport(command, bank, shelves, stats, differences(*shelves), results, diffs, frontier, base.spec.label,
                  a.orders, a.seed, a.width, tau)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    report = build_report(a, command_line(PROG, argv))
    write_report(report, a.out)
    print((a.out / "summary.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
