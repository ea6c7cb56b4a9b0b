"""Sampling rules replayed on a sample bank's real samples: accuracy against tokens, order-averaged, with the
confidence rules' parameters fitted on training questions.

    python -m eval.bank_replay --out results/bank-replay-gsm8k
    python -m eval.bank_replay --benchmark math --fit-benchmark gsm8k --out results/bank-replay-math  # zero-shot

The bank (dear/bank) stores the model's independent samples of each question (temperature 0.7, top-p 0.9, profile
cot). Every rule of `dear.debate.sampling_rules` reads them in draw order, so each is replayed over the same `--orders`
seeded permutations of each question's first `--width` samples (`dear.debate.replay_orders`); single CoT is averaged
exactly over positions. CISC's tau (per K) and confident-stop's threshold (per token price) are fitted on the fit
shelf (`--fit-benchmark`/`--fit-split`), never on the questions reported. No model is called.

With `--policy DIR` (repeatable) an exported bank-world policy debates the same questions beside the rules, in the
bank world (dear/bank/backend.py) reading the same first `--width` samples, `--orders` debates a question; the report
says for each policy how it compares with adaptive SC and which rows dominate it (the goal of a real evaluation).

`OUT/summary.md`, `summary.csv` and `accuracy_vs_tokens.png`: per rule and policy, order-averaged accuracy (ties as
expected values) with a paired bootstrap 95 % CI of its difference to adaptive-sc-2-from-2 (resampling questions),
the stored-order accuracy, tokens (prompt + completion) and samples per question, and whether it is on the
accuracy–token frontier.
`OUT/per_question.csv` keeps each row's order-averaged score and tokens per question: `eval.bank_combine --live`
pairs them with live methods on the questions both hold.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dear import metrics, tasks
from dear.bank.backend import DEFAULT_BANK as EMBEDDED_BANK
from dear.bank.backend import BankBackend
from dear.bank.replay import samples_of
from dear.bank.store import Bank, Shelf, ShelfKey, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.confidence import SUMMARIES
from dear.debate.replay_orders import Fit, ReplayQuestion, fit_tau, fit_threshold, replayed, rotations
from dear.debate.sampling_rules import (CONFIDENT_STOP, DEFAULT_PARAMS, RULE_SUMMARY, FittedParams, Outcome,
                                        RuleParams, is_weighted)
from dear.export import ExportedPolicy, load_exported
from dear.infer import BankDebates, debate_bank_orders
from dear.policy import JointPolicy
from dear.tasks import Question
from dear.llm.registry import is_synthetic
from envs.reward import objective
from eval.action_frequencies import action_frequencies
from eval.methods import DensityMatched

log = logging.getLogger(__name__)
PROG = "python -m eval.bank_replay"
DEFAULT_BANK = Path(EMBEDDED_BANK)
PROFILE, TEMPERATURE, TOP_P = "cot", 0.7, 0.9  # the bank's sampling setting these rules are replayed on
BASELINE = "adaptive-sc-2-from-2"
STOP_TAU_K = 3  # confident-stop weighs its few samples (typically 2-3) with the tau fitted for cisc-3
POLICY_RULE = "dear"  # a row of an exported policy (--policy) rather than a sampling rule
CONTROL_RULE = "dear-random"  # its random control at its action frequencies (--random-control)


# ---------------------------------------------------------------- loading
def find_shelf(bank: Bank, benchmark: str, split: str, max_tokens: int | None) -> ShelfKey:
    """The bank's shelf of the benchmark and split at this report's setting (one token limit, or `max_tokens`)."""
    found = [k for k in bank.keys if (k.benchmark, k.split, k.profile, k.temperature, k.top_p)
             == (benchmark, split, PROFILE, TEMPERATURE, TOP_P) and max_tokens in (None, k.max_tokens)]
    if not found:
        have = ", ".join(k.name for k in bank.keys) or "none"
        raise ValueError(f"{bank.root}: no shelf {benchmark} {split} {PROFILE} t{TEMPERATURE} p{TOP_P}"
                         f"{'' if max_tokens is None else f' m{max_tokens}'} (shelves: {have})")
    if len(found) > 1:
        raise ValueError(f"{bank.root}: several token limits for {benchmark} {split} "
                         f"({', '.join(str(k.max_tokens) for k in found)}); choose one with --max-tokens")
    return found[0]


@dataclass(frozen=True)
class Loaded:
    """One shelf's replayable questions: those with at least `width` samples, each cut to its first `width`."""

    key: ShelfKey
    questions: tuple[ReplayQuestion, ...]
    left_out: int  # questions with fewer samples
    llm: str  # the backend the shelf was generated with, as recorded ("" when not recorded)


def load(bank: Bank, key: ShelfKey, summary: str, width: int, n_orders: int, seed: int) -> Loaded:
    shelf: Shelf = bank.shelf(key)
    kept = [ReplayQuestion.of(q, samples_of(shelf.of(q)[:width], summary), n_orders, seed)
            for q in shelf.questions if shelf.n_samples(q) >= width]
    llm = str(bank.manifest["shelves"].get(key.name, {}).get("generation", {}).get("llm", ""))
    return Loaded(key, tuple(kept), len(shelf.questions) - len(kept), llm)


# ---------------------------------------------------------------- rows
@dataclass(frozen=True)
class RowSpec:
    """One row: a rule, its parameters and how they were chosen."""

    label: str
    rule: str
    params: RuleParams = DEFAULT_PARAMS
    fitted: str = ""  # the fitted parameters, as the table shows them
    over_positions: bool = False  # replayed over the rotations (single CoT: exact mean over positions)
    price: float | None = None  # the token price its threshold was fitted for
    policy: str | None = None  # an exported DEAR policy debating in the bank world (rule POLICY_RULE)


@dataclass(frozen=True)
class Fits:
    """The fitted parameters: tau per CISC K, threshold per token price."""

    tau: dict[int, Fit]
    threshold: dict[float, Fit]


def cisc_ks(width: int) -> list[int]:
    return sorted({k for k in (3, 5, width) if k <= width})


def at_price(price: float) -> Callable[[Outcome], float]:
    """A rule outcome's objective at a token price (envs.reward.objective: accuracy - price x tokens / 1000)."""
    return lambda o: objective(o.score, o.tokens, price)


def fit_all(train: Sequence[ReplayQuestion], width: int, prices: Sequence[float]) -> Fits:
    """tau for each cisc-K; confident-stop's threshold per price, weighing with the cisc-3 tau."""
    taus = {k: fit_tau(train, k) for k in cisc_ks(width)}
    stop_params = replace(DEFAULT_PARAMS, tau=taus[STOP_TAU_K].value)  # width >= 3 (parse_args)
    return Fits(taus, {p: fit_threshold(train, at_price(p), stop_params) for p in prices})


def _threshold_text(t: float) -> str:
    return "inf (never stops at the first)" if math.isinf(t) else f"{t:.4g}"


def row_specs(width: int, fits: Fits | None) -> list[RowSpec]:
    """The report's rows, in table order (without a fit, the rules that read confidence are left out)."""
    rows = [RowSpec("single CoT (mean over positions)", "cot", over_positions=True),
            RowSpec("round-0 majority (SC-3)", "sc-3"), RowSpec(f"SC-{width}", f"sc-{width}")]
    rows += [RowSpec(f"adaptive SC from {s} until {a}", f"adaptive-sc-{a}-from-{s}") for a in (2, 3) for s in (1, 2, 3)]
    rows += [RowSpec(f"ESC W={w}", f"esc-{w}") for w in (2, 3)]
    if fits is None:
        return rows
    rows += [RowSpec(f"CISC-{k}", f"cisc-{k}", replace(DEFAULT_PARAMS, tau=f.value), f"tau={f.value:g}")
             for k, f in fits.tau.items()]
    stop_tau = fits.tau[STOP_TAU_K].value
    rows += [RowSpec(f"confident stop (price {p:g}/1k tokens)", CONFIDENT_STOP,
                     RuleParams(tau=stop_tau, threshold=f.value),
                     f"threshold={_threshold_text(f.value)}, tau={stop_tau:g}", price=p)
             for p, f in fits.threshold.items()]
    return rows


@dataclass(frozen=True)
class RowResult:
    """A row on the reported questions: per-question order-averaged and stored-order scores, mean cost."""

    spec: RowSpec
    scores: tuple[float, ...]
    stored: tuple[float, ...] | None  # None: a policy's row (its orders are the bank world's, no stored order)
    question_tokens: tuple[float, ...]  # per question, order-averaged (the questions in the report's order)
    used: float  # samples per question

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.scores))

    @property
    def tokens(self) -> float:
        """Tokens per question."""
        return float(np.mean(self.question_tokens))

    @property
    def stored_accuracy(self) -> float | None:
        return None if self.stored is None else float(np.mean(self.stored))


def evaluate(spec: RowSpec, questions: Sequence[ReplayQuestion]) -> RowResult:
    runs = [replayed(q.samples, spec.rule, spec.params,
                     rotations(len(q.samples.keys)) if spec.over_positions else q.orders) for q in questions]
    return RowResult(spec, tuple(r.score for r in runs), tuple(r.stored.score for r in runs),
                     tuple(r.tokens for r in runs), float(np.mean([r.used for r in runs])))


def policy_spec(path: str) -> RowSpec:
    return RowSpec(f"DEAR `{Path(path).name}`", POLICY_RULE, policy=path)


def control_spec(path: str) -> RowSpec:
    return RowSpec(f"random control of `{Path(path).name}`", CONTROL_RULE, policy=path)


def bank_world(bank: Bank, test: Loaded, width: int) -> tuple[BankBackend, list[Question]]:
    """The reported shelf as a bank world reading each question's first `width` samples, and its questions."""
    backend = BankBackend(bank, test.key.benchmark, test.key.split, profile=test.key.profile,
                          max_tokens=test.key.max_tokens, width=width, temperature=test.key.temperature)
    by_id = {q.id: q for q in tasks.load(test.key.benchmark, test.key.split)}
    return backend, [by_id[q.question_id] for q in test.questions]


def row_of(spec: RowSpec, run: BankDebates) -> RowResult:
    """A policy's row: per-question order-averaged scores, tokens and samples drawn per debate (failed debates, e.g.
    needing more than `width` samples, score 0 and are logged)."""
    if failed := sum(d.failed for d in run.debates):
        log.warning("%s: %d of %d debates failed (scored 0)", spec.label, failed, len(run.debates))
    scores = run.scores_by_question()
    tokens: dict[str, list[int]] = {q.id: [] for q in run.questions}
    for d in run.debates:
        tokens[d.question.id].append(d.trace.total_tokens)
    drawn = [sum((t.source or "").startswith("bank:") for turns in d.trace.rounds for t in turns) for d in run.debates]
    return RowResult(spec, tuple(float(np.mean(scores[q.id])) for q in run.questions), None,
                     tuple(float(np.mean(tokens[q.id])) for q in run.questions), float(np.mean(drawn)))


def evaluate_policy(path: str, bank: Bank, test: Loaded, width: int, n_orders: int, seed: int,
                    control: bool = False) -> list[RowResult]:
    """The exported policy debating each reported question `n_orders` times in the bank world, reading the same
    first `width` samples the rules read (in the bank world's seeded orders, not the rules' orders: the paired
    difference pairs questions, each averaged over its orders). No model is called. With `control`, also its random
    control (`random_control`) on the same debates' seeds."""
    exported = load_exported(path)
    backend, questions = bank_world(bank, test, width)
    run = debate_bank_orders(exported, backend, questions, orders=n_orders, max_tokens=test.key.max_tokens, seed=seed)
    rows = [row_of(policy_spec(path), run)]
    if control:
        rows.append(row_of(control_spec(path), random_control(exported, run, backend, test, seed)))
    return rows


def random_control(exported: ExportedPolicy, run: BankDebates, backend: BankBackend, test: Loaded,
                   seed: int) -> BankDebates:
    """The policy's random control (as `eval.run`'s): each round it stops, and each agent's kind is drawn, at the
    rates the policy realised in that round over `run` (eval/action_frequencies.py), whatever the state. What the
    policy does not learn (a fixed kinds or stop mode) stays as it is."""
    c = exported.policy.config
    freq = action_frequencies([d.trace for d in run.debates if not d.failed], exported.n_rounds or 2)
    cfg = replace(c, selection_mode="random", seed=seed,
                  kinds_mode="random" if c.kinds_mode == "learned" else c.kinds_mode,
                  stop_mode="random" if c.stop_mode == "learned" else c.stop_mode)
    policy = JointPolicy(cfg)
    policy.load_state_dict(exported.policy.state_dict())
    policy.eval()
    return debate_bank_orders(replace(exported, policy=policy), backend, list(run.questions), orders=run.orders,
                              max_tokens=test.key.max_tokens, seed=seed,
                              wrap=lambda p: DensityMatched(p, [0.0] * len(freq.stop), freq))


# ---------------------------------------------------------------- statistics
def on_frontier(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (accuracy, tokens) point: whether no other point has accuracy >= and tokens <= it, strictly better
    in one (the accuracy–token frontier, as eval.report's FRONTIER_RULE)."""
    def dominates(o: tuple[float, float], p: tuple[float, float]) -> bool:
        return o[0] >= p[0] and o[1] <= p[1] and o != p

    return [not any(dominates(o, p) for o in points) for p in points]


def paired_to(rows: Sequence[RowResult], baseline: str, n_boot: int, seed: int) -> list[metrics.CI]:
    """Each row's accuracy minus the baseline rule's, paired bootstrap over questions (order-averaged scores)."""
    base = next((r for r in rows if r.spec.rule == baseline), None)
    if base is None:
        raise ValueError(f"paired_to: no row of the baseline rule {baseline!r}")
    return [metrics.paired_bootstrap_diff(r.scores, base.scores, n_boot=n_boot, seed=seed) for r in rows]


# ---------------------------------------------------------------- report
@dataclass(frozen=True)
class Report:
    command: str
    bank: Bank
    test: Loaded
    fit: Loaded | None  # None: no fit shelf (--fit-split none), no confidence rule reported
    summary: str
    n_orders: int
    seed: int
    width: int
    n_boot: int
    rows: tuple[RowResult, ...]
    diffs: tuple[metrics.CI, ...]
    frontier: tuple[bool, ...]

    @property
    def synthetic(self) -> bool:
        return any(is_synthetic(x.llm) for x in (self.test, self.fit) if x is not None)


def _pts(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _fit_line(r: Report) -> str:
    f = r.fit
    if f is None:
        return ("- no fit shelf (`--fit-split none`): the rules that read confidence (CISC, confident stop) need "
                "parameters fitted on training questions and are left out;")
    return (f"- parameters fitted on `{f.key.name}` ({f.key.benchmark} {f.key.split}, {len(f.questions)} "
            f"questions, {r.n_orders} orders each; {f.left_out} with fewer than {r.width} samples left out), never "
            "on the reported questions: " + "; ".join(f"{x.spec.label}: {x.spec.fitted}" for x in r.rows
                                                       if x.spec.fitted)
            + f" (tau maximises CISC-K's order-averaged accuracy; confident stop's threshold maximises accuracy − "
            f"price × tokens / 1000, weighing with the CISC-{STOP_TAU_K} tau);")


def markdown(r: Report) -> str:
    t = r.test
    source = ("SYNTHETIC: the shelves were generated by a simulated backend." if r.synthetic else
              f"Every row is a replay of the real model's stored samples ({r.bank.manifest['model_file']}), "
              "not synthetic: no model was called and nothing was simulated.")
    lines = [f"# Sampling rules replayed on the sample bank: {t.key.benchmark} {t.key.split}", "",
             f"Command: `{r.command}`", "", source, "",
             f"- bank `{shown_path(r.bank.root)}`; reported shelf `{t.key.name}`: {len(t.questions)} questions with at least "
             f"{r.width} samples ({t.left_out} with fewer left out), each read as its first {r.width} samples;",
             f"- orders: {r.n_orders} seeded permutations per question (seed {r.seed}, from the seed and question id), "
             "the same for every rule; single CoT over the rotations (each sample first once);",
             f"- confidence summary read by CISC and confident stop: `{r.summary}`;",
             _fit_line(r),
             f"- accuracy: order-averaged, ties as expected values; the difference to `{BASELINE}` is a paired "
             f"bootstrap 95 % CI over questions ({r.n_boot} resamples, seed {r.seed}) of the order-averaged "
             "per-question scores; stored order = the bank's sample order (one draw, secondary); tokens = prompt + "
             "completion of the samples used; frontier = no other row has accuracy ≥ and tokens ≤, strictly "
             "better in one (point estimates).", "",
             f"| row | rule | accuracy % | − {BASELINE}, points [95 % CI] | stored-order accuracy % | tokens/question "
             "| samples/question | frontier |", "|---|---|---:|---|---:|---:|---:|:-:|"]
    for row, d, front in zip(r.rows, r.diffs, r.frontier):
        stored = "–" if row.stored_accuracy is None else _pts(row.stored_accuracy)
        lines.append(f"| {row.spec.label} | `{row.spec.rule}` | {_pts(row.accuracy)} | {_pts(d.mean, True)} "
                     f"[{_pts(d.low, True)}, {_pts(d.high, True)}] | {stored} | "
                     f"{row.tokens:.0f} | {row.used:.2f} | {'yes' if front else ''} |")
    lines += policy_lines(r)
    lines += ["", "Rules (dear/debate/sampling_rules.py): `adaptive-sc-A-from-S` starts from S samples and adds one "
              "until A share an answer; `esc-W` draws windows of W until one is unanimous; `cisc-K` weighs the first "
              "K votes by softmax(confidence / tau); `confident-stop` stops at the first sample when it has an answer "
              "and is at least as confident as the threshold, else adds samples until 2 agree and votes with the "
              "CISC weights. Adaptive SC starting from fewer than A samples makes the same decisions as starting "
              "from A (no stop is possible before A samples), so those rows coincide."]
    return "\n".join(lines) + "\n"


def dominating(r: Report, row: RowResult) -> list[RowResult]:
    """The other rows with accuracy >= and tokens <= the row's, strictly better in one (point estimates)."""
    return [o for o in r.rows if o is not row and o.accuracy >= row.accuracy and o.tokens <= row.tokens
            and (o.accuracy, o.tokens) != (row.accuracy, row.tokens)]


def policy_lines(r: Report) -> list[str]:
    """Per policy row: its difference to the baseline, its tokens as a multiple of the baseline's, whether it is on
    the frontier and which rows dominate it."""
    base = next(x for x in r.rows if x.spec.rule == BASELINE)
    out = []
    for row, d, front in zip(r.rows, r.diffs, r.frontier):
        if row.spec.policy is None:
            continue
        over = sorted(dominating(r, row), key=lambda o: (-o.accuracy, o.tokens))
        by = ", ".join(f"{o.spec.label} ({_pts(o.accuracy)} % at {o.tokens:.0f})" for o in over[:3]) + (
            f" and {len(over) - 3} more" if len(over) > 3 else "")
        out.append(f"- {row.spec.label} (`{row.spec.policy}`, {r.n_orders} bank-world debates a question, reading "
                   f"the same first {r.width} samples): {_pts(d.mean, True)} points [{_pts(d.low, True)}, "
                   f"{_pts(d.high, True)}] against `{BASELINE}` at {row.tokens / base.tokens:.2f} × its tokens; "
                   + ("on the frontier." if front else f"dominated by {by}."))
    return ["", "DEAR in the bank world, against the rules:", ""] + out if out else []


CSV_FIELDS = ("label", "rule", "tau", "threshold", "price", "accuracy", "minus_baseline", "diff_ci_low",
              "diff_ci_high", "stored_accuracy", "tokens_per_question", "samples_per_question", "on_frontier",
              "n_questions", "fit_shelf", "synthetic", "benchmark", "shelf", "policy")


def write_csv(r: Report, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for row, d, front in zip(r.rows, r.diffs, r.frontier):
            reads = row.spec.rule.startswith("cisc-") or row.spec.rule == CONFIDENT_STOP
            w.writerow([row.spec.label, row.spec.rule, row.spec.params.tau if reads else "",
                        row.spec.params.threshold if row.spec.rule == CONFIDENT_STOP else "",
                        "" if row.spec.price is None else row.spec.price, row.accuracy, d.mean, d.low, d.high,
                        "" if row.stored_accuracy is None else row.stored_accuracy, row.tokens, row.used, front,
                        len(row.scores), r.fit.key.name if reads else "", r.synthetic, r.test.key.benchmark,
                        r.test.key.name, row.spec.policy or ""])


PER_QUESTION = "per_question.csv"  # each row's order-averaged score and tokens per question (eval.bank_combine)
PER_QUESTION_FIELDS = ("label", "rule", "policy", "question_id", "score", "tokens")


def write_per_question(r: Report, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(PER_QUESTION_FIELDS)
        for row in r.rows:
            for q, score, tokens in zip(r.test.questions, row.scores, row.question_tokens):
                w.writerow([row.spec.label, row.spec.rule, row.spec.policy or "", q.question_id, score, tokens])


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def plot(r: Report, path: Path) -> None:
    """The report's rows on the accuracy–tokens plane (`plot_points`)."""
    plot_points([(row.spec.label, row.tokens, row.accuracy) for row in r.rows], r.frontier,
                f"{r.test.key.benchmark} {r.test.key.split}, n={len(r.test.questions)}, {r.n_orders} orders",
                r.synthetic, path)


def plot_points(points: Sequence[tuple[str, float, float]], frontier: Sequence[bool], title: str, synthetic: bool,
                path: Path) -> None:
    """Accuracy against tokens per question, one marker per (label, tokens, accuracy) point (legend at the right),
    the frontier as a staircase (dominated points hollow); the title says real-model replay or SYNTHETIC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5.5))
    cmap = plt.get_cmap("tab20")
    for i, ((label, tokens, accuracy), front) in enumerate(zip(points, frontier)):
        color = cmap(i % 20)
        ax.plot(tokens, 100 * accuracy, MARKERS[i % len(MARKERS)], color=color, markersize=7, alpha=0.9,
                markerfacecolor=color if front else "none", label=label)
    front = sorted((tokens, 100 * accuracy) for (_, tokens, accuracy), f in zip(points, frontier) if f)
    ax.plot([x for x, _ in front], [y for _, y in front], drawstyle="steps-post", color="black", linestyle="--",
            linewidth=1.0, zorder=0, label="accuracy–token frontier; hollow = dominated")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per question (prompt + completion, log scale)")
    ax.set_ylabel("accuracy % (order-averaged)")
    tag = "SYNTHETIC" if synthetic else "real-model replay"
    ax.set_title(f"{title} [{tag}]", color="#b00000" if synthetic else "black")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def fitted_params(r: Report) -> FittedParams | None:
    """The fitted confidence-rule parameters as `eval.run` and `dear.serve` read them: tau per cisc-K, and
    confident stop's at the first price of `--prices` (None without a fit)."""
    if r.fit is None:
        return None
    rules: dict[str, RuleParams] = {}
    price = None
    for row in r.rows:
        if is_weighted(row.spec.rule) and row.spec.rule not in rules:
            rules[row.spec.rule] = row.spec.params
            price = row.spec.price if row.spec.rule == CONFIDENT_STOP else price
    return FittedParams(rules, r.summary, {
        "command": r.command, "model": r.bank.manifest.get("model_file", ""), "llm": r.fit.llm,
        "fit_shelf": r.fit.key.name,
        "fit_questions": len(r.fit.questions), "width": r.width, "orders": r.n_orders, "seed": r.seed,
        "confident_stop_price": price})


def write_report(r: Report, out: Path, params_out: Path | None = None) -> None:
    """summary.md, summary.csv, the plot, and the fitted parameters (`rule_params.json`, and `params_out`)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown(r), encoding="utf-8")
    write_csv(r, out / "summary.csv")
    write_per_question(r, out / PER_QUESTION)
    plot(r, out / "accuracy_vs_tokens.png")
    params = fitted_params(r)
    if params is None:
        if params_out is not None:
            raise ValueError("--params-out: nothing was fitted (--fit-split none)")
        return
    for path in (out / "rule_params.json", params_out):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(params.to_json(), encoding="utf-8")


# ---------------------------------------------------------------- command
def add_shelf_args(p: argparse.ArgumentParser, width: int, fit_split_help: str) -> None:
    """The options every bank replay command shares: the bank, the reported and the fit shelf, the confidence
    summary, the width, the orders, the seed and the bootstrap."""
    p.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank directory (default %(default)s)")
    p.add_argument("--benchmark", default="gsm8k", help="the reported shelf's benchmark (default %(default)s)")
    p.add_argument("--split", default="test", help="the reported shelf's split (default %(default)s)")
    p.add_argument("--fit-benchmark", default=None, help="the fit shelf's benchmark (default: --benchmark)")
    p.add_argument("--fit-split", default="train", help=f"{fit_split_help} (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="the shelves' token limit (default: the one found)")
    p.add_argument("--summary", choices=SUMMARIES, default="mean_logprob",
                   help="the confidence summary the rules read (default %(default)s)")
    p.add_argument("--width", type=int, default=width, help="samples per question read (default %(default)s)")
    p.add_argument("--orders", type=int, default=20, help="seeded orders per question (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders and the bootstrap (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default %(default)s)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shelf_args(p, 9, "the fit shelf's split; none = no fit, the confidence rules left out")
    p.add_argument("--prices", default="0.01,0.002",
                   help="token prices (per 1,000 tokens, in accuracy) of confident stop's fits (default %(default)s)")
    p.add_argument("--policy", action="append", default=[],
                   help="an exported bank-world policy (python -m dear.export) to debate the reported questions "
                        "beside the rules, --orders debates each (repeatable)")
    p.add_argument("--random-control", action="store_true",
                   help="with each --policy also its random control: stops and turn kinds drawn at the rates the "
                        "policy realised each round, whatever the state")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--params-out", type=Path, default=None,
                   help="also write the fitted parameters here (what eval.run and dear.serve read: "
                        "configs/rule-params-gsm8k-train.json)")
    a = p.parse_args(argv)
    if a.params_out is not None and a.summary != RULE_SUMMARY:
        raise ValueError(f"--params-out: the rules run live read {RULE_SUMMARY!r}; fit with --summary {RULE_SUMMARY}")
    require_at_least(a, 3, "width")
    require_at_least(a, 1, "orders", "n_boot")
    require_at_least(a, 0, "seed")
    return a


def parse_prices(text: str) -> list[float]:
    try:
        prices = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prices: not a comma-separated list of numbers: {text!r}") from None
    if not prices or any(p < 0 for p in prices):
        raise ValueError(f"--prices: give at least one price, none negative: {text!r}")
    return prices


def build_report(a: argparse.Namespace, command: str) -> Report:
    bank = Bank.open(a.bank)
    test_key = find_shelf(bank, a.benchmark, a.split, a.max_tokens)
    fit_key = None if a.fit_split == "none" else find_shelf(bank, a.fit_benchmark or a.benchmark, a.fit_split,
                                                             a.max_tokens)
    if fit_key == test_key:
        raise ValueError(f"--fit-split: fitting on the reported shelf {test_key.name}; fit on training questions")
    test = load(bank, test_key, a.summary, a.width, a.orders, a.seed)
    fit = None if fit_key is None else load(bank, fit_key, a.summary, a.width, a.orders, a.seed)
    for x in (test, fit):
        if x is not None and not x.questions:
            raise ValueError(f"{x.key.name}: no question with at least {a.width} samples")
    fits = None if fit is None else fit_all(fit.questions, a.width, parse_prices(a.prices))
    rows = tuple(evaluate(spec, test.questions) for spec in row_specs(a.width, fits))
    rows += tuple(row for p in a.policy
                  for row in evaluate_policy(p, bank, test, a.width, a.orders, a.seed, a.random_control))
    diffs = tuple(paired_to(rows, BASELINE, a.n_boot, a.seed))
    frontier = tuple(on_frontier([(row.accuracy, row.tokens) for row in rows]))
    return Report(command, bank, test, fit, a.summary, a.orders, a.seed, a.width, a.n_boot, rows, diffs, frontier)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    report = build_report(a, command_line(PROG, argv))
    write_report(report, a.out, a.params_out)
    print((a.out / "summary.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
