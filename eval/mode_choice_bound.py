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
- **the coarse-state policy fitted on train** (a method with far fewer states): a history seen as five numbers
  (`coarse_state`: draws of each mode, the leading and second answer's votes, which modes voted for the leader); the
  fit questions' histories give each coarse state its mean objective of stopping and the next state's frequencies
  after a draw of each mode, and the best action of that model is found by backward induction (certainty
  equivalence: exact for the model, approximate for the questions). Where fewer than `--min-questions` fit
  questions went, the best fixed rule plays;
- **the history policy chosen on the reported questions** (an upper bound of every policy that reads these
  histories, not a method; with thousands of histories it also learns the reported questions' noise).
Then, on the fit questions alone, **two-fold cross-fitting** (seeded halves, each scored by what the other half
fitted): whether either policy beats the fixed rule on questions it was not fitted on, within the fit split.
DEAR's bank-world policy also reads confidences, so the bound covers its mode choice only as far as that choice
reads the answers. `OUT/summary.md`; no model is called.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
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


# ---------------------------------------------------------------- a coarse state, solved on a model of it
CoarseState = tuple[int, int, int, int, int]
LEADER_NONE, LEADER_FIRST, LEADER_SECOND, LEADER_BOTH = range(4)  # which modes the leading answer's draws are of


def coarse_state(history: History) -> CoarseState:
    """What a history says in five numbers: draws of each mode, the leading and the second answer's votes, and
    which modes voted for the leader (ties: the answer drawn first leads)."""
    voters: dict[int, list[int]] = {}
    for j, (m, cls) in enumerate(history):
        if cls != NONE:
            voters.setdefault(j if cls == NEW else cls, []).append(m)
    return _coarse(drawn_per_mode(history), voters.values())


def _coarse(drawn: tuple[int, int], voters: Iterable[Sequence[int]]) -> CoarseState:
    """The coarse state from the draws per mode and each answer's voters' modes, in first-drawn order."""
    ranked = sorted(voters, key=len, reverse=True)  # stable: among equal votes the first-drawn leads
    lead = LEADER_NONE if not ranked else {frozenset({0}): LEADER_FIRST, frozenset({1}): LEADER_SECOND}.get(
        frozenset(ranked[0]), LEADER_BOTH)
    return (*drawn, len(ranked[0]) if ranked else 0, len(ranked[1]) if len(ranked) > 1 else 0, lead)


@dataclass(frozen=True)
class CoarseModel:
    """The fit pool's answer histories seen through `coarse_state`: every history every mode sequence reaches,
    counted once per (question, order) pair."""

    stop: dict[CoarseState, float]  # mean objective of stopping there
    moves: dict[tuple[CoarseState, int], dict[CoarseState, float]]  # the next state's frequencies after a draw
    questions: dict[CoarseState, int]  # how many fit questions reach the state


def coarse_model(pool: Pool, price: float, budget: int) -> CoarseModel:
    stop: dict[CoarseState, list[float]] = defaultdict(list)
    moves: dict[tuple[CoarseState, int], dict[CoarseState, int]] = defaultdict(lambda: defaultdict(int))
    reached: dict[CoarseState, set[int]] = defaultdict(set)
    for i, p in pool.pairs():
        _walk(pool, i, p, price, budget, _Node((0, 0), {}, {}, 0), stop, moves, reached)
    return CoarseModel({s: float(np.mean(v)) for s, v in stop.items()},
                       {sa: {s: n / sum(c.values()) for s, n in c.items()} for sa, c in moves.items()},
                       {s: len(q) for s, q in reached.items()})


@dataclass(frozen=True)
class _Node:
    """A history as `coarse_model` walks it: draws per mode, each answer's voters' modes (in first-drawn order),
    whether each answer was graded right, the tokens drawn (what `coarse_state` and `_ended` read, kept running)."""

    drawn: tuple[int, int]
    voters: dict[str, tuple[int, ...]]
    right: dict[str, bool]
    tokens: int

    def state(self) -> CoarseState:
        return _coarse(self.drawn, self.voters.values())

    def stop_objective(self, price: float) -> float:
        top = max(map(len, self.voters.values()), default=0)
        leaders = [k for k, v in self.voters.items() if len(v) == top]
        score = sum(self.right[k] for k in leaders) / len(leaders) if leaders else 0.0
        return objective(score, self.tokens, price)

    def after(self, mode: int, samples: Samples) -> _Node:
        k = self.drawn[mode]
        key, tokens = samples.keys[k], self.tokens + samples.tokens[k]
        drawn = (self.drawn[0] + (mode == 0), self.drawn[1] + (mode == 1))
        if key is None:
            return _Node(drawn, self.voters, self.right, tokens)
        return _Node(drawn, {**self.voters, key: self.voters.get(key, ()) + (mode,)},
                     {**self.right, key: self.right.get(key, False) or bool(samples.correct[k])}, tokens)


def _walk(pool: Pool, i: int, p: int, price: float, budget: int, node: _Node, stop, moves, reached) -> None:
    """Every mode sequence of pair (i, p) from `node`, within the width and the budget."""
    state = node.state()
    reached[state].add(i)
    n = node.drawn[0] + node.drawn[1]
    if n:
        stop[state].append(node.stop_objective(price))
    if n >= budget:
        return
    for mode in (0, 1):
        if node.drawn[mode] < pool.width:
            child = node.after(mode, pool.drawn[i][mode][p])
            moves[(state, mode)][child.state()] += 1
            _walk(pool, i, p, price, budget, child, stop, moves, reached)


def solve_coarse(model: CoarseModel) -> dict[CoarseState, int]:
    """The best action in every coarse state of the model, by backward induction over the draws made (a state's
    successors have one draw more; ties: stop, then the first mode). Exact for the model, not for the pool: the
    model merges histories that share a coarse state (certainty equivalence)."""
    states = sorted(model.questions, key=lambda s: -(s[0] + s[1]))
    value: dict[CoarseState, float] = {}
    policy: dict[CoarseState, int] = {}
    for state in states:
        options = {STOP: model.stop[state]} if state[0] + state[1] else {}
        for action in (0, 1):
            if (state, action) in model.moves:
                options[action] = sum(f * value[s] for s, f in model.moves[(state, action)].items())
        policy[state] = max(options, key=lambda a: (options[a] + 1e-12 * (a == STOP), -a))
        value[state] = options[policy[state]]
    return policy


def cross_fitted(pool: Pool, price: float, budget: int, min_questions: int, seed: int) -> dict[str, np.ndarray]:
    """Two-fold cross-fitting within one pool (seeded halves of its questions): on each half, the history policy,
    the coarse policy and the best fixed rule all fitted on the other half; per question objectives, every question
    scored once, out of fold."""
    order = np.random.default_rng(seed).permutation(len(pool.question_ids))
    halves = (sorted(order[: len(order) // 2]), sorted(order[len(order) // 2:]))
    out = {name: np.zeros(len(pool.question_ids)) for name in ("best fixed rule", "history policy", "coarse policy")}
    for held, fit_idx in (halves, halves[::-1]):
        fit, held_pool = subpool(pool, fit_idx), subpool(pool, held)
        for name, played in fitted_policies(fit, held_pool, price, budget, min_questions).items():
            out[name][held] = played.objectives
    return out


def subpool(pool: Pool, idx: Sequence[int]) -> Pool:
    return Pool(pool.modes, tuple(pool.question_ids[i] for i in idx), tuple(pool.drawn[i] for i in idx), pool.width)


def fitted_policies(fit: Pool, test: Pool, price: float, budget: int, min_questions: int) -> dict[str, Played]:
    """The best fixed rule, the history policy and the coarse policy, each fitted on `fit`, played on `test`."""
    base = fixed_rule(*FIXED_RULES[best_fixed(fit, price, budget)])
    history = solve(fit, price, budget, min_questions, base)
    model = coarse_model(fit, price, budget)
    coarse = solve_coarse(model)
    return {"best fixed rule": play(test, base, price, budget),
            "history policy": play(test, lambda h: history[h], price, budget, fallback=base,
                                   known=lambda h: h in history),
            "coarse policy": play(test, lambda h: coarse[coarse_state(h)], price, budget, fallback=base,
                                  known=lambda h: model.questions.get(coarse_state(h), 0) >= min_questions)}


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
    rows = [ChoiceRow(rule_label(name, test.modes), play(test, fixed_rule(*spec), price, budget),
                "best on the fit questions" if name == base_name else "") for name, spec in FIXED_RULES.items()]
    fitted = fitted_policies(fit, test, price, budget, min_questions)
    rows.append(ChoiceRow("history policy fitted on the fit questions (a method)", fitted["history policy"],
                          f"acts at histories reached by ≥ {min_questions} fit questions"))
    rows.append(ChoiceRow("coarse-state policy fitted on the fit questions (a method)", fitted["coarse policy"],
                          f"solved on a model of the fit questions' coarse states; acts where ≥ {min_questions} "
                          "fit questions went"))
    in_sample = solve(test, price, budget)
    rows.append(ChoiceRow("history policy chosen on the reported questions (upper bound)",
                    play(test, lambda h: in_sample[h], price, budget), f"{len(in_sample)} histories solved"))
    return rows, rule_label(base_name, test.modes)


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def markdown(command: str, bank: Bank, test: Pool, fit: Pool, price: float, budget: int, rows: Sequence[ChoiceRow],
             base_label: str, cross: dict[str, np.ndarray], n_boot: int, seed: int) -> str:
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
    return "\n".join(lines + cross_fit_lines(fit, cross, n_boot, seed)) + "\n"


def cross_fit_lines(fit: Pool, cross: dict[str, np.ndarray], n_boot: int, seed: int) -> list[str]:
    """Whether a state-dependent choice carries over between questions of the fit split itself."""
    base = cross["best fixed rule"]
    lines = ["", "## Within the fit questions, out of fold", "",
             f"Two-fold cross-fitting on the {len(fit.question_ids)} fit questions (seeded halves, seed {seed}): each "
             "half is played by the policies and the best fixed rule fitted on the other half, so every fit question "
             "is scored once, out of fold. Reported questions are not read. This separates a policy that does not "
             "carry over to other questions at all from one that does not carry over to the reported split.", "",
             "| policy | objective, out of fold | − best fixed rule (out of fold) [95 % CI] |", "|---|---:|---|"]
    for name in ("best fixed rule", "history policy", "coarse policy"):
        d = metrics.paired_bootstrap_diff(cross[name], base, n_boot=n_boot, seed=seed)
        lines.append(f"| {name} | {cross[name].mean():.3f} | {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}] |")
    return lines


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
    cross = cross_fitted(fit, a.price, a.budget, a.min_questions, a.seed)
    text = markdown(command_line(PROG, argv), bank, test, fit, a.price, a.budget, rows, base_label, cross, a.n_boot,
                    a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "summary.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
