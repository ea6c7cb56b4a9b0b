"""Which mode should sample next, chosen by what has been drawn: the best policy over answer histories of a pool
that mixes two reply modes, solved exactly on the sample bank, fitted on train questions (a method) and on the
reported questions themselves (an upper bound).

    python -m eval.mode_choice_bound --out results/mode-choice-bound-gsm8k

Issue 58 asks whether a learned policy can beat the best fixed mixing rule by choosing *which mode samples next*.
A policy here sees the **answer history**: for each sample drawn so far its mode and whether its answer is new,
missing, or the same as an earlier draw's (which one). After each draw it stops (the plurality vote, ties as
expected values) or draws the next sample of one mode, each mode's samples in their own seeded order (the orders
of `eval.mode_replay`), at most `--width` of a mode and `--budget` in all. For a set of questions and orders the
policy maximising the mean objective (accuracy − price × tokens / 1000, `envs.reward.objective`) is found by
backward induction over the histories the orders reach: exact for that set, since each history's action is chosen
on the (question, order) pairs that reach it.

Rows, each on the same orders of the reported questions (`--split`), with a paired bootstrap 95 % CI over questions
of its difference to the best fixed rule (chosen on the fit questions by objective):
- **fixed rules**: adaptive SC from 2 (stop once 2 answers agree) over each mode alone and over each schedule of
  `dear.debate.mode_mixing`, within the same budget;
- **the history policy fitted on train** (`--fit-split`, a method): it acts on its own only at histories that at
  least `--min-questions` fit questions reach, and elsewhere the best fixed rule plays on (solved with that in
  place; the share of decisions it leaves to the rule is reported);
- **the history policy chosen on the reported questions** (an upper bound of every policy that reads these
  histories, not a method; with thousands of histories it also learns the reported questions' noise).
DEAR's bank-world policy also reads confidences, so the bound covers its mode choice only as far as that choice
reads the answers. `OUT/summary.md`; no model is called.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dear import metrics
from dear.atomic import atomic_write_text
from dear.bank.replay import samples_of
from dear.bank.store import Bank, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.mode_mixing import SCHEDULES, pattern
from dear.debate.replay_orders import orders, permuted
from dear.debate.sampling_rules import RULE_SUMMARY, Samples
from dear.vote import key_correct, tally
from envs.reward import objective
from eval.mode_replay import add_mode_shelf_args, find_mode_shelf, two_modes

PROG = "python -m eval.mode_choice_bound"
STOP = -1  # the action that ends the draw (a mode position 0 / 1 draws that mode's next sample)
NEW, NONE = -2, -1  # a draw's answer class: a new answer, no answer; j >= 0: the answer of earlier draw j
Draw = tuple[int, int]  # (mode position, answer class)
History = tuple[Draw, ...]
Policy = Callable[[History], int]


# ---------------------------------------------------------------- the pool
@dataclass(frozen=True)
class Pool:
    """Two modes' samples of the same questions, each mode in its own seeded orders: `drawn[i][m][p]` is mode m's
    samples of question i in order p."""

    modes: tuple[str, str]
    question_ids: tuple[str, ...]
    drawn: tuple[tuple[tuple[Samples, ...], ...], ...]
    width: int

    @property
    def n_orders(self) -> int:
        return len(self.drawn[0][0])

    def pairs(self) -> list[tuple[int, int]]:
        return [(i, p) for i in range(len(self.question_ids)) for p in range(self.n_orders)]


def load_pool(bank: Bank, benchmark: str, split: str, modes: tuple[str, str], max_tokens: int | None, width: int,
              n_orders: int, seed: int) -> Pool:
    """The questions both modes' shelves hold with at least `width` samples, each cut to its first `width`; mode m
    of question q is drawn in the orders `eval.mode_replay` replays it in (seeded by `q/m`)."""
    shelves = [bank.shelf(find_mode_shelf(bank, benchmark, split, m, max_tokens)) for m in modes]
    shared = [q for q in shelves[0].questions if all(s.n_samples(q) >= width for s in shelves)]
    if not shared:
        raise ValueError(f"{benchmark} {split}: no question has {width} samples of both {modes[0]} and {modes[1]}")
    drawn = tuple(tuple(tuple(permuted(samples, o) for o in orders(width, n_orders, seed, f"{q}/{m}"))
                        for samples, m in ((samples_of(s.of(q)[:width], RULE_SUMMARY), m)
                                           for s, m in zip(shelves, modes)))
                  for q in shared)
    return Pool(modes, tuple(shared), drawn, width)


# ---------------------------------------------------------------- histories
def answer_class(keys: Sequence[str | None], key: str | None) -> int:
    """A new draw's class given the keys drawn before it: no answer, the first earlier draw with its answer, or new."""
    if key is None:
        return NONE
    return next((j for j, k in enumerate(keys) if k == key), NEW)


def leader_votes(history: History) -> int:
    """How many draws hold the most common answer (no-answers hold none)."""
    votes: dict[int, int] = defaultdict(int)
    for j, (_, cls) in enumerate(history):
        if cls == NEW:
            votes[j] += 1
        elif cls >= 0:
            votes[cls] += 1
    return max(votes.values(), default=0)


def drawn_per_mode(history: History) -> tuple[int, int]:
    return sum(m == 0 for m, _ in history), sum(m == 1 for m, _ in history)


def fixed_rule(schedule: str | None, mode: int = 0) -> Policy:
    """Adaptive SC from 2 (stop once 2 answers agree) over a named schedule of the two modes, or over mode `mode`
    alone (schedule None)."""
    def act(history: History) -> int:
        n = len(history)
        if n >= 2 and leader_votes(history) >= 2:
            return STOP
        return mode if schedule is None else pattern(schedule, n + 1)[n]

    return act


FIXED_RULES: dict[str, tuple[str | None, int]] = {"first mode alone": (None, 0), "second mode alone": (None, 1),
                                                  **{s: (s, 0) for s in SCHEDULES}}


# ---------------------------------------------------------------- playing and solving
@dataclass(frozen=True)
class Played:
    """A policy on a pool: per question the order-averaged score, tokens and objective; how often it fell back."""

    scores: np.ndarray
    tokens: np.ndarray
    objectives: np.ndarray
    fallback_share: float = 0.0
    per_mode: tuple[float, float] = (0.0, 0.0)  # samples a question drawn of each mode

    @property
    def accuracy(self) -> float:
        return float(self.scores.mean())

    @property
    def mean_tokens(self) -> float:
        return float(self.tokens.mean())

    @property
    def objective(self) -> float:
        return float(self.objectives.mean())


def _ended(pool: Pool, i: int, p: int, picks: Sequence[tuple[int, int]], price: float) -> tuple[float, int, float]:
    """The vote's score, the tokens and the objective of stopping with the picks (mode, k-th sample of it)."""
    got = [pool.drawn[i][m][p] for m, _ in picks]
    keys = [s.keys[k] for s, (_, k) in zip(got, picks)]
    correct = [s.correct[k] for s, (_, k) in zip(got, picks)]
    tokens = sum(s.tokens[k] for s, (_, k) in zip(got, picks))
    score = tally(keys).score(key_correct(keys, correct))
    return score, tokens, objective(score, tokens, price)


def allowed(history: History, width: int, budget: int) -> list[int]:
    """The actions open after `history`: stop (after one draw), and each mode with samples left, within the budget."""
    out = [STOP] if history else []
    if len(history) < budget:
        out += [m for m, n in enumerate(drawn_per_mode(history)) if n < width]
    return out or [STOP]


def _finish(pool: Pool, i: int, p: int, history: History, act: Policy, budget: int,
            fallback: Policy | None = None, known: Callable[[History], bool] | None = None) -> tuple[tuple, int, int]:
    """Pair (i, p) played on from `history` to its stop by `act` (where `known` says a history is not `act`'s,
    `fallback` acts there): the picks at the stop (mode, k-th sample of it), the decisions made and how many of
    them fell back."""
    counts = list(drawn_per_mode(history))
    picks = [(m, sum(1 for n, _ in history[:j] if n == m)) for j, (m, _) in enumerate(history)]
    keys = [pool.drawn[i][m][p].keys[k] for m, k in picks]
    decisions = fallbacks = 0
    while True:
        use_fallback = fallback is not None and known is not None and not known(history)
        action = (fallback if use_fallback else act)(history)
        decisions += 1
        fallbacks += use_fallback
        open_ = allowed(history, pool.width, budget)
        if action not in open_:  # a rule asking for a mode with nothing left (or past the budget) stops
            action = STOP if history else open_[0]
        if action == STOP:
            return tuple(picks), decisions, fallbacks
        key = pool.drawn[i][action][p].keys[counts[action]]
        history += ((action, answer_class(keys, key)),)
        picks.append((action, counts[action]))
        keys.append(key)
        counts[action] += 1


def play(pool: Pool, policy: Policy, price: float, budget: int, fallback: Policy | None = None,
         known: Callable[[History], bool] | None = None) -> Played:
    """Each (question, order) pair played to its stop by `policy` (where `known` says a history is not the policy's,
    `fallback` acts there); per question means over orders."""
    results = defaultdict(list)
    decisions = fallbacks = 0
    for i, p in pool.pairs():
        picks, d, f = _finish(pool, i, p, (), policy, budget, fallback, known)
        decisions, fallbacks = decisions + d, fallbacks + f
        modes = drawn_per_mode(tuple((m, 0) for m, _ in picks))
        results[i].append((*_ended(pool, i, p, picks, price), *modes))
    per_q = np.array([np.mean(results[i], axis=0) for i in range(len(pool.question_ids))])
    return Played(per_q[:, 0], per_q[:, 1], per_q[:, 2], fallbacks / max(decisions, 1),
                  (float(per_q[:, 3].mean()), float(per_q[:, 4].mean())))


def solve(pool: Pool, price: float, budget: int, min_questions: int = 1,
          fallback: Policy | None = None) -> dict[History, int]:
    """The policy over answer histories maximising the pool's mean objective, by backward induction: at each history
    the action whose expected value over the pairs that reach it is largest (ties: stop, then the first mode). A
    history that fewer than `min_questions` questions reach gets no action of its own: `fallback` plays on from
    there (the returned policy leaves it out)."""
    policy: dict[History, int] = {}

    def value(history: History, pairs: list[tuple[int, int, tuple]]) -> float:
        # pairs: (question, order, picks so far); every pair here drew the same modes in the same order
        if history and fallback is not None and len({i for i, _, _ in pairs}) < min_questions:
            return float(np.mean([_ended(pool, i, p, _finish(pool, i, p, history, fallback, budget)[0], price)[2]
                                  for i, p, _ in pairs]))
        options: dict[int, float] = {}
        for action in allowed(history, pool.width, budget):
            if action == STOP:
                options[STOP] = float(np.mean([_ended(pool, i, p, picks, price)[2] for i, p, picks in pairs]))
                continue
            k = drawn_per_mode(history)[action]
            children: dict[int, list] = defaultdict(list)
            for i, p, picks in pairs:
                keys = [pool.drawn[i][m][p].keys[j] for m, j in picks]
                children[answer_class(keys, pool.drawn[i][action][p].keys[k])].append((i, p, picks + ((action, k),)))
            options[action] = sum(len(c) * value(history + ((action, cls),), c) for cls, c in children.items()) \
                / len(pairs)
        best = max(options, key=lambda a: (options[a] + 1e-12 * (a == STOP), -a))
        policy[history] = best
        return options[best]

    value((), [(i, p, ()) for i, p in pool.pairs()])
    return policy


# ---------------------------------------------------------------- the report
@dataclass(frozen=True)
class ChoiceRow:
    label: str
    played: Played
    note: str = ""


def best_fixed(fit: Pool, price: float, budget: int) -> str:
    """The fixed rule of the largest objective on the fit questions."""
    return max(FIXED_RULES, key=lambda name: play(fit, fixed_rule(*FIXED_RULES[name]), price, budget).objective)


def rule_label(name: str, modes: tuple[str, str]) -> str:
    schedule, mode = FIXED_RULES[name]
    if schedule is None:
        return f"adaptive SC from 2, {modes[mode]} alone"
    seq = ", ".join(modes[m] for m in pattern(schedule, 4))
    return f"adaptive SC from 2, {seq}, … (`{schedule}`)"


def rows_for(test: Pool, fit: Pool, price: float, budget: int, min_questions: int) -> tuple[list[ChoiceRow], str]:
    base_name = best_fixed(fit, price, budget)
    base = fixed_rule(*FIXED_RULES[base_name])
    rows = [ChoiceRow(rule_label(name, test.modes), play(test, fixed_rule(*spec), price, budget),
                "best on the fit questions" if name == base_name else "") for name, spec in FIXED_RULES.items()]
    fitted = solve(fit, price, budget, min_questions, base)
    rows.append(ChoiceRow("history policy fitted on the fit questions (a method)",
                    play(test, lambda h: fitted[h], price, budget, fallback=base, known=lambda h: h in fitted),
                    f"{len(fitted)} histories solved, each reached by ≥ {min_questions} fit questions"))
    in_sample = solve(test, price, budget)
    rows.append(ChoiceRow("history policy chosen on the reported questions (upper bound)",
                    play(test, lambda h: in_sample[h], price, budget), f"{len(in_sample)} histories solved"))
    return rows, rule_label(base_name, test.modes)


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def markdown(command: str, bank: Bank, test: Pool, fit: Pool, price: float, budget: int, rows: Sequence[ChoiceRow],
             base_label: str, n_boot: int, seed: int) -> str:
    base = next(r for r in rows if r.note == "best on the fit questions")
    lines = [f"# Which mode samples next, chosen by the answer history: {', '.join(test.modes)}", "",
             f"Command: `{command}`", "",
             f"Real replayed samples (bank `{shown_path(bank.root)}`), no model called, nothing synthetic. Reported: "
             f"{len(test.question_ids)} questions; fit: {len(fit.question_ids)} questions; each mode's first "
             f"{test.width} samples in {test.n_orders} seeded orders (seed {seed}), at most {budget} samples a "
             f"question. Objective = accuracy − {price:g} × tokens / 1000. − best fixed rule ({base_label}, chosen on "
             f"the fit questions): paired bootstrap 95 % CI over questions ({n_boot} resamples).", "",
             "| row | accuracy % | tokens/question | samples a question (" + " / ".join(test.modes) + ") | objective "
             "| − best fixed rule: accuracy, points [95 % CI] | objective [95 % CI] | note |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        da = metrics.paired_bootstrap_diff(r.played.scores, base.played.scores, n_boot=n_boot, seed=seed)
        do = metrics.paired_bootstrap_diff(r.played.objectives, base.played.objectives, n_boot=n_boot, seed=seed)
        note = r.note + (f"; falls back on {100 * r.played.fallback_share:.1f} % of decisions"
                         if r.played.fallback_share else "")
        cells = [r.label, _pct(r.played.accuracy), f"{r.played.mean_tokens:.0f}",
                 " / ".join(f"{n:.2f}" for n in r.played.per_mode), f"{r.played.objective:.3f}",
                 f"{_pct(da.mean, True)} [{_pct(da.low, True)}, {_pct(da.high, True)}]",
                 f"{do.mean:+.3f} [{do.low:+.3f}, {do.high:+.3f}]", note]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "The upper bound is chosen on the questions it is scored on: what a policy reading the answer "
              "history could do at best there, never a result a method gets."]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mode_shelf_args(p, 8)
    p.add_argument("--fit-split", default="train", help="the fit questions' split (default %(default)s)")
    p.add_argument("--budget", type=int, default=8, help="samples a question at most, both modes (default "
                   "%(default)s, the mixed bank world's env.max_samples)")
    p.add_argument("--price", type=float, default=0.05, help="token price per 1,000 tokens (default %(default)s)")
    p.add_argument("--min-questions", type=int, default=5,
                   help="the fitted policy acts on its own only at histories this many fit questions reach; "
                        "elsewhere the best fixed rule plays on (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    a = p.parse_args(argv)
    a.modes = tuple(two_modes(a.modes))
    if a.split == a.fit_split:
        raise ValueError(f"--fit-split: fitting on the reported split {a.split!r}; fit on training questions")
    require_at_least(a, 1, "width", "budget", "orders", "n_boot", "min_questions")
    require_at_least(a, 0, "seed", "price")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    bank = Bank.open(a.bank)
    test, fit = (load_pool(bank, a.benchmark, split, a.modes, a.max_tokens, a.width, a.orders, a.seed)
                 for split in (a.split, a.fit_split))
    rows, base_label = rows_for(test, fit, a.price, a.budget, a.min_questions)
    text = markdown(command_line(PROG, argv), bank, test, fit, a.price, a.budget, rows, base_label, a.n_boot, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "summary.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
