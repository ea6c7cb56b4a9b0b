"""The real effect of the sampling temperature on accuracy and answer diversity, read from the bank (issue 55, item 2).

    python -m eval.temperature_effect --out results/temperature-effect-gsm8k

Reads every shelf of `--benchmark`, `--split` and `--profile` at top-p `--top-p` and the token limit `--max-tokens`,
one shelf per temperature (`python -m dear.bank build --temperature T ...` banks them), and keeps the questions every
shelf holds with at least `--width` samples, each cut to its first `--width`. So every temperature is read on the
same questions, and each row's difference to `--reference` (the bank world's T0) is paired by question.

Per temperature (`OUT/summary.md`, `OUT/summary.csv`):
- **accuracy**: one sample (the mean over positions), the majority of `--width` (SC), and adaptive SC from 2 until 2
  agree averaged over `--orders` seeded orders of the samples (`dear.debate.replay_orders`); each with its paired
  bootstrap 95 % CI against the reference temperature;
- **answer diversity**: distinct answers per question, the share of questions whose answered samples all agree, the
  no-answer rate, and how often two wrong answers to one question are equal;
- **cost and confidence**: completion tokens per sample, the mean confidence exp(mean token log-probability) and its
  AUROC for a right sample (`eval.confidence_auroc.auroc`).

The bank world snaps a fresh sample's continuous temperature to the nearest banked one (`dear.bank.backend`); this
table is what that snap chooses between. No model is called; everything is the model's real stored samples.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dear import metrics
from dear.atomic import atomic_write_text
from dear.bank.backend import DEFAULT_BANK
from dear.bank.replay import samples_of
from dear.bank.store import Bank, BankSample, ShelfKey
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.confidence import record_of
from dear.debate.replay_orders import orders, replayed
from dear.debate.sampling_rules import DEFAULT_PARAMS, RULE_SUMMARY, rule_outcome
from eval.confidence_auroc import auroc
from eval.mode_replay import equal_wrong_pairs

PROG = "python -m eval.temperature_effect"
ADAPTIVE = "adaptive-sc-2-from-2"


@dataclass(frozen=True)
class TemperatureRow:
    """One temperature's numbers on the shared questions; the per-question lists pair rows by question."""

    temperature: float
    shelf: str
    sample_accuracy: tuple[float, ...]  # per question: the mean over its samples
    sc_accuracy: tuple[float, ...]  # per question: the majority's score (ties as expected values)
    adaptive_accuracy: tuple[float, ...]  # per question: adaptive SC's order-averaged score
    adaptive_tokens: float
    distinct_answers: float
    unanimous: float
    no_answer: float
    same_wrong: float
    wrong_pairs: int
    completion_tokens: float
    mean_confidence: float
    confidence_auroc: float


def temperature_shelves(bank: Bank, a: argparse.Namespace) -> list[ShelfKey]:
    """The shelves of the chosen benchmark, split, profile, top-p and token limit, one per temperature, by T."""
    keys = [k for k in bank.keys if (k.benchmark, k.split, k.profile, k.top_p) == (a.benchmark, a.split, a.profile,
                                                                                      a.top_p)
            and a.max_tokens in (None, k.max_tokens)]
    if len({k.max_tokens for k in keys}) > 1:
        raise ValueError(f"--max-tokens: shelves at several token limits ({', '.join(k.name for k in keys)}); "
                         "choose one")
    keys.sort(key=lambda k: k.temperature)
    temps = [k.temperature for k in keys]
    if len(keys) < 2 or a.reference not in temps:
        have = ", ".join(k.name for k in bank.keys) or "none"
        raise ValueError(f"{bank.root}: need shelves of {a.benchmark} {a.split} {a.profile} p{a.top_p:g} at two or "
                         f"more temperatures including --reference {a.reference:g}; found T {temps} (shelves: {have})")
    return keys


def shared_questions(bank: Bank, keys: Sequence[ShelfKey], width: int) -> list[str]:
    shelves = [bank.shelf(k) for k in keys]
    shared = [q for q in shelves[0].questions if all(s.n_samples(q) >= width for s in shelves)]
    if not shared:
        raise ValueError(f"no question has {width} samples at every temperature ({', '.join(k.name for k in keys)})")
    return shared


def distinct(samples: Sequence[BankSample]) -> int:
    return len({s.answer_key for s in samples if s.answer_key is not None})


def confidence_numbers(every: Sequence[BankSample]) -> tuple[float, float]:
    """Mean exp(mean token log-prob) over the samples with a record, and its AUROC for a right sample."""
    scored = [(math.exp(r.mean_logprob), s.correct) for s in every if (r := record_of(s.confidence)) is not None]
    if not scored:
        return math.nan, math.nan
    values, right = (np.array(x) for x in zip(*scored))
    return float(values.mean()), auroc(values, right.astype(bool))


def temperature_row(key: ShelfKey, per_question: dict[str, list[BankSample]], n_orders: int,
                    seed: int) -> TemperatureRow:
    qs = list(per_question)
    every = [s for q in qs for s in per_question[q]]
    width = len(per_question[qs[0]])
    as_samples = {q: samples_of(per_question[q], RULE_SUMMARY) for q in qs}
    adaptive = [replayed(as_samples[q], ADAPTIVE, DEFAULT_PARAMS, orders(width, n_orders, seed, q)) for q in qs]
    pairs = equal_wrong_pairs(list(per_question.values()))
    answered = [[s for s in per_question[q] if s.answer_key is not None] for q in qs]
    mean_conf, conf_auroc = confidence_numbers(every)
    return TemperatureRow(
        temperature=key.temperature, shelf=key.name,
        sample_accuracy=tuple(float(np.mean([s.correct for s in per_question[q]])) for q in qs),
        sc_accuracy=tuple(rule_outcome(as_samples[q], f"sc-{width}").score for q in qs),
        adaptive_accuracy=tuple(r.score for r in adaptive),
        adaptive_tokens=float(np.mean([r.tokens for r in adaptive])),
        distinct_answers=float(np.mean([distinct(per_question[q]) for q in qs])),
        unanimous=float(np.mean([len(v) > 0 and distinct(v) == 1 for v in answered])),
        no_answer=float(np.mean([s.answer_key is None for s in every])),
        same_wrong=float(np.mean(pairs)) if pairs else math.nan, wrong_pairs=len(pairs),
        completion_tokens=float(np.mean([s.completion_tokens for s in every])),
        mean_confidence=mean_conf, confidence_auroc=conf_auroc)


def temperature_rows(bank: Bank, a: argparse.Namespace) -> tuple[list[TemperatureRow], list[str]]:
    keys = temperature_shelves(bank, a)
    qs = shared_questions(bank, keys, a.width)
    rows = []
    for key in keys:
        shelf = bank.shelf(key)
        rows.append(temperature_row(key, {q: shelf.of(q)[:a.width] for q in qs}, a.orders, a.seed))
    return rows, qs


# ---------------------------------------------------------------- report
ACCURACIES = (("sample_accuracy", "one sample"), ("sc_accuracy", "SC"), ("adaptive_accuracy", "adaptive SC from 2"))


def paired(row: TemperatureRow, ref: TemperatureRow, field: str, n_boot: int, seed: int) -> metrics.CI:
    return metrics.paired_bootstrap_diff(getattr(row, field), getattr(ref, field), n_boot=n_boot, seed=seed)


def table_lines(rows: Sequence[TemperatureRow], ref: TemperatureRow, width: int, n_boot: int, seed: int) -> list[str]:
    def acc(row: TemperatureRow, field: str) -> str:
        mean = 100 * float(np.mean(getattr(row, field)))
        if row is ref:
            return f"{mean:.1f} % (reference)"
        d = paired(row, ref, field, n_boot, seed)
        return f"{mean:.1f} % ({100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}])"

    head = ["T", "one sample", f"SC-{width}", "adaptive SC from 2", "its tokens / q", "distinct answers / q",
            "all answers agree", "no answer", "two wrong answers equal", "completion tokens / sample",
            "mean confidence", "confidence AUROC"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r.temperature:g} | {acc(r, 'sample_accuracy')} | {acc(r, 'sc_accuracy')} | "
                     f"{acc(r, 'adaptive_accuracy')} | {r.adaptive_tokens:.0f} | {r.distinct_answers:.2f} | "
                     f"{100 * r.unanimous:.1f} % | {100 * r.no_answer:.1f} % | {100 * r.same_wrong:.1f} % "
                     f"({r.wrong_pairs} pairs) | {r.completion_tokens:.0f} | {r.mean_confidence:.3f} | "
                     f"{r.confidence_auroc:.3f} |")
    return lines


def markdown(command: str, bank: Bank, rows: Sequence[TemperatureRow], qs: Sequence[str],
             a: argparse.Namespace) -> str:
    ref = next(r for r in rows if r.temperature == a.reference)
    return "\n".join([
        f"# The effect of the sampling temperature: {a.benchmark} {a.split}, `{a.profile}`, top-p {a.top_p:g}",
        "",
        f"Command: `{command}` (seed {a.seed}: the orders and the bootstrap)",
        "",
        f"The real model's stored samples (bank `{bank.root.name}`, model {bank.manifest['model_file']}); nothing "
        f"synthetic, no model call. Every temperature is read on the same {len(qs)} questions (those every shelf "
        f"holds with at least {a.width} samples), its first {a.width} samples each. Shelves: "
        + ", ".join(f"`{r.shelf}`" for r in rows) + ".",
        "",
        f"Accuracy with its paired difference to T {a.reference:g} in points [bootstrap 95 % CI over questions, "
        f"{a.n_boot} resamples]; adaptive SC averaged over {a.orders} seeded orders of each question's samples.",
        "",
        *table_lines(rows, ref, a.width, a.n_boot, a.seed),
        "",
        "The bank world snaps a fresh sample's temperature to the nearest of these (`dear.bank.backend`).",
        ""])


def write_csv(rows: Sequence[TemperatureRow], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        head = [k for k in asdict(rows[0]) if k not in dict(ACCURACIES)]
        w.writerow(["source", *head, *(k for k, _ in ACCURACIES)])
        for r in rows:
            d = asdict(r)
            w.writerow(["real (bank)", *(d[k] for k in head), *(float(np.mean(d[k])) for k, _ in ACCURACIES)])


# ---------------------------------------------------------------- command
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bank", type=Path, default=Path(DEFAULT_BANK), help="bank directory (default %(default)s)")
    p.add_argument("--benchmark", default="gsm8k", help="(default %(default)s)")
    p.add_argument("--split", default="train", help="(default %(default)s)")
    p.add_argument("--profile", default="cot", help="the agents' reply mode (default %(default)s)")
    p.add_argument("--top-p", type=float, default=0.9, help="(default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="the shelves' token limit (default: the one found)")
    p.add_argument("--reference", type=float, default=0.7, help="the temperature differences are taken to "
                   "(default %(default)s, the bank world's T0)")
    p.add_argument("--width", type=int, default=8, help="samples per question read (default %(default)s)")
    p.add_argument("--orders", type=int, default=20, help="seeded orders per question (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders and the bootstrap (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    require_at_least(a, 1, "width", "orders", "n_boot")
    require_at_least(a, 0, "seed")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    bank = Bank.open(a.bank)
    rows, qs = temperature_rows(bank, a)
    text = markdown(command_line(PROG, argv), bank, rows, qs, a)
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "summary.md", text)
    write_csv(rows, a.out / "summary.csv")
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
