"""`python -m eval.confidence_auroc`: how much the model knows — how well its own confidence (dear/confidence.py)
tells its right answers from its wrong ones, on a sample bank of its real round-0 samples (dear/bank/store.py).

    python -m eval.confidence_auroc --bank banks/qwen2.5-coder-1.5b-instruct-q4_k_m --out results/confidence-auroc

For each shelf (one benchmark / split / setting; default every shelf at temperature 0.7 whose samples carry
confidence records) and each *measure* — the confidence summaries `dear.confidence.SUMMARIES` (higher = more
confident) and `neg_completion_tokens`, minus the completion's length in tokens (the length baseline: shorter
= more confident) — it reports:

- **AUROC sample**: the probability that a randomly chosen correct sample has a higher value of the measure than a
  randomly chosen wrong one (ties count one half; `sklearn.metrics.roc_auc_score`), over every sample of the shelf
  with a value. 0.5 = the measure knows nothing, 1.0 = it separates right from wrong perfectly, below 0.5 = it is
  reversed. Samples without a value (the backend sent no log-probabilities, or `answer_mean` found no answer,
  `margin` had fewer than 2 alternatives) are skipped and counted (`n missing`).
- **AUROC vote**: the same for the round-0 plurality vote of the question's first 3 samples (`dear.vote.tally`):
  the vote's confidence is the mean of the measure over the samples that voted for the winning leader (the first
  leader in sorted order on a tie; samples without a value left out), its label is "the vote is correct", i.e. its
  tie-aware score (`Tally.score`) >= 0.5. One point per question; questions with fewer than 3 samples, without
  any parsable answer among them, or whose winners have no value are skipped and counted (`n votes skipped`).
- **[CI]**: a 95 % percentile bootstrap interval (`--n-boot` resamples, `--seed`) that resamples questions with
  replacement — a cluster bootstrap: the samples of one question stay together, as they share its difficulty.
  Resamples holding only one class are left out. Undefined numbers (one class only) are shown as "n/a".
- **accuracy**: the fraction of the shelf's samples graded correct (those with a value of the measure), and the
  fraction of round-0 votes that are correct (score >= 0.5).

Written to OUT: `summary.md` (a table per shelf, with the command and seed), `summary.csv` (one row per shelf x
measure) and `reliability-<shelf>.png`, one per shelf: for `mean_logprob` and `lowest_group`, the samples binned by
deciles of the summary, the bin's mean value against its fraction correct, each point labelled with its count.
Every bank is treated as a real model's samples (a bank only holds a real model's completions): the `synthetic`
column is False and the header says so.
"""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import roc_auc_score

from dear.atomic import atomic_write_text
from dear.bank.backend import DEFAULT_BANK as EMBEDDED_BANK
from dear.bank.store import Bank, BankSample, Shelf, ShelfKey, shown_path
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.confidence import SUMMARIES, record_of
from dear.vote import key_correct, tally

PROG = "python -m eval.confidence_auroc"
DEFAULT_BANK = Path(EMBEDDED_BANK)
DEFAULT_TEMPERATURE = 0.7
LENGTH = "neg_completion_tokens"  # the length baseline: minus the completion's tokens
MEASURES = (*SUMMARIES, LENGTH)
VOTERS = 3  # round-0 samples that vote
RELIABILITY_SUMMARIES = ("mean_logprob", "lowest_group")
N_BINS = 10  # deciles
BOOT_CHUNK = 256  # bootstrap resamples computed at once (bounds memory)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95 % bootstrap interval (NaN where undefined)."""

    estimate: float
    low: float
    high: float

    def text(self) -> str:
        if np.isnan(self.estimate):
            return "n/a"
        ci = "n/a" if np.isnan(self.low) else f"{self.low:.3f}–{self.high:.3f}"
        return f"{self.estimate:.3f} [{ci}]"


@dataclass(frozen=True)
class MeasureResult:
    """One measure on one shelf (module docstring)."""

    shelf: str
    measure: str
    n_samples: int  # samples with a value
    n_missing: int  # samples skipped: no value
    sample_accuracy: float  # fraction correct among the samples with a value
    sample_auroc: Interval
    n_questions: int  # round-0 votes with a confidence
    n_votes_skipped: int
    vote_accuracy: float  # fraction of those votes that are correct
    vote_auroc: Interval


@dataclass(frozen=True)
class Scored:
    """Values of a measure with their labels and the question (cluster) each belongs to."""

    values: np.ndarray
    correct: np.ndarray  # bool
    clusters: np.ndarray  # question index, 0..n_clusters-1
    n_skipped: int

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if len(self.correct) else float("nan")


@dataclass(frozen=True)
class ReliabilityBin:
    mean_value: float
    fraction_correct: float
    count: int


def measure_value(sample: BankSample, measure: str) -> float | None:
    """The sample's value of a measure; None when it has none."""
    if measure == LENGTH:
        return -float(sample.completion_tokens)
    record = record_of(sample.confidence)
    value = None if record is None else record.value(measure)
    return None if value is None or np.isnan(value) else float(value)


def scored(values: Sequence[float | None], correct: Sequence[bool], clusters: Sequence[str]) -> Scored:
    """Keep the points with a value; number their clusters 0, 1, ... in order of appearance."""
    keep = [i for i, v in enumerate(values) if v is not None]
    index: dict[str, int] = {}
    ids = [index.setdefault(clusters[i], len(index)) for i in keep]
    return Scored(np.array([values[i] for i in keep], dtype=np.float64), np.array([correct[i] for i in keep], bool),
                  np.array(ids, dtype=np.int64), len(values) - len(keep))


def shelf_samples(shelf: Shelf) -> list[BankSample]:
    return [s for q in shelf.questions for s in shelf.of(q)]


def sample_scores(shelf: Shelf, measure: str) -> Scored:
    samples = shelf_samples(shelf)
    return scored([measure_value(s, measure) for s in samples], [s.correct for s in samples],
                  [s.question_id for s in samples])


def round0_vote(samples: Sequence[BankSample], measure: str) -> tuple[float | None, bool] | None:
    """The first `VOTERS` samples' plurality vote: (its confidence, whether it is correct); None when there is no
    vote (too few samples, no parsable answer). The confidence is None when no winning voter has a value."""
    voters = list(samples[:VOTERS])
    if len(voters) < VOTERS:
        return None
    keys = [s.answer_key for s in voters]
    t = tally(keys)
    if not t.leaders:
        return None
    winner = t.leaders[0]
    values = [v for s in voters if s.answer_key == winner and (v := measure_value(s, measure)) is not None]
    confidence = float(np.mean(values)) if values else None
    return confidence, t.score(key_correct(keys, [s.correct for s in voters])) >= 0.5


def vote_scores(shelf: Shelf, measure: str) -> Scored:
    votes = {q: round0_vote(shelf.of(q), measure) for q in shelf.questions}
    confidences = [v[0] if v else None for v in votes.values()]
    return scored(confidences, [bool(v and v[1]) for v in votes.values()], list(votes))


def auroc(values: np.ndarray, correct: np.ndarray) -> float:
    """roc_auc_score for "correct"; NaN with one class only."""
    if len(set(correct.tolist())) < 2:
        return float("nan")
    return float(roc_auc_score(correct, values))


def weighted_aurocs(values: np.ndarray, correct: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The AUROC under each row of `weights` (resamples x points): equals
    `roc_auc_score(correct, values, sample_weight=row)`; NaN where a row weighs only one class."""
    order = np.argsort(values, kind="stable")
    values, correct, weights = values[order], correct[order], weights[:, order]
    first = np.searchsorted(values, values, side="left")  # start of each point's run of tied values
    last = np.searchsorted(values, values, side="right")
    positive, negative = weights * correct, weights * ~correct
    cum_negative = np.concatenate([np.zeros((len(weights), 1)), np.cumsum(negative, axis=1)], axis=1)
    below, tied = cum_negative[:, first], cum_negative[:, last] - cum_negative[:, first]
    pairs = positive.sum(axis=1) * negative.sum(axis=1)
    won = (positive * (below + 0.5 * tied)).sum(axis=1)
    return np.divide(won, pairs, out=np.full(len(weights), np.nan), where=pairs > 0)


def cluster_bootstrap(points: Scored, n_boot: int, seed: int) -> Interval:
    """AUROC with a 95 % percentile interval over resamples of the clusters (module docstring)."""
    estimate = auroc(points.values, points.correct)
    n_clusters = int(points.clusters.max()) + 1 if len(points.clusters) else 0
    if np.isnan(estimate) or n_boot <= 0:
        return Interval(estimate, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = []
    for start in range(0, n_boot, BOOT_CHUNK):
        counts = rng.multinomial(n_clusters, np.full(n_clusters, 1 / n_clusters), size=min(BOOT_CHUNK, n_boot - start))
        draws.append(weighted_aurocs(points.values, points.correct, counts[:, points.clusters].astype(np.float64)))
    defined = np.concatenate(draws)
    defined = defined[~np.isnan(defined)]
    if not len(defined):
        return Interval(estimate, float("nan"), float("nan"))
    low, high = np.percentile(defined, [2.5, 97.5])
    return Interval(estimate, float(low), float(high))


def measure_result(shelf: Shelf, measure: str, n_boot: int, seed: int) -> MeasureResult:
    samples, votes = sample_scores(shelf, measure), vote_scores(shelf, measure)
    return MeasureResult(shelf=shelf.key.name, measure=measure, n_samples=len(samples.values),
                         n_missing=samples.n_skipped, sample_accuracy=samples.accuracy,
                         sample_auroc=cluster_bootstrap(samples, n_boot, seed), n_questions=len(votes.values),
                         n_votes_skipped=votes.n_skipped, vote_accuracy=votes.accuracy,
                         vote_auroc=cluster_bootstrap(votes, n_boot, seed))


def has_confidence(shelf: Shelf) -> bool:
    return any(record_of(s.confidence) is not None for s in shelf_samples(shelf))


def chosen_shelves(bank: Bank, names: Sequence[str] | None) -> list[Shelf]:
    """The named shelves, or every shelf at temperature 0.7 with confidence records."""
    by_name = {k.name: k for k in bank.keys}
    if names:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"--shelf: {', '.join(unknown)} not in {bank.root} "
                             f"(shelves: {', '.join(by_name) or 'none'})")
        return [bank.shelf(by_name[n]) for n in dict.fromkeys(names)]
    shelves = [bank.shelf(k) for k in bank.keys if k.temperature == DEFAULT_TEMPERATURE]
    shelves = [s for s in shelves if has_confidence(s)]
    if not shelves:
        raise ValueError(f"--bank: {bank.root} has no shelf at temperature {DEFAULT_TEMPERATURE:g} with confidence "
                         f"records (shelves: {', '.join(by_name) or 'none'}); name one with --shelf")
    return shelves


def reliability_bins(values: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> list[ReliabilityBin]:
    """The points binned by quantiles of their value (ties may merge bins; empty bins are dropped)."""
    if not len(values):
        return []
    edges = np.quantile(values, np.linspace(0, 1, n_bins + 1))
    which = np.searchsorted(edges[1:-1], values, side="right")
    return [ReliabilityBin(float(values[which == b].mean()), float(correct[which == b].mean()),
                           int((which == b).sum())) for b in range(n_bins) if (which == b).any()]


def plot_reliability(shelf: Shelf, model_file: str, path: Path) -> None:
    fig, axes = plt.subplots(1, len(RELIABILITY_SUMMARIES), figsize=(5 * len(RELIABILITY_SUMMARIES), 4))
    for ax, summary in zip(np.atleast_1d(axes), RELIABILITY_SUMMARIES):
        points = sample_scores(shelf, summary)
        bins = reliability_bins(points.values, points.correct)
        ax.plot([b.mean_value for b in bins], [b.fraction_correct for b in bins], marker="o")
        for b in bins:
            ax.annotate(f"n={b.count}", (b.mean_value, b.fraction_correct), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=7)
        if not bins:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel=f"{summary} (decile bin mean)", ylabel="fraction correct", ylim=(-0.05, 1.1),
               title=f"{summary} ({points.n_skipped} missing)")
    fig.suptitle(f"real model {model_file} — {shelf.key.name}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _number(x: float, digits: int = 3) -> str:
    return "n/a" if np.isnan(x) else f"{x:.{digits}f}"


def shelf_markdown(shelf: Shelf, results: Sequence[MeasureResult]) -> list[str]:
    samples = shelf_samples(shelf)
    accuracy = float(np.mean([s.correct for s in samples])) if samples else float("nan")
    length = next(r for r in results if r.measure == LENGTH)
    lines = [f"## {shelf.key.name}", "",
             f"{len(samples)} samples of {len(shelf.questions)} questions; sample accuracy {_number(accuracy)}; "
             f"round-0 vote ({VOTERS} samples) correct on {_number(length.vote_accuracy)} of "
             f"{length.n_questions} questions.", "",
             "| summary | n samples | n missing | accuracy | AUROC sample [CI] | n questions | n votes skipped "
             "| AUROC vote [CI] |", "|---|---:|---:|---:|---|---:|---:|---|"]
    lines += [f"| {r.measure} | {r.n_samples} | {r.n_missing} | {_number(r.sample_accuracy)} | {r.sample_auroc.text()} "
              f"| {r.n_questions} | {r.n_votes_skipped} | {r.vote_auroc.text()} |" for r in results]
    return lines + ["", f"![reliability](reliability-{shelf.key.name}.png)", ""]


def markdown(bank: Bank, shelves: Sequence[Shelf], results: Sequence[MeasureResult], command: str, seed: int,
             n_boot: int) -> str:
    head = ["# How much the model knows: confidence AUROC", "",
            f"Real model: `{bank.manifest.get('model_file')}` (bank `{shown_path(bank.root)}`; every bank is treated as a real "
            f"model's samples, synthetic = False).", "",
            f"Command: `{command}`  ", f"Seed {seed}, {n_boot} bootstrap resamples of questions (95 % percentile "
            f"intervals). AUROC: P(a correct item's value > a wrong one's); 0.5 = no knowledge. `{LENGTH}` is the "
            f"length baseline. Vote: the first {VOTERS} samples' plurality, confidence = mean over the winner's "
            f"voters, correct = score >= 0.5 (see `eval/confidence_auroc.py`).", ""]
    body = [line for s in shelves for line in shelf_markdown(s, [r for r in results if r.shelf == s.key.name])]
    return "\n".join(head + body)


CSV_FIELDS = ("shelf", "benchmark", "split", "profile", "temperature", "top_p", "max_tokens", "summary", "n_samples",
              "n_missing", "sample_accuracy", "auroc_sample", "auroc_sample_low", "auroc_sample_high", "n_questions",
              "n_votes_skipped", "vote_accuracy", "auroc_vote", "auroc_vote_low", "auroc_vote_high", "model_file",
              "synthetic")


def _cell(x: float) -> str:
    return "" if np.isnan(x) else f"{x:.6g}"


def csv_row(key: ShelfKey, r: MeasureResult, model_file: str) -> dict[str, object]:
    return {"shelf": r.shelf, **asdict(key), "summary": r.measure, "n_samples": r.n_samples, "n_missing": r.n_missing,
            "sample_accuracy": _cell(r.sample_accuracy), "auroc_sample": _cell(r.sample_auroc.estimate),
            "auroc_sample_low": _cell(r.sample_auroc.low), "auroc_sample_high": _cell(r.sample_auroc.high),
            "n_questions": r.n_questions, "n_votes_skipped": r.n_votes_skipped,
            "vote_accuracy": _cell(r.vote_accuracy), "auroc_vote": _cell(r.vote_auroc.estimate),
            "auroc_vote_low": _cell(r.vote_auroc.low), "auroc_vote_high": _cell(r.vote_auroc.high),
            "model_file": model_file, "synthetic": False}


def csv_text(shelves: Sequence[Shelf], results: Sequence[MeasureResult], model_file: str) -> str:
    keys = {s.key.name: s.key for s in shelves}
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_row(keys[r.shelf], r, model_file) for r in results)
    return out.getvalue()


def evaluate(bank_dir: Path, shelf_names: Sequence[str] | None, n_boot: int, seed: int, out: Path,
             command: str = PROG) -> list[MeasureResult]:
    """Every chosen shelf x measure; writes OUT/summary.md, summary.csv and the reliability plots."""
    bank = Bank.open(bank_dir)
    shelves = chosen_shelves(bank, shelf_names)
    model_file = str(bank.manifest.get("model_file"))
    results = [measure_result(s, m, n_boot, seed) for s in shelves for m in MEASURES]
    out.mkdir(parents=True, exist_ok=True)
    for s in shelves:
        plot_reliability(s, model_file, out / f"reliability-{s.key.name}.png")
    atomic_write_text(out / "summary.md", markdown(bank, shelves, results, command, seed, n_boot))
    atomic_write_text(out / "summary.csv", csv_text(shelves, results, model_file))
    return results


def main(argv: Sequence[str] | None = None) -> list[MeasureResult]:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--bank", type=Path, default=DEFAULT_BANK, help=f"the sample bank (default {DEFAULT_BANK})")
    p.add_argument("--shelf", action="append", help="a shelf name, repeatable (default: every shelf at temperature "
                                                    "0.7 with confidence records)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    if a.n_boot < 0:
        raise ValueError("--n-boot: must be >= 0")
    results = evaluate(a.bank, a.shelf, a.n_boot, a.seed, a.out,
                       command_line(PROG, list(argv) if argv is not None else None))
    print((a.out / "summary.md").read_text(encoding="utf-8"))
    return results


if __name__ == "__main__":
    run_cli(main, PROG)
