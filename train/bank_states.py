"""What a bank-world policy decides in each state, against adaptive self-consistency, on real replayed samples.

    python -m train.bank_states --policy results/policy-bank-gsm8k-p0.05 --split test --orders 20 \\
        --out results/bank-states-gsm8k-p0.05

The exported policy (trained on GSM8K; on another benchmark's bank, zero-shot) debates every question the bank holds
for `--split`, `--orders` times (each debate another
seeded order of the question's banked samples), on the bank alone (dear.bank.backend: no model is called). Before
each exchange round the policy is in a state: the independent samples drawn so far (n) and how many of them the
leading answer holds (k). Per state the table gives how many debates reached it, how often the policy stopped
there, how many fresh samples it drew when it went on, what adaptive SC until 2 agree does there (stop once k >= 2),
the accuracy of stopping there (the vote over the n samples, ties as expected values) and the accuracy the policy
ended with from there. A state where stopping is about as accurate as going on, and the policy goes on, is a
decision it fails to make; the tokens column says what going on costs.

With `--pool cot,pot,cot` the policy debates with agents of those reply modes (each draws its own mode's banked
samples; a policy trained in a pool of modes, e.g. configs/gsm8k-modes-long.yaml), and each state also says which
modes its fresh samples came from.

Writes OUT/states.md and OUT/states.csv.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dear import metrics, tasks
from dear.atomic import atomic_write_text
from dear.bank.backend import DEFAULT_BANK, BankBackend
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.engine import Debate, confidence_weights
from dear.debate.profiles import as_profiles
from dear.debate.trace import voting_turns
from dear.export import load_exported
from dear.infer import BankDebates, debate_bank_orders
from dear.llm.base import serves
from dear.regulator import RegulatorRecord
from dear.vote import key_correct, tally, weighted_tally

PROG = "python -m train.bank_states"
ADAPTIVE_AGREE = 2  # the baseline: adaptive SC stops once this many samples share an answer


@dataclass
class StateStats:
    """Decisions and outcomes of every debate that reached one state (n samples, the leader holding k)."""

    reached: int = 0
    stopped: int = 0
    fresh_when_going_on: list[int] = field(default_factory=list)
    fresh_modes: list[str] = field(default_factory=list)  # the reply mode of every fresh sample drawn from here
    score_if_stopped: list[float] = field(default_factory=list)
    final_score: list[float] = field(default_factory=list)
    tokens_now: list[int] = field(default_factory=list)
    final_tokens: list[int] = field(default_factory=list)


def stop_score(debate: Debate, voters: Sequence) -> float:
    """The score of stopping with these voters under the debate's own vote rule (a confidence-weighted policy's
    stop is scored by its weighted vote; every other bank-world rule counts each sample once)."""
    keys = [t.answer_key for t in voters]
    correct = key_correct(keys, [bool(t.correct) for t in voters])
    if debate.decision == "confidence-weighted":
        return weighted_tally(keys, confidence_weights(voters, debate.vote_tau, debate.debate_id)).score(correct)
    return tally(keys).score(correct)


@dataclass(frozen=True)
class DecisionPoint:
    """One decision of the regulator: the state (n samples, the plain leader holding k), what it did, and what
    stopping there would have scored."""

    n: int
    k: int
    stopped: bool
    fresh_modes: tuple[str, ...]  # the reply mode of each fresh sample it drew (none when it stopped)
    score_if_stopped: float
    tokens: int


def decision_points(debate: Debate, records: Sequence[RegulatorRecord]) -> list[DecisionPoint]:
    """Every decision the regulator made in `debate`, in order."""
    out = []
    rounds = debate.trace.rounds
    for rec in records:
        before = rounds[:rec.round]  # the rounds completed when it decided
        voters = voting_turns(before, "all-answers")
        keys = [t.answer_key for t in voters]
        k = tally(keys).top  # the state: how many samples the plain leader holds
        score = stop_score(debate, voters)
        tokens = sum(t.prompt_tokens + t.completion_tokens for turns in before for t in turns)
        drew = () if rec.stop or rec.round >= len(rounds) else tuple(t.style for t in rounds[rec.round] if t.fresh)
        out.append(DecisionPoint(len(voters), k, bool(rec.stop), drew, float(score), int(tokens)))
    return out


def collect(debates: Sequence[Debate], records: dict[str, list[RegulatorRecord]]) -> dict[tuple[int, int], StateStats]:
    states: dict[tuple[int, int], StateStats] = {}
    for d in debates:
        if d.failed:
            continue
        final, final_tokens = float(d.trace.final_score or 0.0), d.trace.total_tokens
        for p in decision_points(d, records.get(d.debate_id, [])):
            s = states.setdefault((p.n, p.k), StateStats())
            s.reached += 1
            s.stopped += p.stopped
            if not p.stopped:
                s.fresh_when_going_on.append(len(p.fresh_modes))
                s.fresh_modes.extend(p.fresh_modes)
            s.score_if_stopped.append(p.score_if_stopped)
            s.final_score.append(final)
            s.tokens_now.append(p.tokens)
            s.final_tokens.append(final_tokens)
            if p.stopped:
                break
    return dict(sorted(states.items()))


def mode_shares(modes: Sequence[str]) -> str:
    """"pot 62 % / cot 38 %": each reply mode's share of the fresh samples (empty when none was drawn)."""
    names = sorted(set(modes), key=lambda m: -modes.count(m))
    return " / ".join(f"{m} {100 * modes.count(m) / len(modes):.0f} %" for m in names)


def rows_of(states: dict[tuple[int, int], StateStats], pool: bool = False) -> list[dict]:
    rows = []
    for (n, k), s in states.items():
        rows.append({"samples": n, "leader_holds": k, "debates": s.reached,
                     "policy_stops": s.stopped / s.reached,
                     "fresh_when_going_on": float(np.mean(s.fresh_when_going_on)) if s.fresh_when_going_on else None,
                     **({"fresh_modes": mode_shares(s.fresh_modes)} if pool else {}),
                     "adaptive_sc": "stop" if k >= ADAPTIVE_AGREE else "draw 1",
                     "accuracy_if_stopped": float(np.mean(s.score_if_stopped)),
                     "accuracy_final": float(np.mean(s.final_score)),
                     "tokens_now": float(np.mean(s.tokens_now)), "tokens_final": float(np.mean(s.final_tokens))})
    return rows


def overall(run: BankDebates, seed: int) -> dict:
    """Accuracy (a question's debates averaged first, 95 % bootstrap interval over questions) and tokens/question."""
    ci = metrics.bootstrap_ci([float(np.mean(v)) for v in run.scores_by_question().values()], seed=seed)
    return {"accuracy": ci.mean, "low": ci.low, "high": ci.high,
            "tokens": float(np.mean([d.trace.total_tokens for d in run.debates])),
            "failed": sum(d.failed for d in run.debates)}


def markdown(rows: Sequence[dict], meta: dict) -> str:
    pool = meta.get("pool") is not None

    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}"

    lines = ["# A bank-world policy's decisions per state (real replayed samples)", "",
             f"Command: `{meta['command']}`", "",
             f"Policy `{meta['policy']}` on the bank's `{meta['split']}` questions ({meta['questions']} questions × "
             f"{meta['orders']} seeded orders = {meta['debates']} debates; nothing synthetic, no model called"
             + (f"; agents {', '.join(meta['pool'])}, each drawing its own mode's samples" if pool else "") + "). A state "
             "is what the policy saw before a decision: n samples drawn, the leading answer held by k of them. "
             "Accuracy counts a tie as its expected value; tokens are prompt + completion so far / at the end.", "",
             f"Overall: accuracy {100 * meta['overall']['accuracy']:.1f} % [{100 * meta['overall']['low']:.1f}, "
             f"{100 * meta['overall']['high']:.1f}] (95 % bootstrap over questions) at "
             f"{meta['overall']['tokens']:.0f} tokens/question; {meta['overall']['failed']} debates failed.", "",
             "| n | k | debates | policy stops % | fresh drawn when going on | " + ("their modes | " if pool else "")
             + "adaptive SC (until 2) | accuracy if stopped here % | accuracy at the end % | tokens here | tokens at "
             "the end |", "|---:|---:|---:|---:|---:|" + ("---|" if pool else "") + "---|---:|---:|---:|---:|"]
    for r in rows:
        fresh = "–" if r["fresh_when_going_on"] is None else f"{r['fresh_when_going_on']:.2f}"
        modes = f"{r['fresh_modes'] or '–'} | " if pool else ""
        lines.append(f"| {r['samples']} | {r['leader_holds']} | {r['debates']} | {pct(r['policy_stops'])} | {fresh} | "
                     f"{modes}"
                     f"{r['adaptive_sc']} | {pct(r['accuracy_if_stopped'])} | {pct(r['accuracy_final'])} | "
                     f"{r['tokens_now']:.0f} | {r['tokens_final']:.0f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", required=True, help="an exported bank-world policy (python -m dear.export)")
    p.add_argument("--bank", type=Path, default=Path(DEFAULT_BANK), help="bank directory (default: the committed one)")
    p.add_argument("--benchmark", default="gsm8k")
    p.add_argument("--split", default="test", help="the bank shelf's split (default %(default)s)")
    p.add_argument("--orders", type=int, default=20, help="debates per question, each another order (default 20)")
    p.add_argument("--max-tokens", type=int, default=384, help="the shelf's token limit (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", help="the agents' reply modes, e.g. cot,pot,cot (default: every agent cot)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.orders < 1:
        raise ValueError(f"--orders must be >= 1, got {a.orders}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    pool = as_profiles(a.pool.split(","), "--pool") if a.pool else None
    modes = ",".join(dict.fromkeys(p.style for p in pool)) if pool else "cot"
    # a fixed behavior samples at one temperature: the bank's other temperatures neither serve nor bound its questions
    exported = load_exported(a.policy)
    backend = BankBackend(a.bank, a.benchmark, a.split, profile=modes, max_tokens=a.max_tokens,
                          temperature=exported.fixed_temperature)
    questions = [q for q in tasks.load(a.benchmark, a.split) if serves(backend, q.task, q.id)]
    if not questions:
        raise ValueError(f"{a.bank}: no {a.benchmark} {a.split} question is banked")
    run = debate_bank_orders(exported, backend, questions, orders=a.orders, max_tokens=a.max_tokens, seed=a.seed,
                             agent_profiles=pool)
    debates = run.debates
    rows = rows_of(collect(debates, run.records), pool=pool is not None)
    meta = {"command": command_line(PROG, argv), "policy": a.policy, "split": a.split, "questions": len(questions),
            "orders": a.orders, "debates": len(debates), "overall": overall(run, a.seed),
            "pool": [p.name for p in pool] if pool else None}
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "states.md", markdown(rows, meta))
    with open(a.out / "states.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print((a.out / "states.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
