"""Time the vote per debate round: grouping answer keys into equivalence classes, then the plurality tally.

    python bench/bench_vote.py [--traces results/eval-math500-n30-t2048/traces/math500/mad.jsonl] [--reps 5]

Rounds are the stored rounds of real debates (MATH-500 keys: the math-verify path; GSM8K keys: the exact-string
path). "cold" = the first pass in a fresh process (every new pair of math keys goes to math-verify), "warm" =
later passes (pair verdicts cached, as in training, where a question comes back many times). The plain string
tally is the baseline the ratios are taken against. Target: warm grouping well under 1 ms per round, since a
round's LLM time is seconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

from dear.cli import run as run_cli
from dear.tasks.equivalence import STATS, AnswerClasses
from dear.vote import tally

PROG = "python bench/bench_vote.py"


def stored_rounds(path: Path) -> list[tuple[str, list[str | None]]]:
    """(answer kind, the round's answer keys) of every round of every trace in a JSONL file."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            tr = json.loads(line)
            out += [(tr["kind"], [t["answer_key"] for t in turns]) for turns in tr["rounds"]]
    return out


def time_pass(rounds, group: bool) -> float:
    """Seconds per round of one pass over `rounds` (a fresh AnswerClasses per round, as per debate)."""
    t0 = time.perf_counter()
    for kind, keys in rounds:
        if group:
            classes = AnswerClasses(kind)
            keys = [classes.canonical(k) for k in keys]
        tally(keys)
    return (time.perf_counter() - t0) / len(rounds)


def main() -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, nargs="+", default=[
        Path("results/eval-math500-n30-t2048/traces/math500/mad.jsonl"),
        Path("results/eval-gsm8k-n60-v2/traces/gsm8k/mad.jsonl")])
    p.add_argument("--reps", type=int, default=5, help="warm passes (median reported)")
    a = p.parse_args()
    print(f"# {' '.join(shlex.quote(x) for x in ['python', *sys.argv])}")
    print(f"# python {platform.python_version()}, {platform.machine()}")
    for path in a.traces:
        rounds = stored_rounds(path)
        plain = statistics.median(time_pass(rounds, group=False) for _ in range(a.reps))
        checks0 = STATS.checks
        cold = time_pass(rounds, group=True)
        checks = STATS.checks - checks0
        warm = statistics.median(time_pass(rounds, group=True) for _ in range(a.reps))
        print(f"{path}: {len(rounds)} rounds ({rounds[0][0]} keys); plain tally {plain * 1e6:.1f} µs/round; "
              f"grouped cold {cold * 1e3:.2f} ms/round ({checks} math-verify comparisons), warm "
              f"{warm * 1e6:.1f} µs/round; warm / plain = {warm / plain:.1f}x; "
              f"undecided comparisons {STATS.undecided}")


if __name__ == "__main__":
    run_cli(main, PROG)
